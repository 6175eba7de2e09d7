"""The executor interface: one node, a few methods, the httpx transport idea.

Every method blocks until done, except `start_detached`, which returns once the process runs
in its own session on the node and goes on without the caller. `run` never raises for a
non-zero exit: it returns the code, and `RunResult.check()` turns it into a `CommandError`.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

from cloudtrain.errors import CommandError, ConfigError

#: Directory entries never copied to a node by `put`, besides what `.cloudtrainignore` names.
DEFAULT_EXCLUDES = (".git", ".venv", "venv", "__pycache__", ".mypy_cache", ".pytest_cache")
#: Never copied to a node, whatever the ignore files say: where credentials live. A pattern
#: with a '/' matches at the end of a path, as rsync reads it (``a/.config/gcloud`` too).
SECRET_EXCLUDES = (
    ".ssh", ".aws", ".azure", ".config/gcloud", ".kube", ".docker", ".gnupg",
    ".env", ".env.*", "*.pem", "*.p12", ".netrc", ".git-credentials", ".pgpass",
    "id_rsa", "id_rsa.pub", "id_ed25519", "id_ed25519.pub", "id_ecdsa", "id_ecdsa.pub",
    "id_dsa", "id_dsa.pub", "credentials.json", "application_default_credentials.json",
)  # fmt: skip
IGNORE_FILE = ".cloudtrainignore"
#: What they name stays home: the workdir's own, and every folder's `.gitignore`.
IGNORE_FILES = (".gitignore", IGNORE_FILE)
#: ssh's own exit status when it could not connect, or lost the connection (the remote command
#: may still be running); no command cloudtrain runs on a node exits with it.
SSH_FAILED = 255

#: Starts "$@" detached: its own session, stdin from /dev/null, stdout+stderr to
#: JOB_DIR/node.log; writes JOB_DIR/pid now and JOB_DIR/exit_code (atomically) when it ends;
#: prints the pid. Run as ``sh -c DETACH_SCRIPT NAME JOB_DIR ARGV...``; executors run the same
#: script locally and over SSH so a job's files look the same on every node.
DETACH_SCRIPT = """\
d=$1; shift
( "$@" > "$d/node.log" 2>&1 < /dev/null
  printf '%s\\n' "$?" > "$d/exit_code.tmp" && mv "$d/exit_code.tmp" "$d/exit_code"
) > /dev/null 2>&1 < /dev/null &
printf '%s\\n' "$!" > "$d/pid"
printf '%s\\n' "$!"
"""


@dataclass(frozen=True)
class RunResult:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def check(self) -> RunResult:
        """Self when the command succeeded; `CommandError` with the stderr tail otherwise."""
        if self.returncode != 0:
            tail = "\n".join((self.stderr or self.stdout).splitlines()[-20:])
            raise CommandError(self.returncode, self.argv, tail)
        return self


class Executor(Protocol):
    """Runs commands on one node."""

    def run(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = None,
        on_output: Callable[[str], None] | None = None,
    ) -> RunResult:
        """Run `argv` to completion. `on_output` gets each line of stdout+stderr as it comes
        (then `stdout` holds both). Raises `CommandError` only when it cannot start or times out."""
        ...

    def start_detached(
        self, argv: Sequence[str], *, env: Mapping[str, str], cwd: str, job_dir: str
    ) -> int:
        """Start `argv` in a new session on the node, not a child of this process. It writes
        ``job_dir/node.log`` (stdout+stderr), ``job_dir/pid``, and ``job_dir/exit_code`` when it
        ends (atomically). Returns its pid on the node; does not wait for it."""
        ...

    def put(self, local: Path, remote: str, *, excludes: Sequence[str] = ()) -> None:
        """Copy a file or a directory tree to `remote`, only what changed. Directories skip
        `DEFAULT_EXCLUDES`, `excludes` and the names in the tree's `.cloudtrainignore`."""
        ...

    def get(self, remote: str, local: Path) -> bool:
        """Make the local folder `local` a copy of the node's folder `remote`, moving only
        what changed. False, and nothing done, when `remote` is no folder. What the node
        holds is untrusted (`cloudtrain.executors.received`): only regular files and folders
        arrive, private, never a link or a device; past ``received.limit()`` bytes the copy
        stops with `NodeDataError`."""
        ...

    def close(self) -> None:
        """Release connections. Idempotent."""
        ...


def ignore_patterns(tree: Path, extra: Iterable[str] = ()) -> list[str]:
    """The patterns a sync of `tree` skips everywhere (rsync's ``--exclude``): credentials
    (always), defaults, `extra`, and the lines of the tree's `.cloudtrainignore`. Each folder's
    `.gitignore` is read too, for what is below it (`gitignore_rules`, rsync's
    ``--filter=':- .gitignore'``)."""
    patterns = [*SECRET_EXCLUDES, *DEFAULT_EXCLUDES, *extra]
    ignore = tree / IGNORE_FILE
    if ignore.is_file():
        for line in ignore.read_text(errors="replace").splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                patterns.append(line.rstrip("/"))
    return patterns


#: rsync's filter rule that reads every folder's `.gitignore` as excludes for what is below it.
GITIGNORE_FILTER = ":- .gitignore"


def gitignore_rules(folder: Path) -> list[str]:
    """The excludes of `folder`'s `.gitignore` as rsync's ``:-`` merge reads them: each line
    a pattern (a leading '/' anchors at `folder`, a trailing '/' matches folders only), '#'
    lines and blank ones skipped. A ``!pattern`` line is no negation there, only a name that
    matches nothing: what git would bring back stays home."""
    path = folder / ".gitignore"
    if not path.is_file():
        return []
    lines = path.read_text(errors="replace").splitlines()
    return [line for line in lines if line.strip() and not line.startswith("#")]


def ignored(rel: Path, patterns: Sequence[str], *, folder: bool = False) -> bool:
    """As rsync reads `patterns` for `rel` (a path below where they apply): one without '/'
    matches a name anywhere, one with a leading '/' the path from the top, any other one with
    '/' the end of the path; one ending in '/' only a `folder`."""
    text = rel.as_posix()
    for p in patterns:
        if p.endswith("/"):
            if not folder:
                continue
            p = p.rstrip("/")
        if p.startswith("/"):
            hit = fnmatch.fnmatch(text, p[1:])
        elif "/" in p:
            hit = fnmatch.fnmatch(text, p) or fnmatch.fnmatch(text, "*/" + p)
        else:
            hit = fnmatch.fnmatch(rel.name, p)
        if hit:
            return True
    return False


def sync_listing(tree: Path, extra: Iterable[str] = ()) -> Iterator[tuple[Path, Path | None]]:
    """What a sync of `tree` copies, top-down: (relative path, None) for each folder, then
    (relative path, absolute path) for each file in it. The one walk both executors' `put`
    and the size shown before a job's sync come from; rsync is told the same rules."""
    everywhere = ignore_patterns(tree, extra)
    scoped: dict[Path, list[str]] = {}  # a folder's .gitignore rules, for what is below it

    def skipped(rel: Path, folder: bool) -> bool:
        if ignored(rel, everywhere, folder=folder):
            return True
        return any(
            ignored(rel.relative_to(base), rules, folder=folder)
            for base, rules in scoped.items()
            if rules and base in rel.parents
        )

    for dirpath, dirnames, filenames in os.walk(tree):
        rel_dir = Path(dirpath).relative_to(tree)
        scoped[rel_dir] = gitignore_rules(Path(dirpath))
        dirnames[:] = sorted(d for d in dirnames if not skipped(rel_dir / d, True))
        yield rel_dir, None
        for name in sorted(filenames):
            if not skipped(rel_dir / name, False):
                yield rel_dir / name, Path(dirpath) / name


@dataclass(frozen=True)
class SyncSize:
    """How much a sync of a workdir copies to each node."""

    files: int
    bytes: int

    def __str__(self) -> str:
        size = float(self.bytes)
        for unit in ("B", "KB", "MB", "GB"):
            if size < 1000 or unit == "GB":
                break
            size /= 1000
        shown = f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        return f"{self.files} file(s), {shown}"


def sync_size(tree: Path, extra: Iterable[str] = ()) -> SyncSize:
    found = [f for _, f in sync_listing(tree, extra) if f is not None and not f.is_symlink()]
    return SyncSize(len(found), sum(f.stat().st_size for f in found))


T = TypeVar("T")
R = TypeVar("R")


#: How many nodes are worked on at once (each is one ssh subprocess): ``$CLOUDTRAIN_PARALLEL``.
PARALLEL_ENV = "CLOUDTRAIN_PARALLEL"
DEFAULT_PARALLEL = 32


def parallelism() -> int:
    """``$CLOUDTRAIN_PARALLEL`` (a positive integer), else 32."""
    text = os.environ.get(PARALLEL_ENV, "").strip()
    if not text:
        return DEFAULT_PARALLEL
    if not text.isdigit() or int(text) < 1:
        raise ConfigError(f"{PARALLEL_ENV}={text!r}: use a positive whole number, e.g. 64")
    return int(text)


def fan_out(fn: Callable[[T], R], items: Sequence[T], *, max_workers: int | None = None) -> list[R]:
    """Apply `fn` to every item concurrently (at most `max_workers`, default `parallelism()`),
    results in order. The first exception is raised after every call has finished, so one
    slow node never hides another's error."""
    if len(items) <= 1:
        return [fn(item) for item in items]
    workers = max_workers or parallelism()
    with ThreadPoolExecutor(max_workers=min(workers, len(items))) as pool:
        futures = [pool.submit(fn, item) for item in items]
        errors = [f.exception() for f in futures]
        for error in errors:
            if error is not None:
                raise error
        return [f.result() for f in futures]
