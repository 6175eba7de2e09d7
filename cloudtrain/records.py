"""What the state file holds, as records: a cluster, a job, an event, an intent (`cloudtrain.state`
writes and reads them); the statuses a cluster and a job go through, and how a cluster's may move;
and how a row becomes a record, its JSON columns read as data that may be damaged (`StateError`,
never a traceback)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import Any

from cloudtrain.errors import StateError
from cloudtrain.spec import ClusterSpec


class ClusterStatus(StrEnum):
    """A cluster's status as recorded. It moves only as `MOVES` says: `State.set_cluster_status`
    refuses any other move (a bug in cloudtrain, not a user's error)."""

    #: an `up` makes its nodes (under the cluster's lock)
    PROVISIONING = "provisioning"
    #: its nodes run; the `up` waits for their bootstrap (under the lock)
    BOOTSTRAPPING = "bootstrapping"
    #: every node asked for runs (and its bootstrap finished, where `up` waited for it)
    UP = "up"
    #: fewer nodes than asked run: an `up` failed or was killed while it made them, a node went
    PARTIAL = "partial"
    #: its nodes run, but nobody watched their bootstrap to its end (Ctrl-C or a kill in `up`)
    UNWATCHED = "unwatched"
    #: a node's bootstrap failed (its event says which phase, and why)
    FAILED = "failed"
    #: its nodes stopped themselves (idle, or its lifetime): nothing of it bills
    STOPPED = "stopped"
    #: its provider has no node of it left
    GONE = "gone"
    #: no node is left, but resources of it remain (`down` removes them)
    LEFTOVERS = "leftovers"


#: What `cloudtrain.reconcile` may find a cluster to be, whatever it was: its provider's tags.
SEEN = frozenset(
    {ClusterStatus.UP, ClusterStatus.PARTIAL, ClusterStatus.GONE, ClusterStatus.LEFTOVERS}
)
#: The statuses only a running `up` holds (under the cluster's lock), and what each becomes
#: once no process holds that lock any more (the `up` was killed: `api.abandoned`).
IN_PROGRESS: Mapping[ClusterStatus, ClusterStatus] = MappingProxyType(
    {
        ClusterStatus.PROVISIONING: ClusterStatus.PARTIAL,
        ClusterStatus.BOOTSTRAPPING: ClusterStatus.UNWATCHED,
    }
)
_SETTLED = frozenset(ClusterStatus) - set(IN_PROGRESS)
#: Where each status may go (besides staying): an `up` provisions any settled cluster again and
#: walks it to bootstrapping and up (or partial, failed, unwatched when it is cut short); a
#: settled cluster stops itself (`cloudtrain.autostop`); whatever it is, the provider's tags may
#: say otherwise (`SEEN`).
MOVES: Mapping[ClusterStatus, frozenset[ClusterStatus]] = MappingProxyType(
    {
        ClusterStatus.PROVISIONING: SEEN | {ClusterStatus.BOOTSTRAPPING},
        ClusterStatus.BOOTSTRAPPING: SEEN | {ClusterStatus.UNWATCHED, ClusterStatus.FAILED},
        **{s: SEEN | {ClusterStatus.PROVISIONING, ClusterStatus.STOPPED} for s in _SETTLED},
    }
)


def may_move(was: ClusterStatus, to: ClusterStatus) -> bool:
    """Whether a cluster that is `was` may become `to` (`MOVES`; staying is always allowed)."""
    return to == was or to in MOVES[was]


#: ``recovering``: a managed job between attempts (its watcher replaces a node, restores the
#: newest checkpoint and starts it again).
JOB_STATUSES = ("pending", "running", "recovering", "succeeded", "failed", "cancelled")
FINISHED_JOB_STATUSES = frozenset({"succeeded", "failed", "cancelled"})

# Columns in the order of the record's fields, so a row builds its record positionally.
CLUSTER_COLS = (
    "name, provider, status, created_at, updated_at, price_per_hour, plan_json, spec_json"
)
JOB_COLS = (
    "id, seq, cluster, name, status, created_at, started_at, ended_at, exit_code, num_nodes, "
    "nproc_per_node, command_json, detail_json"
)
INTENT_COLS = "id, ts, cluster, action, detail_json, closed_at, outcome"
EVENT_COLS = "id, ts, cluster, job_id, kind, message"
JOB_BY_ID = f"SELECT {JOB_COLS} FROM jobs WHERE id = ?"


def frozen(data: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(data))


#: What to do about a damaged record: a new state file, and `down` by tag for what was made.
AFRESH = (
    "move state.db out of CLOUDTRAIN_HOME to start afresh; `cloudtrain down NAME --provider P` "
    "then finds a cluster's resources by their tags"
)


def json_column(text: str) -> Any:
    """A stored JSON column; a damaged one is a `StateError` (exit 4), never a traceback."""
    try:
        return json.loads(text)
    except (TypeError, ValueError) as exc:
        raise StateError(
            f"a record in the state file is damaged (not JSON: {exc}); {AFRESH}"
        ) from None


def loads(text: str | None) -> Mapping[str, Any] | None:
    return None if text is None else frozen(json_column(text))


@dataclass(frozen=True)
class ClusterRecord:
    """A cluster as last recorded; `spec` parses the stored spec."""

    name: str
    provider: str
    status: ClusterStatus
    created_at: float
    updated_at: float
    price_per_hour: float | None
    plan: Mapping[str, Any] | None
    spec_json: str

    @property
    def spec(self) -> ClusterSpec:
        try:
            return ClusterSpec.from_dict(json_column(self.spec_json))
        except (KeyError, TypeError, ValueError) as exc:
            raise StateError(
                f"the recorded spec of cluster {self.name!r} is damaged ({exc!r}); "
                f"`cloudtrain down {self.name}` removes the cluster"
            ) from None


@dataclass(frozen=True)
class JobRecord:
    """A job; `id` is ``<cluster>-<seq>`` with `seq` global and never reused."""

    id: str
    seq: int
    cluster: str
    name: str
    status: str
    created_at: float
    started_at: float | None
    ended_at: float | None
    exit_code: int | None
    num_nodes: int
    nproc_per_node: int
    command: tuple[str, ...]
    detail: Mapping[str, Any]

    @property
    def finished(self) -> bool:
        """True once succeeded, failed or cancelled."""
        return self.status in FINISHED_JOB_STATUSES


@dataclass(frozen=True)
class EventRecord:
    """One line of the event log (`job_id` None for a cluster-level event)."""

    id: int
    ts: float
    cluster: str
    job_id: str | None
    kind: str
    message: str


@dataclass(frozen=True)
class IntentRecord:
    """A cloud mutation begun at `ts`; `closed_at`/`outcome` stay None until it is ended."""

    id: int
    ts: float
    cluster: str
    action: str
    detail: Mapping[str, Any]
    closed_at: float | None
    outcome: str | None


def cluster_row(row: tuple[Any, ...]) -> ClusterRecord:
    try:
        status = ClusterStatus(row[2])
    except ValueError:
        raise StateError(
            f"the recorded status of cluster {row[0]!r} is damaged: {row[2]!r} is none of "
            f"{', '.join(ClusterStatus)}; `cloudtrain status --refresh` reads it again from its "
            "provider"
        ) from None
    return ClusterRecord(row[0], row[1], status, row[3], row[4], row[5], loads(row[6]), row[7])


def job_row(row: tuple[Any, ...]) -> JobRecord:
    return JobRecord(*(*row[:11], tuple(json_column(row[11])), frozen(json_column(row[12]))))


def intent_row(row: tuple[Any, ...]) -> IntentRecord:
    return IntentRecord(*(*row[:4], frozen(json_column(row[4])), *row[5:]))
