"""One node of an allocation, reached from the login node through ``srun --overlap`` steps.

A command runs through a step of the cluster's job on that node (`run`): the step's one task
hands its stdin, stdout and stderr to the node's host (`_host`), which runs the command as its
child inside the job's long step, so that whatever the command starts to outlive it (an agent
it heals, a warm server) stays in the allocation until ``scancel``; the step exits with the
command's status. The environment a command is given travels in srun's own (``--export=ALL``),
never on a command line. A detached start (`start_detached`) asks the host the same way.

Files: where the nodes share the login node's folder (``shared``), `put` and `get` are the login
node's own copies (this machine's, or rsync's over SSH, which take what a node wrote as
untrusted). Where they do not, files travel through a folder of the login node's (``stage``) and
a step: `put` copies to it, then ``tar | srun … unpack DEST`` there; `get` has ``srun … pack SRC``
write a tar there (bounded), copies it here and unpacks it with `received.untar`, which takes it
as untrusted. Either way a transfer is whole each time, not only what changed: a trade for not
needing rsync, or anything but Python's standard library, on the nodes.
"""

from __future__ import annotations

import contextlib
import json
import posixpath
import re
import secrets
import shlex
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

from cloudtrain.errors import CommandError, NodeDataError
from cloudtrain.executors import received
from cloudtrain.executors.base import DETACH_SCRIPT, SSH_FAILED, RunResult
from cloudtrain.node import files
from cloudtrain.providers.slurm._login import Shell

#: What srun adds to a failed step's stderr, which is no word of the command's.
_SRUN_NOISE = re.compile(r"^srun: error: \S+: tasks? [\d,-]+: Exited with exit code \d+$")
#: What srun says when the step could not run for the allocation's sake, not the command's: the
#: job is over (the time limit, a node failure, scancel) or its node is. The command's status is
#: then unknown, as over a connection that broke: `SSH_FAILED`, which the core reads as such.
_GONE = re.compile(
    r"^srun: error: (Slurm job \d+ has expired|Unable to confirm allocation|Invalid job id"
    r"|Node failure on|Unable to create step|Job/step already completing or completed"
    r"|Unable to contact slurm controller|Task launch for .* failed on node)"
    r"|^srun: Job step aborted"
)


def host_source() -> str:
    """The node host's program (`_host`), as ``python -c`` runs it."""
    return (Path(__file__).parent / "_host.py").read_text()


def files_source() -> str:
    """The program that reads and writes a node's files (`cloudtrain.node.files`), as
    ``python -c`` runs it."""
    return files.source()


class SrunExecutor:
    """Runs commands on node `node` of the job `job_id`, from the login node."""

    def __init__(
        self,
        login: Shell,
        job_id: str,
        node: str,
        root: str,
        python: str,
        env: Mapping[str, str] | None = None,
        *,
        stage: str | None = None,
    ) -> None:
        self.login = login
        self.job_id = job_id
        self.node = node
        self.root = root
        self.python = python
        self._env = dict(env or {})
        #: The login node's folder that files travel through, where the node does not share
        #: the login node's folder (None: it does).
        self.stage = stage

    def run(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = None,
        on_output: Callable[[str], None] | None = None,
    ) -> RunResult:
        """`argv` run by the node's host, through a step whose task carries its input, output
        and status (`_host.run`)."""
        hosted = [self.python, "-c", host_source(), "run", self.root, "--", *argv]
        return self._step(argv, hosted, env=env, cwd=cwd, timeout=timeout, on_output=on_output)

    def _step(
        self,
        argv: Sequence[str],
        task: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = None,
        on_output: Callable[[str], None] | None = None,
        stdin: str | None = None,
    ) -> RunResult:
        """A step of the job on the node whose one task is `task` (for `argv`): its result,
        without srun's own noise; `SSH_FAILED` when srun says the allocation is gone."""
        gone: list[str] = []

        def seen(line: str) -> None:
            if _GONE.match(line.strip()):
                gone.append(line.strip())
            elif on_output is not None and not _SRUN_NOISE.match(line.strip()):
                on_output(line)

        where = [f"--chdir={cwd}"] if cwd else []
        done = self.login.run(
            [*self._srun(), *where, *task],
            env={**self._env, **(env or {})},
            timeout=timeout,
            on_output=seen if on_output is not None else None,
            stdin=stdin,
        )
        kept = []
        for line in done.stderr.splitlines(keepends=True):
            said = line.strip()
            if _GONE.match(said):
                gone.append(said)
            elif not _SRUN_NOISE.match(said):
                kept.append(line)
        if gone and done.returncode != 0:
            return RunResult(tuple(argv), SSH_FAILED, done.stdout, gone[-1] + "\n")
        return RunResult(tuple(argv), done.returncode, done.stdout, "".join(kept))

    def start_detached(
        self, argv: Sequence[str], *, env: Mapping[str, str], cwd: str, job_dir: str
    ) -> int:
        request = {
            "script": DETACH_SCRIPT,
            "argv": list(argv),
            "env": dict(env),
            "cwd": cwd,
            "job_dir": job_dir,
        }
        spawn = [self.python, "-c", host_source(), "spawn", self.root]
        done = self._step(argv, spawn, stdin=json.dumps(request) + "\n", timeout=120)
        pid = done.stdout.strip().splitlines()[-1:] or [""]
        if done.returncode != 0 or not pid[0].isdigit():
            raise CommandError(done.returncode, tuple(argv), done.stderr or done.stdout)
        return int(pid[0])

    def _srun(self) -> list[str]:
        """A step of one task on the node."""
        return ["srun", "--overlap", f"--jobid={self.job_id}", f"--nodelist={self.node}",
                "--nodes=1", "--ntasks=1", "--quiet"]  # fmt: skip

    def _transfer(self, verb: str, path: str) -> list[str]:
        """A step of the node's whose task is `cloudtrain.node.files`'s `verb` of `path` (``pack``,
        ``unpack``), in a folder every node has."""
        return [*self._srun(), "--chdir=/", self.python, "-c", files_source(), verb, path]

    def files(self, texts: Mapping[str, str], *, unless: str | None = None) -> bool:
        """Write `texts` (path: text) on the node, atomically and the user's alone, unless the
        path `unless` exists there: whether they were written."""
        request = json.dumps({"files": dict(texts), "unless": unless}) + "\n"
        task = [self.python, "-c", files_source(), "files"]
        done = self._step(["files", *texts], task, stdin=request, timeout=120)
        if done.returncode != 0:
            raise CommandError(done.returncode, ("files", *texts), done.stderr or done.stdout)
        return done.stdout.strip().endswith("written")

    def put(self, local: Path, remote: str, *, excludes: Sequence[str] = ()) -> None:
        if self.stage is None:
            self.login.put(local, remote, excludes=excludes)
            return
        with self._staged() as stage:
            self.login.put(local, posixpath.join(stage, "data"), excludes=excludes)
            unpack = shlex.join(self._transfer("unpack", remote))
            self._sh(("put", remote), f"tar -C {shlex.quote(stage)} -cf - data | {unpack}")

    def get(self, remote: str, local: Path) -> bool:
        if self.stage is None:
            return self.login.get(remote, local)
        # `received.untar` holds the files to `limit()`; this bound, with room for the tar's
        # headers and padding, keeps a node that lies from filling the login node's disk
        limit = received.limit()
        bound = limit + (limit >> 6) + (1 << 20)
        with self._staged() as stage, tempfile.TemporaryDirectory() as here:
            pack = shlex.join(self._transfer("pack", remote))
            into = shlex.quote(stage)
            script = f'{{ {pack}; echo "$?" > {into}/status; }} | head -c {bound} > {into}/data.tar'
            said = self._sh(("get", remote), script)
            came = Path(here) / "came"
            if not self.login.get(stage, came):
                raise NodeDataError(f"{self.node}: {remote}: nothing came back of it")
            status = (came / "status").read_text().strip() if (came / "status").is_file() else ""
            if status == "3":
                return False  # no such folder on the node
            tar = came / "data.tar"
            if not tar.is_file() or tar.stat().st_size >= bound:
                raise NodeDataError(received.too_large(local, limit))
            if status != "0":
                raise CommandError(int(status) if status.isdigit() else 1, ("get", remote), said)
            received.untar(tar, local)
        return True

    @contextlib.contextmanager
    def _staged(self) -> Iterator[str]:
        """A new folder in `stage` on the login node, removed after."""
        assert self.stage is not None
        folder = posixpath.join(self.stage, secrets.token_hex(8))
        self._sh(("mkdir", folder), f"umask 077 && mkdir -p {shlex.quote(folder)}")
        try:
            yield folder
        finally:
            self.login.run(["rm", "-rf", "--", folder], timeout=120)

    def _sh(self, argv: tuple[str, ...], script: str) -> str:
        """`script` run by the login node's shell: what it said on stderr, less srun's noise;
        `CommandError` when it fails."""
        done = self.login.run(["sh", "-c", script], timeout=3600)
        kept = [line for line in done.stderr.splitlines() if not _SRUN_NOISE.match(line.strip())]
        if done.returncode != 0:
            raise CommandError(done.returncode, argv, "\n".join(kept))
        return "\n".join(kept)

    def close(self) -> None:
        self.login.close()
