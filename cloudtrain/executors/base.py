"""The executor interface: one node, a few methods, the httpx transport idea.

Every method blocks until done, except `start_detached`, which returns once the process runs
in its own session on the node and goes on without the caller. `run` never raises for a
non-zero exit: it returns the code, and `RunResult.check()` turns it into a `CommandError`.
"""

from __future__ import annotations

import fnmatch
import functools
import os
import re
import stat
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

from cloudtrain.errors import CommandError, ConfigError

#: Directory entries never copied to a node by `put`, besides what `.cloudtrainignore` names.
DEFAULT_EXCLUDES = (".git", ".venv", "venv", "__pycache__", ".mypy_cache", ".pytest_cache")
#: Never copied to a node, whatever the ignore files say: where credentials live, after the
#: file rules of the secret scanners (gitleaks' ``pkcs12-file``; the file signatures of gitrob
#: and shhgit) and the default places of the tools a training workdir meets. A pattern with a
#: '/' matches at the end of a path, as rsync reads it (``a/.config/gcloud`` too). What they
#: leave out is named before a sync (`left_out`).
SECRET_EXCLUDES = (
    # keys and keystores: SSH, GPG, TLS, Java, PuTTY, Kerberos, KeePass, OpenVPN
    ".ssh", ".gnupg", "*.pem", "*.key", "*.p12", "*.pfx", "*.p8", "*.pkcs12", "*.jks",
    "*.keystore", "*.ppk", "*.keytab", "*.kdbx", "*.ovpn",
    "id_rsa", "id_rsa.pub", "id_ed25519", "id_ed25519.pub", "id_ecdsa", "id_ecdsa.pub",
    "id_dsa", "id_dsa.pub", "*_rsa", "*_dsa", "*_ecdsa", "*_ed25519", "*_sk",
    # clouds, clusters, object stores
    ".aws", ".azure", ".config/gcloud", ".kube", "kubeconfig*", "*.kubeconfig", ".boto",
    ".s3cfg", ".passwd-s3fs", ".config/rclone", "rclone.conf", ".databrickscfg", ".oci",
    ".config/doctl", ".vault-token", ".kaggle", "kaggle.json", "credentials.json",
    "application_default_credentials.json", "service-account*.json", "service_account*.json",
    # Terraform: state and variables hold every secret of what they made
    "*.tfstate", "*.tfstate.*", "*.tfvars", "*.tfvars.json", ".terraformrc", "terraform.rc",
    ".terraform.d",
    # registries, forges and model hubs
    ".docker", ".dockercfg", ".npmrc", ".yarnrc", ".yarnrc.yml", ".pypirc", ".gem/credentials",
    ".git-credentials", ".config/gh", ".config/hub", ".huggingface", "huggingface/token",
    "huggingface/stored_tokens",
    # passwords, environments, shell histories
    ".env", ".env.*", ".envrc", ".netrc", "_netrc", ".pgpass", ".my.cnf", ".htpasswd",
    ".password-store", ".*_history",
)  # fmt: skip
IGNORE_FILE = ".cloudtrainignore"
#: What they name stays home: the workdir's own, and every folder's `.gitignore`.
IGNORE_FILES = (".gitignore", IGNORE_FILE)
#: ssh's own exit status when it could not connect, or lost the connection (the remote command
#: may still be running); no command cloudtrain runs on a node exits with it.
SSH_FAILED = 255
#: What a streamed run (`Executor.run` with `on_output`) keeps of its output: its last lines.
STREAM_TAIL = 200
#: The most a command's stdout, or its stderr, may send to `Executor.run` when it is kept whole
#: (no `on_output`): what a node sends is untrusted, and this machine's memory is the user's.
MAX_OUTPUT = 64 << 20


def too_much(argv: Sequence[str], stream: str) -> CommandError:
    """The error of a command whose `stream` went past `MAX_OUTPUT` (it was stopped)."""
    return CommandError(
        SSH_FAILED,
        tuple(argv),
        f"it sent more than {MAX_OUTPUT >> 20} MiB on its {stream}, more than a command whose "
        "output is kept may send: stopped",
    )


#: Starts "$@" detached: its own session, stdin from /dev/null, stdout+stderr to
#: JOB_DIR/node.log; writes JOB_DIR/pid now and, when it ends, JOB_DIR/ended_at (the node's
#: clock, epoch seconds) then JOB_DIR/exit_code (each atomically); prints the pid. Run as
#: ``sh -c DETACH_SCRIPT NAME JOB_DIR ARGV...``; executors run the same script locally and over
#: SSH so a job's files look the same on every node. Before "$@" starts and once it ended, it
#: writes the OOM killer's count in its memory cgroup, v2 or v1 (JOB_DIR/oom_kill.start and
#: .end, read by `cloudtrain.node.oom`: whether a rank killed by SIGKILL ran out of memory).
DETACH_SCRIPT = """\
d=$1; shift
oom() {
  sed -n -e 's|^0::|/sys/fs/cgroup|p' \\
    -e 's|^[0-9]*:\\([^:]*,\\)\\{0,1\\}memory\\(,[^:]*\\)\\{0,1\\}:|/sys/fs/cgroup/memory|p' \\
    /proc/self/cgroup 2>/dev/null | while read -r g; do
      cat "$g/memory.events" "$g/memory.oom_control" 2>/dev/null | grep '^oom_kill '; done
}
( oom > "$d/oom_kill.start"
  "$@" > "$d/node.log" 2>&1 < /dev/null
  c=$?
  oom > "$d/oom_kill.end"
  date +%s.%N > "$d/ended_at.tmp" && mv "$d/ended_at.tmp" "$d/ended_at"
  printf '%s\\n' "$c" > "$d/exit_code.tmp" && mv "$d/exit_code.tmp" "$d/exit_code"
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
        (then `stdout` holds the last `STREAM_TAIL` lines of both: a node's output, however
        long, is never all held here). Raises `CommandError` only when it cannot start, times
        out, or sends more than `MAX_OUTPUT` on stdout or stderr without `on_output`."""
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


@functools.lru_cache(maxsize=256)
def _rules(patterns: tuple[str, ...], folder: bool) -> tuple[re.Pattern[str], re.Pattern[str]]:
    """`patterns` as two regexes, one for a name and one for a path (`ignored`)."""
    names, paths = [], []
    for p in patterns:
        if p.endswith("/"):
            if not folder:
                continue
            p = p.rstrip("/")
        if p.startswith("/"):
            paths.append(fnmatch.translate(p[1:]))
        elif "/" in p:
            paths += [fnmatch.translate(p), fnmatch.translate("*/" + p)]
        else:
            names.append(fnmatch.translate(p))
    return re.compile("|".join(names) or "(?!)"), re.compile("|".join(paths) or "(?!)")


def ignored(rel: Path, patterns: Sequence[str], *, folder: bool = False) -> bool:
    """As rsync reads `patterns` for `rel` (a path below where they apply): one without '/'
    matches a name anywhere, one with a leading '/' the path from the top, any other one with
    '/' the end of the path; one ending in '/' only a `folder`."""
    names, paths = _rules(tuple(patterns), folder)
    return bool(names.match(rel.name) or paths.match(rel.as_posix()))


def home_below(tree: Path) -> Path | None:
    """Where cloudtrain's home (``$CLOUDTRAIN_HOME``: every cluster's keys, the state) is
    inside `tree`, relative to it; None when it is not below it. A sync never copies it, and
    refuses a `tree` that is the home itself (`ConfigError`)."""
    from cloudtrain.state import home

    top, found = tree.resolve(), home().resolve()
    if found == top:
        raise ConfigError(
            f"{tree} is cloudtrain's home (its keys and state never go to a node): run from "
            "the project's own folder, or pass --workdir"
        )
    return found.relative_to(top) if found.is_relative_to(top) else None


def rsync_rules(tree: Path, extra: Iterable[str] = ()) -> list[str]:
    """rsync's options that copy of `tree` what `sync_listing` lists: the excludes, the home,
    then every folder's `.gitignore` (after: the excludes win)."""
    rules = [a for p in ignore_patterns(tree, extra) for a in ("--exclude", p)]
    home = home_below(tree)
    if home is not None:  # anchored at the top; a name with a wildcard in it is escaped
        text = home.as_posix()
        if any(c in text for c in "*?["):
            text = re.sub(r"([\\*?\[])", r"\\\1", text)
        rules += ["--exclude", f"/{text}/"]
    return [*rules, "--filter", GITIGNORE_FILTER]


def left_out(tree: Path, extra: Iterable[str] = ()) -> list[str]:
    """What a sync of `tree` leaves home because it holds credentials (`SECRET_EXCLUDES`, and
    cloudtrain's home), as relative paths: a folder, not what is in it."""
    found: list[Path] = []
    for _ in sync_listing(tree, extra, secrets=found):
        pass
    home = home_below(tree)
    named = {home: f"{home} (cloudtrain's home)"} if home is not None else {}
    return [named.get(rel, rel.as_posix()) for rel in found]


def sync_listing(
    tree: Path, extra: Iterable[str] = (), *, secrets: list[Path] | None = None
) -> Iterator[tuple[Path, Path | None]]:
    """What a sync of `tree` copies, top-down: (relative path, None) for each folder, then
    (relative path, absolute path) for each file in it. The one walk both executors' `put`
    and the size shown before a job's sync come from; rsync is told the same rules
    (`rsync_rules`). Never cloudtrain's home (`home_below`). `secrets`, when given, gets
    what was left out for holding credentials."""
    everywhere = ignore_patterns(tree, extra)
    home = home_below(tree)
    scoped: dict[Path, list[str]] = {}  # a folder's .gitignore rules, for what is below it

    def skipped(rel: Path, folder: bool) -> bool:
        if (folder and rel == home) or ignored(rel, SECRET_EXCLUDES, folder=folder):
            if secrets is not None:
                secrets.append(rel)
            return True
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
            if not skipped(rel_dir / name, False) and _regular(Path(dirpath) / name):
                yield rel_dir / name, Path(dirpath) / name


def _regular(path: Path) -> bool:
    """Whether `path` is a file a sync copies: a regular one, through a link as the user made
    it. A socket, FIFO or device is not (opening a socket fails, a FIFO waits forever for a
    writer), nor a link to nothing; rsync is told the same (``--no-specials --no-devices``)."""
    try:
        return stat.S_ISREG(path.stat().st_mode)
    except OSError:
        return False


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


#: How often a thread that waits for others wakes. The kernel may hand the process's SIGINT to
#: any of its threads, and Python runs the handler (Ctrl-C's KeyboardInterrupt) only in the
#: main thread, when it next runs: a wait with no timeout can sleep through Ctrl-C until what
#: it waits for ends (a setup's `sleep 600` kept `train` so: 3 Ctrl-C of 40 in a loop here).
WAKE_S = 0.25


def wait_all(futures: Iterable[Future[R]]) -> None:
    """Until every one of `futures` is done, awake for a signal (`WAKE_S`)."""
    pending = set(futures)
    while pending:
        _, pending = wait(pending, timeout=WAKE_S)


def join(*threads: threading.Thread) -> None:
    """`Thread.join` for each, awake for a signal (`WAKE_S`)."""
    for thread in threads:
        while thread.is_alive():
            thread.join(WAKE_S)


def fan_out(fn: Callable[[T], R], items: Sequence[T], *, max_workers: int | None = None) -> list[R]:
    """Apply `fn` to every item concurrently (at most `max_workers`, default `parallelism()`),
    results in order. The first exception is raised after every call has finished, so one
    slow node never hides another's error."""
    if len(items) <= 1:
        return [fn(item) for item in items]
    workers = max_workers or parallelism()
    pool = ThreadPoolExecutor(max_workers=min(workers, len(items)))
    try:
        futures = [pool.submit(fn, item) for item in items]
        wait_all(futures)
    except BaseException:  # Ctrl-C: not waited for (the executors' `close` ends the calls)
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    errors = [f.exception() for f in futures]
    pool.shutdown()
    for error in errors:
        if error is not None:
            raise error
    return [f.result() for f in futures]
