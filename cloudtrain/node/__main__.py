"""``python -m cloudtrain.node``: the node agent's command line."""

import sys

from cloudtrain.node import main

sys.exit(main())
