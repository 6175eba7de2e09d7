"""``python -m cloudtrain.cli`` is the ``cloudtrain`` command."""

from cloudtrain.cli.main import main

main()
