"""One node of an allocation, reached from the login node through ``srun --overlap`` steps.

A command runs through a step of the cluster's job on that node (`run`): the step's one task
hands its stdin, stdout and stderr to the node's host (`_host`), which runs the command as its
child inside the job's long step, so that whatever the command starts to outlive it (an agent
it heals, a warm server) stays in the allocation until ``scancel``; the step exits with the
command's status. The environment a command is given travels in srun's own (``--export=ALL``),
never on a command line. A detached start (`start_detached`) asks the host the same way. Files
travel through the folder the login node and the nodes share (`put`, `get`: the login node's
own copies, this machine's or rsync's over SSH, which take what a node wrote as untrusted).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from cloudtrain.errors import CommandError
from cloudtrain.executors.base import DETACH_SCRIPT, SSH_FAILED, RunResult
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
    ) -> None:
        self.login = login
        self.job_id = job_id
        self.node = node
        self.root = root
        self.python = python
        self._env = dict(env or {})

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
        step = [
            "srun",
            "--overlap",
            f"--jobid={self.job_id}",
            f"--nodelist={self.node}",
            "--nodes=1",
            "--ntasks=1",
            "--quiet",
            *where,
            *task,
        ]
        done = self.login.run(
            step,
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

    def put(self, local: Path, remote: str, *, excludes: Sequence[str] = ()) -> None:
        self.login.put(local, remote, excludes=excludes)

    def get(self, remote: str, local: Path) -> bool:
        return self.login.get(remote, local)

    def close(self) -> None:
        self.login.close()
