"""What a cluster's jobs need before its nodes go: `lifecycle.down`'s `StopJobs`.

Each unfinished job is marked to start nothing more (a managed job's watcher, mid-recovery,
reads it), stopped on every node that answers, and recorded cancelled; the logs of every job
are kept in the home folder. A node that does not answer does not stop a teardown: the warning
says so, and the nodes go anyway.
"""

from __future__ import annotations

import time
from pathlib import Path

from cloudtrain.errors import CloudtrainError
from cloudtrain.jobs.coordinator import Coordinator
from cloudtrain.model import Event, OnEvent
from cloudtrain.provision.provider import Provider
from cloudtrain.state import State


def stop_jobs(state: State, home: Path, prov: Provider, name: str, on_event: OnEvent) -> None:
    coord = Coordinator(state, prov, home=home)
    try:
        for job in state.jobs(name):
            if not job.finished:
                on_event(Event("job", f"cancelling job {job.id}"))
                # a managed job's watcher, mid-recovery, starts nothing more
                state.update_job(job.id, detail={"cancel_requested": time.time()})
                try:
                    coord.cancel(job.id)
                except CloudtrainError as exc:  # a node that does not answer must not
                    on_event(
                        Event(
                            "warning",
                            f"could not stop job {job.id} on every "
                            f"node ({exc}); terminating anyway",
                        )
                    )
                if coord.finish(job.id, "cancelled"):  # its nodes could not say: gone now
                    state.add_event(
                        name,
                        "job",
                        f"job {job.id} cancelled: its cluster was torn down",
                        job_id=job.id,
                    )
        coord.archive_logs(name)
    finally:
        coord.close()
