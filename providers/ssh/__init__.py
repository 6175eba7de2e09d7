"""The ssh provider: machines you already have (a lab, a workstation pool), reached over SSH.

Prerequisites: key-based SSH to every host and their host keys in your known_hosts (never
trusted on first use). It creates and deletes no machine: `up` connects, records facts and runs
the bootstrap on each host, either check-only against a Python you name (``--python``, with
torch) or installing a venv per node with torch (from ``--torch-index`` or the index matched to
the GPUs) and this cloudtrain (its wheel, copied over). Nothing is installed system-wide unless
``--allow-sudo`` lets the bootstrap ``sudo -n apt-get`` python3-venv and rsync. `down` stops
cloudtrain's processes and removes its files, venvs included.
"""
