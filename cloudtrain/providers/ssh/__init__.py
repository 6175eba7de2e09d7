"""The ssh provider: machines you already have (a lab, a workstation pool), reached over SSH.

Prerequisites: key-based SSH to every host and their host keys in your known_hosts (never
trusted on first use). It creates and deletes no machine: `up` connects, records facts and runs
the bootstrap on each host, either check-only against a Python you name (``--python``, with
torch) or installing a venv per node with torch (from ``--torch-index`` or the index matched to
the GPUs) and this cloudtrain (its wheel, copied over). Nothing is installed system-wide unless
``--allow-sudo`` lets the bootstrap ``sudo -n apt-get`` python3-venv and rsync. `down` stops
cloudtrain's processes and removes its files, venvs included.
"""

from __future__ import annotations

from pathlib import Path

from cloudtrain.provision.plugin import laid_out
from cloudtrain.provision.provider import NODE_PRICE, Option


def _count_hosts(value: str) -> int:
    from cloudtrain.providers.ssh.hosts import parse_hosts

    return len(parse_hosts(value))


def _count_inventory(value: str) -> int:
    from cloudtrain.providers.ssh.hosts import load_inventory

    return len(load_inventory(Path(value)).hosts)


#: What `up --provider ssh` takes beyond the spec; a host list also says how many nodes.
OPTIONS = (
    Option("hosts", "ssh: user@address[:port],… (the first is the head).", nodes=_count_hosts),
    Option(
        "inventory",
        "ssh: a YAML file of hosts (user, port, key, GPUs per host).",
        kind="path",
        nodes=_count_inventory,
    ),
    Option("identity", "ssh: the private key to log in with.", kind="path"),
    Option(
        "known_hosts", "ssh: where the hosts' keys are pinned (~/.ssh/known_hosts).", kind="path"
    ),
    Option(
        "python",
        "ssh: use this Python (with torch) on the hosts as it is; without it each node gets a "
        "venv with torch and cloudtrain.",
    ),
    Option(
        "allow_sudo",
        "ssh: may install system packages (python3-venv, rsync, an NVIDIA driver where a GPU "
        "host lacks one) with sudo.",
        kind="flag",
    ),
    Option("torch_index", "ssh: the pip index to install torch from (a mirror)."),
    NODE_PRICE,
)

PLUGIN = laid_out(__name__, "SshProvider", OPTIONS)
