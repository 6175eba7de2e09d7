"""What a new node gets at boot, rendered from `templates/` (Jinja2, StrictUndefined).

A node boots with cloud-init user-data (`templates/cloud-init.yaml.j2`; GCP images without
cloud-init run the same as `templates/startup-script.sh.j2`). It holds: the ``cloudtrain`` user
with the cluster's public key, the cluster's SSH host key (the coordinator pins it), the
bootstrap (`templates/bootstrap.sh`: base packages, driver, venv, then the cloudtrain wheel the
coordinator copies, then the phases that wheel brings) and its settings
(``/etc/cloudtrain/bootstrap.env``, from `cloudtrain.boot.gpustack`: the driver branch, CUDA
build and wheel index for the node's GPU). The phases run in the node's Python (torch, NCCL
settings, verify) come with the wheel: `cloudtrain.node.bootstrap`.

Where it goes is each cloud's business: its provider's `user_data` puts the document in the
fields its cloud reads (EC2 ``UserData``, GCE metadata, Azure ``customData``), through `fit`
for that field's size limit.
"""

from __future__ import annotations

import base64
import gzip
import math
import os
import shlex
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from cloudtrain import __version__
from cloudtrain.node.selfstop import POWEROFF
from cloudtrain.spec.limits import Limits

if TYPE_CHECKING:
    from cloudtrain.model import Offer

NODE_USER = "cloudtrain"
NODE_ROOT = f"/home/{NODE_USER}/.cloudtrain"
TORCH_SPEC = "torch>=2.4,<3"
GZIP_MAGIC = b"\x1f\x8b"
#: Where the user-data puts the script and its settings on a cloud node (see the template).
NODE_SCRIPT = "/usr/local/lib/cloudtrain/bootstrap.sh"
NODE_CONFIG = "/etc/cloudtrain/bootstrap.env"


@dataclass(frozen=True)
class NodeKeys:
    """The public key users log in with, and the host key pair the nodes present."""

    user_public: str
    host_private: str
    host_public: str

    @classmethod
    def placeholders(cls) -> NodeKeys:
        """Stand-ins for review (`cloudtrain bootstrap render`): no key is printed."""
        return cls(
            "ssh-ed25519 <the cluster's public key>",
            "<the cluster's SSH host private key>",
            "ssh-ed25519 <the cluster's SSH host public key>",
        )

    @classmethod
    def for_cluster(cls, home: Path, cluster: str) -> NodeKeys:
        from cloudtrain import access

        _, user_public = access.cluster_key(home, cluster)
        host_private_path, host_public = access.host_key(home, cluster)
        return cls(user_public, host_private_path.read_text().strip(), host_public)


@dataclass(frozen=True)
class NodeShape:
    """What a node is: where, which GPU, how many, which machine type."""

    provider: str
    accelerator: str | None = None
    count: int = 0
    instance_type: str | None = None
    #: the preemption notice protocol of a spot node (`cloudtrain.node.notices`): its agent
    #: watches it from boot (a systemd unit); None for nodes no cloud preempts
    notices: str | None = None
    #: when the node stops itself (its agent's boot policy, `agent_policy`), and how
    #: (`cloudtrain.node.selfstop`)
    limits: Limits = field(default_factory=Limits)
    halt: str = POWEROFF
    #: minutes after its first boot when the guest powers itself off whatever runs on it, no
    #: process of cloudtrain needed (`backstop_minutes`: EC2 then terminates it); None: never
    backstop_min: int | None = None

    @classmethod
    def of(
        cls, offer: Offer, notices: str, limits: Limits | None = None, halt: str = POWEROFF
    ) -> NodeShape:
        """The shape of a node of `offer`; a spot offer's nodes watch `notices`."""
        return cls(offer.provider, offer.accelerator, offer.accelerator_count,
                   offer.instance_type, notices if offer.spot else None,
                   limits or Limits(), halt)  # fmt: skip

    def __str__(self) -> str:
        gpus = f"{self.accelerator}:{self.count}" if self.accelerator else "CPU"
        return f"{gpus}, {self.instance_type}" if self.instance_type else gpus


def render(template: str, **values: object) -> str:
    """Render ``templates/<template>``; a missing value is an error, never an empty string."""
    import jinja2

    text = files("cloudtrain.templates").joinpath(template).read_text()
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    env.filters["shquote"] = lambda value: shlex.quote(str(value))
    return env.from_string(text).render(version=__version__, **values)


def script() -> str:
    """The bootstrap script (static; it reads its settings from an env file)."""
    return files("cloudtrain.templates").joinpath("bootstrap.sh").read_text()


def config(
    shape: NodeShape,
    *,
    install: bool = True,
    phases: str | None = None,
    python: str = "python3",
    root: str = NODE_ROOT,
    nccl_ifname: str | None = None,
    torch_index: str | None = None,
    agent: str = "systemd",
    verified_by: str | None = None,
) -> str:
    """The bootstrap's settings as ``KEY='value'`` lines (shell-quoted: safe to source).
    `torch_index` replaces the wheel index the GPU stack table picks (a mirror). `agent` says
    who runs the node's resident agent: ``systemd`` (a cloud node's unit, `agent_unit`) or
    ``detached`` (the bootstrap starts it, supervised: ssh and local nodes). `verified_by`
    names the node that verified this node's machine: its verify phase is skipped."""
    from cloudtrain.boot.gpustack import stack_for

    stack = stack_for(shape.accelerator, shape.instance_type)
    values = {
        "CT_ROOT": root,
        "CT_INSTALL": "1" if install else "0",
        "CT_PYTHON": python,
        "CT_ACCELERATOR": shape.accelerator or "",
        "CT_GPU_COUNT": str(shape.count if shape.accelerator else 0),
        "CT_DRIVER_BRANCH": stack.driver_branch or "",
        "CT_MIN_DRIVER": stack.min_driver or "",
        "CT_TORCH_INDEX": torch_index or stack.torch_index,
        "CT_TORCH_VERSION": TORCH_SPEC,
        "CT_EFA": "1" if stack.efa else "0",
        "CT_NCCL_SOCKET_IFNAME": nccl_ifname or "",
        "CT_NCCL_ENV": " ".join(f"{k}={v}" for k, v in stack.nccl.items()),
        "CT_CLOUDTRAIN_WHEEL": f"{root}/dist/cloudtrain-{__version__}-py3-none-any.whl",
        "CT_CLOUDTRAIN_VERSION": __version__,
        "CT_AGENT": agent,
        # the switch of the warm server (`cloudtrain.jobs.warm`), which a CPU node's check of
        # torch starts: the user's at `up` holds on nodes reached over SSH or Slurm too
        "CT_WARM": "0" if os.environ.get("CLOUDTRAIN_WARM", "1") == "0" else "1",
    }
    if phases is not None:
        values["CT_PHASES"] = phases
    if verified_by is not None:
        values["CT_VERIFIED_BY"] = verified_by
    return "".join(f"{k}={shlex.quote(v)}\n" for k, v in values.items())


class WritesFiles(Protocol):
    """An executor that also writes small files on its node in one call (a Slurm step's or a
    pod's: no rsync there)."""

    def files(self, texts: Mapping[str, str], *, unless: str | None = None) -> bool: ...

    def start_detached(
        self, argv: Sequence[str], *, env: Mapping[str, str], cwd: str, job_dir: str
    ) -> int: ...


#: The check-only phases of a node whose Python and torch are there (a Slurm node with the
#: user's ``--python``, a pod of an image that brings them): nothing is installed.
CHECK_PHASES = "python cloudtrain torch verify"


def start_checks(ex: WritesFiles, shape: NodeShape, *, root: str, python: str) -> None:
    """Write the node's bootstrap and its check-only settings (`CHECK_PHASES`) under `root`
    and start it detached, unless an earlier start did (its status is there: readiness reads
    how far it got)."""
    script_path = f"{root}/bootstrap/bootstrap.sh"
    config_path = f"{root}/bootstrap/bootstrap.env"
    texts = {
        script_path: script(),
        config_path: config(
            shape, install=False, phases=CHECK_PHASES, python=python, root=root, agent="detached"
        ),
    }
    if not ex.files(texts, unless=f"{root}/bootstrap/status.json"):
        return
    ex.start_detached(
        ["bash", script_path, config_path],
        env={"CLOUDTRAIN_NODE_ROOT": root},
        cwd=root,
        job_dir=f"{root}/bootstrap/run",
    )


def agent_fields(limits: Limits, sessions: bool = True, now: float | None = None) -> dict[str, Any]:
    """`limits` as the fields of the node agent's policy (`cloudtrain.node.agent.set_policy`).
    `sessions`: a user's SSH session counts as work (not on the user's own machine). The
    lifetime or budget travels as the seconds left at `now` (default: this machine's clock
    now; both ends on this machine's clock): a node whose clock is off counts them on its own
    boot clock from when they come."""
    fields: dict[str, Any] = {
        "idle_s": limits.idle_minutes * 60 if limits.idle_minutes else None,
        "sessions": sessions,
    }
    if limits.ends_at is not None:
        left = float(limits.ends_at) - (time.time() if now is None else now)
        fields.update(ends_in=round(max(0.0, left), 3), why=limits.ends_why)
    return fields


def agent_policy(limits: Limits, sessions: bool = True, now: float | None = None) -> list[str]:
    """`limits` as the flags of the node's ``agent`` and ``autostop`` commands (`agent_fields`;
    numbers and words only: they go into a systemd unit as they are)."""
    fields = agent_fields(limits, sessions, now)
    flags = ["--idle-s", repr(fields["idle_s"])] if fields["idle_s"] else ["--off"]
    if "ends_in" in fields:
        flags += ["--ends-in", repr(fields["ends_in"]), "--why", str(fields["why"])]
    return [*flags, "--sessions" if sessions else "--no-sessions"]


#: How many minutes after its deadline a guest's own backstop powers it off: its agent stops
#: it at the deadline; this is for when no agent is left to.
BACKSTOP_MARGIN_MIN = 2


def backstop_minutes(limits: Limits, now: float | None = None) -> int | None:
    """The ``shutdown -h +N`` of a node of a cluster with a lifetime or budget (`Limits.ends_at`):
    the minutes left at `now` (default: this machine's clock), rounded up, plus
    `BACKSTOP_MARGIN_MIN`; None without one."""
    if limits.ends_at is None:
        return None
    left = float(limits.ends_at) - (time.time() if now is None else now)
    return math.ceil(max(0.0, left) / 60) + BACKSTOP_MARGIN_MIN


def agent_unit(notices: str | None, limits: Limits | None = None, halt: str = POWEROFF) -> str:
    """The systemd unit of a node's resident agent (`cloudtrain.node.agent`): it runs as the
    ``cloudtrain`` user (whose jobs it tells), watches `notices` on a spot node, stops the node
    when `limits` say, by powering it off (the cloud deletes or stops it) or, on Azure, by
    deleting its own VM as its managed identity (no credential on the node), and comes back
    whenever it stops, also while the bootstrap has not installed cloudtrain yet."""
    python = f"{NODE_ROOT}/venv/bin/python"
    watch = f" --source {notices}" if notices else ""
    if limits:
        watch += " " + " ".join(f for f in agent_policy(limits) if f != "--off")
    return (
        "[Unit]\n"
        "Description=cloudtrain node agent"
        + (f": the cloud's preemption notice ({notices})\n" if notices else "\n")
        + "After=network-online.target\n"
        "StartLimitIntervalSec=0\n\n"
        "[Service]\n"
        f"User={NODE_USER}\n"
        f"ExecStart={python} -m cloudtrain.node agent --root {NODE_ROOT} --halt"
        + ("" if halt == POWEROFF else f" {halt}")
        + f"{watch}\n"
        "Restart=always\n"
        "RestartSec=5\n\n"
        "[Install]\n"
        "WantedBy=multi-user.target\n"
    )


def _values(shape: NodeShape, keys: NodeKeys) -> dict[str, object]:
    if "\n" in keys.user_public or "\n" in keys.host_public:
        raise ValueError("public keys must be one OpenSSH line each")
    packed = base64.b64encode(gzip.compress(script().encode(), mtime=0)).decode()
    return {
        "provider": shape.provider,
        "shape": str(shape),
        "user": NODE_USER,
        "root": NODE_ROOT,
        "user_public_key": keys.user_public,
        "host_private_key": keys.host_private.strip(),
        "host_public_key": keys.host_public,
        "config": config(shape).rstrip("\n"),
        "script_gz_b64": packed,
        "agent_unit": agent_unit(shape.notices, shape.limits, shape.halt).rstrip("\n"),
        "backstop_min": shape.backstop_min,
    }


def cloud_config(shape: NodeShape, keys: NodeKeys) -> str:
    """The ``#cloud-config`` user-data of a node of `shape`."""
    return render("cloud-init.yaml.j2", **_values(shape, keys))


def startup_script(shape: NodeShape, keys: NodeKeys) -> str:
    """The same bootstrap as a plain startup script, for images without cloud-init (GCP)."""
    return render("startup-script.sh.j2", **_values(shape, keys))


def fit(text: str, limit: int, where: str) -> bytes:
    """User-data for a field that takes `limit` bytes: as is when it fits, else
    gzip-compressed (cloud-init reads gzip user-data). Raises `ValueError` naming `where`
    when even that is too big."""
    raw = text.encode()
    if len(raw) <= limit:
        return raw
    packed = gzip.compress(raw, mtime=0)
    if len(packed) > limit:
        raise ValueError(f"user-data is {len(packed)} bytes gzipped; {where} takes {limit}")
    return packed
