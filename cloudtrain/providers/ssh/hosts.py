"""The machines of an ssh cluster: from ``--hosts user@address[:port],…`` or an inventory file.

An inventory is YAML; top-level keys are defaults for every host, and each host may override
them (a host may also be written as ``user@address[:port]``)::

    user: ubuntu                      # required, here or per host
    identity: ~/.ssh/lab_ed25519      # the private key (default ~/.ssh/id_ed25519)
    known_hosts: ~/.ssh/known_hosts   # where the hosts' keys are pinned
    python: /opt/venv/bin/python      # the Python with torch (default python3)
    gpus: 8                           # GPUs per host; `up` checks nvidia-smi agrees
    hosts:
      - address: 10.0.0.5             # the first host is the head
        port: 2222
      - address: 10.0.0.6
        identity: ~/.ssh/other_key
        gpus: 4
      - ubuntu@10.0.0.7

Paths are relative to the inventory's folder. Errors name the file, the field and the value.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cloudtrain.access import check_login, parse_target
from cloudtrain.errors import ConfigError

#: Keys an inventory may set at the top (defaults) and per host.
HOST_KEYS = ("address", "user", "port", "identity", "gpus")
TOP_KEYS = ("hosts", "user", "port", "identity", "known_hosts", "python", "gpus")


@dataclass(frozen=True)
class Host:
    user: str
    address: str
    port: int = 22
    #: this host's own private key (None: the cluster's `--identity`)
    identity: str | None = None
    #: GPUs the user says it has (None: whatever nvidia-smi finds)
    gpus: int | None = None

    @classmethod
    def parse(cls, text: str, default_user: str | None = None) -> Host:
        return cls(*parse_target(text, "--hosts entry", default_user))

    def __str__(self) -> str:
        return f"{self.user}@{self.address}:{self.port}"


def parse_hosts(value: object) -> list[Host]:
    """``--hosts``: a comma-separated string or a list of ``user@address[:port]``."""
    if isinstance(value, str):
        items: list[object] = list(value.split(","))
    elif isinstance(value, list | tuple):
        items = list(value)
    else:
        items = []
    return unique([Host.parse(str(item)) for item in items if str(item).strip()])


def unique(hosts: list[Host]) -> list[Host]:
    if len({(h.address, h.port) for h in hosts}) != len(hosts):
        raise ConfigError("the host list names the same host twice")
    return hosts


@dataclass(frozen=True)
class Inventory:
    hosts: tuple[Host, ...]
    identity: str | None
    known_hosts: str | None
    python: str | None


def load_inventory(path: Path) -> Inventory:
    """Read and check an inventory file (see the module docstring)."""
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"--inventory {str(path)!r}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"--inventory {path}: not YAML: {exc}") from None
    where = str(path)
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping with 'hosts', got {type(data).__name__}")
    _known(data, TOP_KEYS, where)
    items = data.get("hosts")
    if not isinstance(items, list) or not items:
        raise ConfigError(f"{where}: 'hosts' must be a non-empty list of hosts")
    folder = path.parent
    hosts = [_host(item, data, f"{where}: hosts[{i}]", folder) for i, item in enumerate(items)]
    return Inventory(
        hosts=tuple(unique(hosts)),
        identity=_path(data.get("identity"), folder),
        known_hosts=_path(data.get("known_hosts"), folder),
        python=str(data["python"]) if data.get("python") else None,
    )


def _host(item: object, defaults: Mapping[str, Any], where: str, folder: Path) -> Host:
    if isinstance(item, str):
        host = Host.parse(item, default_user=defaults.get("user"))
        fields: Mapping[str, Any] = {}
    elif isinstance(item, dict):
        _known(item, HOST_KEYS, where)
        if not item.get("address"):
            raise ConfigError(f"{where}: 'address' is required")
        user = item.get("user") or defaults.get("user")
        if not user:
            raise ConfigError(f"{where}: no 'user' (set it on the host or at the top)")
        check_login(user, item["address"], where)
        host, fields = Host(str(user), str(item["address"])), item
    else:
        raise ConfigError(f"{where}: {item!r} is not a host (a mapping or 'user@address')")
    port = fields.get("port", defaults.get("port", host.port))
    gpus = fields.get("gpus", defaults.get("gpus"))
    if not isinstance(port, int) or not 0 < port < 65536:
        raise ConfigError(f"{where}: port {port!r} is not a port number (1-65535)")
    if gpus is not None and (not isinstance(gpus, int) or isinstance(gpus, bool) or gpus < 0):
        raise ConfigError(f"{where}: gpus {gpus!r} is not a count (0 or more)")
    identity = _path(fields.get("identity"), folder)
    return Host(host.user, host.address, port, identity, gpus)


def _known(data: Mapping[str, Any], allowed: tuple[str, ...], where: str) -> None:
    import difflib

    for key in data:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; allowed: {', '.join(allowed)}"
            raise ConfigError(f"{where}: unknown field {key!r}{hint}")


def _path(value: object, folder: Path) -> str | None:
    if not value:
        return None
    path = Path(str(value)).expanduser()
    return str(path if path.is_absolute() else (folder / path).resolve())
