"""A cloud node's resident agent run for real on this machine, as its systemd unit would run it.

moto's instances and the GCE stand-in's are records, not machines: the agent that would run on
one is started here with the exact flags of the unit its user-data carries (only ``--root``
moved to a folder here), an environment with no credential of any cloud, and as its power-off
the stand-in's guest (``CLOUDTRAIN_HALT_COMMAND``), which does what the cloud does when a guest
powers off.
"""

from __future__ import annotations

import base64
import gzip
import os
import shlex
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
UNIT = "/etc/systemd/system/cloudtrain-agent.service"


def unit_of(user_data: bytes) -> str:
    """The agent unit in a node's cloud-config (gzipped or not)."""
    text = gzip.decompress(user_data) if user_data[:2] == b"\x1f\x8b" else user_data
    doc = yaml.safe_load(text)
    return str(next(f["content"] for f in doc["write_files"] if f["path"] == UNIT))


def unit_of_b64(user_data: str) -> str:
    return unit_of(base64.b64decode(user_data))


def backstop_of_b64(user_data: str) -> list[str] | None:
    """The ``shutdown`` command a node's cloud-config runs at its first boot, if any."""
    raw = base64.b64decode(user_data)
    doc = yaml.safe_load(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    found = [c for c in doc["runcmd"] if isinstance(c, list) and c[:1] == ["shutdown"]]
    return [str(w) for w in found[0]] if found else None


def agent_flags(unit: str) -> list[str]:
    """The flags of the unit's ``agent`` command, without ``--root``."""
    line = next(x for x in unit.splitlines() if x.startswith("ExecStart="))
    words = shlex.split(line.removeprefix("ExecStart="))
    flags = words[words.index("agent") + 1 :]
    at = flags.index("--root")
    return flags[:at] + flags[at + 2 :]


def start(
    root: Path,
    unit: str,
    halt_command: list[str] | None = None,
    *,
    more: list[str] | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """The node's agent, running here with no credential, until the node stops: `more` flags
    after the unit's (where its metadata server and cloud API are here), `env` on top of a
    bare environment."""
    root.mkdir(parents=True, exist_ok=True)
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(root),
        "PYTHONPATH": str(REPO),
        "CLOUDTRAIN_NODE_ROOT": str(root),
        **({"CLOUDTRAIN_HALT_COMMAND": shlex.join(halt_command)} if halt_command else {}),
        **(env or {}),
    }
    with open(root / "agent.log", "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "cloudtrain.node", "agent", "--root", str(root),
             *agent_flags(unit), *(more or [])],
            env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=root,
        )  # fmt: skip


@contextmanager
def running(agents: list[subprocess.Popen[bytes]]) -> Iterator[None]:
    """The block runs while `agents` run; they are stopped after it (the node is gone by
    then, or the test failed)."""
    try:
        yield
    finally:
        for proc in agents:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=30)
