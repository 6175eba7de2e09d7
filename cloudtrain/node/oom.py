"""Whether the kernel's OOM killer struck while a job ran on this node. Stdlib only.

A rank killed by SIGKILL leaves no word of why; the kernel's log (``dmesg``) is not readable
unprivileged. What is: the OOM killer's count of the processes it killed in a memory cgroup
(``oom_kill N``, in ``memory.events`` on cgroup v2, where it counts the cgroup's descendants
too, and in ``memory.oom_control`` on v1). The job's detach wrapper
(`cloudtrain.executors.base.DETACH_SCRIPT`) writes its own cgroup's ``oom_kill`` lines when the
job starts (``oom_kill.start``) and again when its launcher ended (``oom_kill.end``); the ranks
run in that cgroup unless they moved themselves out of it.

The difference says how many processes of that cgroup the OOM killer killed meanwhile: more
than none, and a rank killed by SIGKILL was most likely one of them (on a shared cgroup, say a
container's, it may have been a neighbour, at the same moment). None: it cannot be told (no
memory cgroup to read, or the wrapper did not get to its end: it was killed as well).
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["kills"]

START = "oom_kill.start"
END = "oom_kill.end"


def kills(job_dir: Path) -> int | None:
    """The OOM kills counted in the job's memory cgroup while it ran on this node; None when
    that cannot be told."""
    start, end = _count(job_dir / START), _count(job_dir / END)
    if start is None or end is None:
        return None
    return max(0, end - start)


def _count(path: Path) -> int | None:
    """The sum of the ``oom_kill N`` lines in `path`; None when it has none (or is not
    there)."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError):
        return None
    values = [
        int(words[1])
        for words in (line.split() for line in text.splitlines())
        if len(words) == 2 and words[0] == "oom_kill" and words[1].isdigit()
    ]
    return sum(values) if values else None
