"""The exceptions cloudtrain raises. Library code raises them; only the CLI maps them to exit codes.

CloudtrainError
├── ConfigError              bad input: a spec, a flag, a YAML file (nothing was created)
│   └── AccountError         what names the account or the caller is missing (no project,
│                            no subscription, no public address): a dry run goes on without
├── ProviderError            a cloud said no (provider, code, retryable)
│   ├── AuthError            credentials missing or not allowed
│   ├── QuotaError           an account limit; raising it is the user's move
│   ├── CapacityError        the zone/region has no capacity now; the next may
│   └── NodeDataError        what a node sent is refused (more than the bound allows)
├── BootstrapError           a node failed a bootstrap phase (node, phase)
│   └── NodeLostError        the provider no longer runs the node it was waited for
├── CommandError             a command on a node exited non-zero (returncode, argv, stderr_tail)
├── JobError                 a training job failed or was cancelled
├── NotFoundError            a cluster or job that does not exist
├── ClusterBusyError         another command holds the cluster's lock, past the wait
└── StateError               the local state file is unusable
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

_TITLE = re.compile(r"<title[^>]*>(.*?)</title>", re.IGNORECASE | re.DOTALL)


def one_line(text: str, limit: int = 300) -> str:
    """`text` on one line (each run of whitespace, newlines included, as one space), cut to
    `limit` characters: what an error message quotes of an answer."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def body_summary(body: bytes | str) -> str:
    """What an answer that is no API answer looks like, in a few words: an HTML page's title
    (a proxy's 502), or its first characters."""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
    title = _TITLE.search(text)
    if title:
        return f"a page titled {one_line(title.group(1), 80)!r}"
    return f"starting {one_line(text, 60)!r}" if text.strip() else "an empty body"


class CloudtrainError(Exception):
    """Root of every error cloudtrain raises on purpose."""


class ConfigError(CloudtrainError):
    """Invalid input. The message names the field, the value and what is allowed."""


class SpecError(ConfigError):
    """A spec field is invalid. `field` is its dotted path, e.g. ``resources.accelerator``."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class AccountError(ConfigError):
    """What identifies the cloud account or the caller cannot be found (no project, no
    subscription, this machine's public address). `apply` stops; a dry run plans from the
    catalog without it."""


class CheckpointError(CloudtrainError):
    """A checkpoint file exists but cannot be loaded (corrupt, truncated, or unsafe content)."""

    def __init__(self, path: Path, message: str) -> None:
        super().__init__(f"checkpoint {path}: {message}")
        self.path = path


class NotFoundError(CloudtrainError):
    """A cluster or job that cloudtrain does not know."""


class ClusterBusyError(CloudtrainError):
    """Another cloudtrain command holds the cluster's lock (`cloudtrain.locks`), and it was
    not released in time."""

    def __init__(self, cluster: str, message: str) -> None:
        super().__init__(message)
        self.cluster = cluster


class StateError(CloudtrainError):
    """The local state file cannot be read or written."""


class ProviderError(CloudtrainError):
    """An error reported by a provider, mapped from its SDK at the provider boundary."""

    def __init__(self, provider: str, code: str, message: str, *, retryable: bool = False) -> None:
        super().__init__(f"{provider}: {code}: {message}")
        self.provider = provider
        self.code = code
        self.retryable = retryable


class AuthError(ProviderError):
    """Credentials are missing, expired or not allowed to do this."""


class QuotaError(ProviderError):
    """An account quota stops the request; the message says which quota."""


class CapacityError(ProviderError):
    """No capacity for this shape in this zone now; another zone or region may have it."""

    def __init__(self, provider: str, code: str, message: str) -> None:
        super().__init__(provider, code, message, retryable=True)


class NodeDataError(ProviderError):
    """What a node sent (a checkpoint, metrics) is refused: more than the bound allows. What
    came before it stands; nothing of the refused copy is kept."""

    def __init__(self, message: str) -> None:
        super().__init__("node", "Refused", message)


class BootstrapError(CloudtrainError):
    """A node failed a bootstrap phase."""

    def __init__(self, node: str, phase: str, message: str) -> None:
        super().__init__(f"node {node}: phase {phase!r} failed: {message}")
        self.node = node
        self.phase = phase


class NodeLostError(BootstrapError):
    """A node gone while its bootstrap was waited for (the provider no longer runs it): a new
    loss, never a wait for the bootstrap's timeout."""

    def __init__(self, node: str, phase: str) -> None:
        CloudtrainError.__init__(
            self,
            f"node {node} was lost during its bootstrap (phase {phase!r}): the provider "
            "no longer runs it",
        )
        self.node = node
        self.phase = phase


class CommandError(CloudtrainError):
    """A command run through an executor exited non-zero."""

    def __init__(self, returncode: int, argv: Sequence[str], stderr_tail: str) -> None:
        shown = " ".join(argv)
        if len(shown) > 200:
            shown = shown[:197] + "..."
        tail = f"\n{stderr_tail.rstrip()}" if stderr_tail.strip() else ""
        super().__init__(f"command exited {returncode}: {shown}{tail}")
        self.returncode = returncode
        self.argv = tuple(argv)
        self.stderr_tail = stderr_tail


class JobError(CloudtrainError):
    """A job ended badly: failed on a node, or was cancelled."""

    def __init__(self, job_id: str, message: str, *, cancelled: bool = False) -> None:
        super().__init__(f"job {job_id}: {message}")
        self.job_id = job_id
        self.cancelled = cancelled


def suggest(value: str, allowed: Sequence[str]) -> str:
    """`` — did you mean 'x'?`` when a close match exists, else an empty string."""
    import difflib

    close = difflib.get_close_matches(value, list(allowed), n=1, cutoff=0.6)
    return f" — did you mean {close[0]!r}?" if close else ""
