"""``python -m cloudtrain.node``: the node agent's command line. What it and all it starts write
on the node is the node user's alone (umask 077), however it was started (ssh, systemd)."""

import os
import sys

from cloudtrain.node import main

os.umask(0o077)
sys.exit(main())
