"""Slurm's commands as the provider calls them, on the login node, and what they print, parsed.

Only commands and output forms that Slurm 22.05 (what CI runs) through 25.11 share: ``squeue``
with ``--noheader --format`` (fields split by the ASCII unit separator, which no name holds),
``scontrol --oneliner show node``, ``scontrol show hostnames``, ``sbatch --parsable`` and
``scancel``; no ``--json`` and no ``squeue --only-job-state`` (neither in 22.05). Whatever comes
back is parsed defensively: an odd line is skipped, never trusted to be complete.

Each cluster is a batch job: its name is the cluster's name and its comment says whose it is
(``cloudtrain {"owner": …, "id": …}``): `Allocation` is what ``squeue`` shows of one. A node made
again while the cluster's job runs on (a lost node's, ``--no-kill``) is a job of its own, of one
node, whose comment names its index too (``"index": N``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cloudtrain.errors import ProviderError
from cloudtrain.executors.base import RunResult
from cloudtrain.providers.slurm._login import Shell

SEP = "\x1f"
#: squeue's fields: id, name, state, reason, node list, node count, time limit, time left, start
#: (expected, while it pends), comment (last: it is the one free text).
_FIELDS = ("%A", "%j", "%T", "%r", "%N", "%D", "%l", "%L", "%S", "%k")
COMMENT_PREFIX = "cloudtrain "
#: The states of a job that holds, or waits for, its nodes.
LIVE = frozenset(
    {
        "PENDING",
        "CONFIGURING",
        "RUNNING",
        "COMPLETING",
        "SUSPENDED",
        "REQUEUED",
        "REQUEUE_HOLD",
        "REQUEUE_FED",
        "RESIZING",
        "SIGNALING",
        "STAGE_OUT",
        "STOPPED",
    }
)
#: Reasons a pending job will never start for, as Slurm words them, and what each means: the job
#: asks for more than its partition, account or QoS may ever give.
_BEYOND = "asks for more than the {} allows"
NEVER: Mapping[str, str] = {
    "PartitionTimeLimit": "its time limit is beyond the partition's MaxTime",
    "PartitionNodeLimit": "it asks for more nodes than the partition allows",
    "PartitionConfig": "the partition cannot give it (more nodes, time or GPUs than it has)",
    "PartitionDown": "the partition is down",
    "PartitionInactive": "the partition is inactive",
    "BadConstraints": "no node can meet its constraints",
    "InvalidAccount": "the account is not valid",
    "InvalidQOS": "the QoS is not valid",
    "QOSMaxGRESPerJob": "it " + _BEYOND.format("QoS (GPUs per job)"),
    "QOSMaxNodePerJobLimit": "it " + _BEYOND.format("QoS (nodes per job)"),
    "QOSMaxWallDurationPerJobLimit": "it " + _BEYOND.format("QoS (time per job)"),
    "AssocMaxNodesPerJobLimit": "it " + _BEYOND.format("account (nodes per job)"),
    "AssocMaxWallDurationPerJobLimit": "it " + _BEYOND.format("account (time per job)"),
    "DependencyNeverSatisfied": "what it waits for will never happen",
}


@dataclass(frozen=True)
class Allocation:
    """One of this user's jobs, as ``squeue`` shows it."""

    job_id: str
    name: str
    state: str
    reason: str
    nodelist: str
    nodes: int
    time_limit: str
    #: what is left of the time limit (``29:51``, ``1-02:03:04``; ``UNLIMITED``, ``INVALID``)
    time_left: str
    #: when it started, or while it pends when Slurm expects it to (its local time, as it
    #: prints it: ``2026-12-07T03:10:00``); "" when Slurm does not know
    start: str
    owner: str | None
    cluster_id: str | None
    #: the node index a job of one node holds for its cluster; None: the cluster's own job
    index: int | None = None

    @property
    def running(self) -> bool:
        return self.state == "RUNNING"


def comment(owner: str, cluster_id: str | None, index: int | None = None) -> str:
    """The comment that marks a job as one cluster of `owner`'s (as its node `index`'s)."""
    marks: dict[str, object] = {"owner": owner, "id": cluster_id}
    if index is not None:
        marks["index"] = index
    return COMMENT_PREFIX + json.dumps(marks, sort_keys=True)


def parse_queue(text: str) -> list[Allocation]:
    """``squeue --noheader --format`` of `_FIELDS` → its jobs (odd lines skipped)."""
    found = []
    for line in text.splitlines():
        parts = line.split(SEP, len(_FIELDS) - 1)
        if len(parts) != len(_FIELDS) or not parts[0].strip().isdigit():
            continue
        job_id, name, state, reason, nodelist, count, limit, left, start, note = (
            p.strip() for p in parts
        )
        owner, cluster_id, index = None, None, None
        if note.startswith(COMMENT_PREFIX):
            try:
                marks = json.loads(note[len(COMMENT_PREFIX) :])
            except ValueError:
                marks = None
            if isinstance(marks, dict) and isinstance(marks.get("owner"), str):
                owner = marks["owner"]
                cluster_id = marks.get("id") if isinstance(marks.get("id"), str) else None
                said = marks.get("index")
                index = said if type(said) is int and 0 <= said < 100_000 else None
        found.append(
            Allocation(
                job_id,
                name,
                state.upper(),
                reason,
                "" if nodelist in ("", "(null)") else nodelist,
                int(count) if count.isdigit() else 0,
                limit,
                left,
                start if _WHEN.fullmatch(start) else "",
                owner,
                cluster_id,
                index,
            )
        )
    return found


#: A time as squeue prints one (anything else, ``N/A`` or ``Unknown``, is no time).
_WHEN = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d")


def seconds(text: str) -> int | None:
    """A Slurm duration (``[D-]H:M:S``, ``M:S``, minutes) in seconds; None for ``UNLIMITED``,
    ``INVALID``, ``NOT_SET`` or anything else."""
    found = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", text.strip())
    if found is None:
        return None
    days, first, second, third = found.groups()
    parts = [int(first)] + [int(p) for p in (second, third) if p is not None]
    if days is not None or len(parts) == 3:  # D-H[:M[:S]] or H:M:S
        parts += [0] * (3 - len(parts))
        hours, minutes, secs = parts
    elif len(parts) == 2:
        hours, (minutes, secs) = 0, parts
    else:
        hours, minutes, secs = 0, parts[0], 0
    return ((int(days or 0) * 24 + hours) * 60 + minutes) * 60 + secs


def parse_oneliner(text: str) -> list[dict[str, str]]:
    """``scontrol --oneliner show node|job`` → one dict of its ``Key=Value`` fields per line.
    A value holds no space but in the free-text fields (a reason, a comment), which are taken
    only up to their first space."""
    records = []
    for line in text.splitlines():
        fields = dict(re.findall(r"(?:^|\s)([A-Za-z][\w/:.]*)=(\S*)", line))
        if fields:
            records.append(fields)
    return records


def parse_version(text: str) -> tuple[int, int]:
    """``sinfo --version`` (``slurm 23.11.4``, ``slurm-wlm 22.05.8``) → (23, 11); (0, 0) when
    it says no version."""
    found = re.search(r"\b(\d+)\.(\d+)(?:\.\d+)?\b", text)
    return (int(found.group(1)), int(found.group(2))) if found else (0, 0)


def refused(stderr: str) -> str:
    """What an sbatch/squeue error says, in one line: its last ``error:`` line, without the
    command's name."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if "error:" in line] or lines or ["no reason given"]
    said = errors[-1].split("error:", 1)[-1].strip()
    return said.removeprefix("Batch job submission failed:").strip()


class Slurm:
    """Slurm's commands, run on the login node through `login` (`_login`)."""

    def __init__(self, login: Shell, env: Mapping[str, str] | None = None) -> None:
        self.login = login
        self._env = dict(env or {})

    def run(self, *argv: str, stdin: str | None = None, timeout: float = 60) -> RunResult:
        """`argv` on the login node; `ProviderError` when Slurm's controller cannot be
        reached (munge down, slurmctld down): one line with what the command said."""
        done = self.login.run(argv, env=self._env, timeout=timeout, stdin=stdin)
        if done.returncode != 0 and "failed to fetch config" in done.stderr:
            raise ProviderError(
                "slurm",
                "NoConfig",
                f"{argv[0]} finds no Slurm cluster where it runs (no slurm.conf, no "
                "configless slurmctld): run on a login node, or give --login user@login-node",
            )
        if done.returncode != 0 and _unreachable(done.stderr):
            raise ProviderError("slurm", "Unreachable", f"{argv[0]}: {refused(done.stderr)}")
        return done

    def queue(self, name: str | None = None) -> list[Allocation]:
        """This user's live jobs (named `name`, when given)."""
        argv = ["squeue", "--me", "--noheader", "--format=" + SEP.join(_FIELDS)]
        if name is not None:
            argv.append(f"--name={name}")
        done = self.run(*argv)
        if done.returncode != 0:
            raise ProviderError("slurm", "SqueueFailed", f"squeue: {refused(done.stderr)}")
        return [a for a in parse_queue(done.stdout) if a.state in LIVE]

    def hostnames(self, nodelist: str) -> list[str]:
        """A node list (``n[1-2],gpu07``) as its host names, in Slurm's order."""
        if not nodelist:
            return []
        done = self.run("scontrol", "show", "hostnames", nodelist)
        return [h for h in done.stdout.split() if h] if done.ok else []

    def nodes(self, names: Sequence[str]) -> dict[str, dict[str, str]]:
        """``scontrol show node`` of `names`, by node name."""
        if not names:
            return {}
        done = self.run("scontrol", "--oneliner", "show", "node", ",".join(names))
        return {r["NodeName"]: r for r in parse_oneliner(done.stdout) if "NodeName" in r}

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job`` of `job_id` (also an ended one, for a few minutes); {} when
        Slurm no longer knows it."""
        done = self.run("scontrol", "--oneliner", "show", "job", job_id)
        found = parse_oneliner(done.stdout) if done.ok else []
        return found[0] if found else {}

    def submit(self, script: str, options: Sequence[str]) -> str:
        """``sbatch --parsable OPTIONS`` of `script` (on stdin); the job's id. `ProviderError`
        with Slurm's own words when it refuses."""
        done = self.run("sbatch", "--parsable", *options, stdin=script)
        job_id = done.stdout.strip().split(";")[0]
        if done.returncode != 0 or not job_id.isdigit():
            raise ProviderError(
                "slurm",
                "Refused",
                f"sbatch refused the allocation: {refused(done.stderr or done.stdout)}",
            )
        return job_id

    def cancel(self, job_ids: Sequence[str]) -> None:
        if job_ids:
            self.run("scancel", *job_ids)

    def version(self) -> tuple[int, int]:
        return parse_version(self.run("sinfo", "--version").stdout)


def _unreachable(stderr: str) -> bool:
    text = stderr.lower()
    return any(
        word in text
        for word in (
            "munge",
            "unable to contact slurm controller",
            "connection refused",
            "slurm_load_jobs error: unable",
            "zero bytes were transmitted",
        )
    )
