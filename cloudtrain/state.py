"""The local state: clusters, their nodes, jobs, an event log and intents, in one SQLite file.

The file is ``<home>/state.db`` (see `home`), mode 0600 in a 0700 folder, in WAL mode. Every
write is one short ``BEGIN IMMEDIATE`` transaction, so several CLI processes (and a few threads
sharing one `State`) can write at once without corrupting the file or losing an update; a writer
waits up to `BUSY_TIMEOUT_S` for the lock and then raises `StateError`.

An *intent* is written before each cloud mutation and closed after it: an open intent found by a
later command means an earlier one died half way (``up`` interrupted), to be finished or cleaned.
The cloud's tags stay the truth about what exists; losing this file leaks nothing.

A *span* is one node billing (`cloudtrain.spans`): `set_nodes` and `delete_cluster` keep the
spans in step with the nodes in the same transaction, so no path that records nodes forgets
them. Spans, jobs and events outlive their cluster's record (`cloudtrain.cost` reports clusters
already down; ``cloudtrain events`` tells their story).

Every `sqlite3`/`OSError` is raised as `StateError` naming the file. Reads never raise
`NotFoundError` (they return None or []); updates of a missing cluster, job or intent do.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import sqlite3
import stat
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from cloudtrain import spans as _spans
from cloudtrain.errors import ConfigError, NotFoundError, StateError
from cloudtrain.model import NodeInfo
from cloudtrain.records import (
    CLUSTER_COLS,
    EVENT_COLS,
    FINISHED_JOB_STATUSES,
    INTENT_COLS,
    JOB_BY_ID,
    JOB_COLS,
    JOB_STATUSES,
    ClusterRecord,
    ClusterStatus,
    EventRecord,
    IntentRecord,
    JobRecord,
    cluster_row,
    intent_row,
    job_row,
    json_column,
    may_move,
)
from cloudtrain.spans import SpanRecord
from cloudtrain.spec import ClusterSpec

__all__ = [
    "BUSY_TIMEOUT_S",
    "FINISHED_JOB_STATUSES",
    "JOB_STATUSES",
    "SCHEMA_VERSION",
    "ClusterRecord",
    "EventRecord",
    "IntentRecord",
    "JobRecord",
    "SpanRecord",
    "State",
    "home",
]

logger = logging.getLogger(__name__)

BUSY_TIMEOUT_S = 15.0
# Schema migrations: _MIGRATIONS[v] takes the file from version v-1 to v. Add a new version with
# the statements for it (e.g. ``ALTER TABLE jobs ADD COLUMN ...``); never edit a released one.
_MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: (
        """CREATE TABLE clusters (
            name TEXT PRIMARY KEY, provider TEXT NOT NULL, spec_json TEXT NOT NULL,
            status TEXT NOT NULL, created_at REAL NOT NULL, updated_at REAL NOT NULL,
            price_per_hour REAL, plan_json TEXT)""",
        """CREATE TABLE nodes (
            cluster TEXT NOT NULL REFERENCES clusters(name) ON DELETE CASCADE,
            idx INTEGER NOT NULL, node_json TEXT NOT NULL, PRIMARY KEY (cluster, idx))""",
        "CREATE TABLE counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL)",
        "INSERT INTO counters (name, value) VALUES ('job_seq', 0)",
        """CREATE TABLE jobs (
            id TEXT PRIMARY KEY, seq INTEGER NOT NULL UNIQUE, cluster TEXT NOT NULL,
            name TEXT NOT NULL, status TEXT NOT NULL, created_at REAL NOT NULL,
            started_at REAL, ended_at REAL, exit_code INTEGER, num_nodes INTEGER NOT NULL,
            nproc_per_node INTEGER NOT NULL, command_json TEXT NOT NULL,
            detail_json TEXT NOT NULL DEFAULT '{}')""",
        "CREATE INDEX jobs_cluster ON jobs (cluster, seq)",
        """CREATE TABLE events (
            id INTEGER PRIMARY KEY AUTOINCREMENT, ts REAL NOT NULL, cluster TEXT NOT NULL,
            job_id TEXT, kind TEXT NOT NULL, message TEXT NOT NULL)""",
        "CREATE INDEX events_cluster ON events (cluster, id)",
        "CREATE INDEX events_job ON events (job_id, id)",
        """CREATE TABLE intents (
            id INTEGER PRIMARY KEY AUTOINCREMENT, ts REAL NOT NULL, cluster TEXT NOT NULL,
            action TEXT NOT NULL, detail_json TEXT NOT NULL, closed_at REAL, outcome TEXT)""",
        "CREATE INDEX intents_open ON intents (cluster, id) WHERE closed_at IS NULL",
    ),
    2: _spans.SCHEMA,  # the node spans (`cloudtrain.spans`)
}
SCHEMA_VERSION = max(_MIGRATIONS)


def home() -> Path:
    """``$CLOUDTRAIN_HOME`` if set, else the user data dir. Pure: creates nothing."""
    value = os.environ.get("CLOUDTRAIN_HOME")
    if value:
        return Path(value).expanduser()
    import platformdirs

    return platformdirs.user_data_path("cloudtrain")


_default_home = home  # `State.open` takes a parameter named home


def _dumps(value: object) -> str:
    """JSON text; nested mappings such as MappingProxyType become objects, tuples arrays."""

    def default(obj: object) -> object:
        if isinstance(obj, Mapping):
            return dict(obj)
        raise TypeError(f"{type(obj).__name__} is not JSON-serialisable: {obj!r:.80}")

    return json.dumps(value, default=default)


def _make_home(path: Path) -> None:
    """Make the folder 0700, or tighten one that existed readable by others (made by hand, or
    by the shell's umask before cloudtrain ran); `ConfigError` for one that is another user's
    or writable by others (`access.private_folder`)."""
    from cloudtrain.access import private_folder

    private_folder(path, "cloudtrain's home")


def _make_file(path: Path) -> None:
    """Create the file 0600 before SQLite does (it would use 0644), or tighten a looser one;
    `ConfigError` for another user's (its clusters and nodes would be theirs to make up)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        found = os.fstat(fd)
        if found.st_uid != os.getuid():
            raise ConfigError(
                f"the state file {path} is owned by uid {found.st_uid}, not by you (uid "
                f"{os.getuid()}): another user could have written it; check it and move it aside"
            )
        if stat.S_IMODE(found.st_mode) & 0o077:
            os.fchmod(fd, 0o600)
    finally:
        os.close(fd)


class State:
    """One connection to the state file. Thread-safe; use as a context manager or `close()`."""

    def __init__(
        self, path: Path, conn: sqlite3.Connection, clock: Callable[[], float] = time.time
    ) -> None:
        self.path = path
        self._conn = conn
        self._clock = clock
        self._lock = threading.RLock()

    @classmethod
    def open(cls, home: Path | None = None, *, clock: Callable[[], float] = time.time) -> State:
        """Open (creating or migrating) ``<home>/state.db``; `home` defaults to `home()`.

        Blocks up to `BUSY_TIMEOUT_S` while another process migrates. Raises `StateError` for a
        corrupt or unreadable file, or one written by a newer cloudtrain.
        """
        folder = _default_home() if home is None else Path(home)
        path = folder / "state.db"
        conn: sqlite3.Connection | None = None
        try:
            _make_home(folder)
            _make_file(path)
            # timeout= is SQLite's busy_timeout; isolation_level=None: we BEGIN ourselves.
            conn = sqlite3.connect(
                path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
            )
            conn.execute("PRAGMA foreign_keys = ON")
            _use_wal(conn, path)
            _migrate(conn, path)
        except BaseException as exc:
            if conn is not None:
                conn.close()
            if isinstance(exc, sqlite3.Error | OSError):
                raise StateError(
                    f"cannot open the state file {path}: {exc} (move it aside to start afresh; "
                    "`status --refresh` rebuilds clusters from the clouds' tags)"
                ) from exc
            raise
        return cls(path, conn, clock)

    def close(self) -> None:
        """Close the connection. Idempotent."""
        with self._lock:
            self._conn.close()

    def __enter__(self) -> State:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        try:
            yield
        except sqlite3.Error as exc:
            raise StateError(f"state file {self.path}: {exc}") from exc

    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One ``BEGIN IMMEDIATE`` transaction, committed on success, rolled back on error."""
        with self._lock, self._errors():
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
                self._conn.execute("COMMIT")
            except BaseException:
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                raise

    def _read(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._lock, self._errors():
            return self._conn.execute(sql, params).fetchall()

    def check(self) -> None:
        """Run SQLite's integrity check; raises `StateError` listing the problems found."""
        problems = [row[0] for row in self._read("PRAGMA integrity_check")]
        if problems != ["ok"]:
            raise StateError(f"state file {self.path} is damaged: {'; '.join(problems)}")

    # -- clusters ---------------------------------------------------------------------------

    def put_cluster(
        self,
        spec: ClusterSpec,
        *,
        status: ClusterStatus,
        price_per_hour: float | None = None,
        plan: Mapping[str, Any] | None = None,
    ) -> None:
        """Insert or update `spec.name`, keeping created_at; a None price/plan keeps the stored."""
        now = self._clock()
        plan_json = None if plan is None else _dumps(plan)
        spec_json = _dumps(spec.to_dict())
        with self._write() as conn:
            conn.execute(
                """INSERT INTO clusters VALUES (?, ?, ?, ?, ?, ?, ?, ?)
                ON CONFLICT (name) DO UPDATE SET provider = excluded.provider,
                    spec_json = excluded.spec_json, status = excluded.status,
                    updated_at = excluded.updated_at,
                    price_per_hour = coalesce(excluded.price_per_hour, price_per_hour),
                    plan_json = coalesce(excluded.plan_json, plan_json)""",
                (spec.name, spec.provider, spec_json, status, now, now, price_per_hour, plan_json),
            )

    def cluster(self, name: str) -> ClusterRecord | None:
        rows = self._read(f"SELECT {CLUSTER_COLS} FROM clusters WHERE name = ?", (name,))
        return cluster_row(rows[0]) if rows else None

    def clusters(self) -> list[ClusterRecord]:
        """Every recorded cluster, by name."""
        rows = self._read(f"SELECT {CLUSTER_COLS} FROM clusters ORDER BY name")
        return [cluster_row(row) for row in rows]

    def set_cluster_status(self, name: str, status: ClusterStatus) -> None:
        """Move the cluster to `status`. Raises `NotFoundError` for an unknown cluster, and
        `StateError` for a move `records.MOVES` does not have (a bug: it names both)."""
        with self._write() as conn:
            row = conn.execute("SELECT status FROM clusters WHERE name = ?", (name,)).fetchone()
            if row is not None and row[0] in set(ClusterStatus):
                was = ClusterStatus(row[0])
                if not may_move(was, status):
                    raise StateError(f"cluster {name!r}: no move from {was} to {status}")
            cur = conn.execute(
                "UPDATE clusters SET status = ?, updated_at = ? WHERE name = ?",
                (status, self._clock(), name),
            )
            if cur.rowcount == 0:
                raise NotFoundError(f"no cluster named {name!r}")

    def delete_cluster(self, name: str) -> None:
        """Forget the cluster and its nodes, ending their spans; its spans, jobs, events and
        intents stay. Idempotent."""
        with self._write() as conn:
            _spans.end_all(conn, name, self._clock())
            conn.execute("DELETE FROM clusters WHERE name = ?", (name,))

    # -- nodes ------------------------------------------------------------------------------

    def set_nodes(
        self, cluster: str, nodes: Sequence[NodeInfo], *, since: float | None = None
    ) -> None:
        """Replace the cluster's nodes, and their spans with them (`cloudtrain.spans.track`:
        a new billing node's span starts at `since`, when it was asked for, default now).
        Raises `NotFoundError` for an unknown cluster."""
        indexes = [node.index for node in nodes]
        if len(set(indexes)) != len(indexes) or any(n.cluster != cluster for n in nodes):
            raise ValueError(f"nodes for {cluster!r} must have that cluster and distinct indexes")
        now = self._clock()
        with self._write() as conn:
            row = conn.execute(
                f"SELECT {CLUSTER_COLS} FROM clusters WHERE name = ?", (cluster,)
            ).fetchone()
            if row is None:
                raise NotFoundError(f"no cluster named {cluster!r}")
            record = cluster_row(row)
            conn.execute("DELETE FROM nodes WHERE cluster = ?", (cluster,))
            conn.executemany(
                "INSERT INTO nodes VALUES (?, ?, ?)",
                [(cluster, n.index, _dumps(n.to_dict())) for n in nodes],
            )
            _spans.track(
                conn, record.spec, record.plan, record.price_per_hour, nodes, now=now, since=since
            )

    def nodes(self, cluster: str) -> list[NodeInfo]:
        """The cluster's nodes by index; [] when none are recorded."""
        rows = self._read("SELECT node_json FROM nodes WHERE cluster = ? ORDER BY idx", (cluster,))
        return [NodeInfo.from_dict(json_column(row[0])) for row in rows]

    # -- jobs -------------------------------------------------------------------------------

    def new_job(
        self,
        cluster: str,
        name: str,
        *,
        num_nodes: int,
        nproc_per_node: int,
        command: Sequence[str],
    ) -> JobRecord:
        """Record a pending job with a fresh id ``<cluster>-<seq>``, unique across processes."""
        now, command_json = self._clock(), _dumps(list(command))
        with self._write() as conn:
            conn.execute("UPDATE counters SET value = value + 1 WHERE name = 'job_seq'")
            seq = int(
                conn.execute("SELECT value FROM counters WHERE name = 'job_seq'").fetchone()[0]
            )
            job_id = f"{cluster}-{seq}"
            conn.execute(
                """INSERT INTO jobs (id, seq, cluster, name, status, created_at, num_nodes,
                    nproc_per_node, command_json) VALUES (?, ?, ?, ?, 'pending', ?, ?, ?, ?)""",
                (job_id, seq, cluster, name, now, num_nodes, nproc_per_node, command_json),
            )
            row = conn.execute(JOB_BY_ID, (job_id,)).fetchone()
        return job_row(row)

    def job(self, job_id: str) -> JobRecord | None:
        rows = self._read(JOB_BY_ID, (job_id,))
        return job_row(rows[0]) if rows else None

    def jobs(self, cluster: str | None = None) -> list[JobRecord]:
        """Jobs, newest first; of one cluster name (past clusters of that name included)."""
        where, params = _filters(cluster=cluster)
        rows = self._read(f"SELECT {JOB_COLS} FROM jobs{where} ORDER BY seq DESC", params)
        return [job_row(row) for row in rows]

    def update_job(
        self,
        job_id: str,
        *,
        status: str | None = None,
        exit_code: int | None = None,
        started_at: float | None = None,
        ended_at: float | None = None,
        detail: Mapping[str, Any] | None = None,
    ) -> JobRecord:
        """Set the given fields (None leaves one as is); `detail` is merged key by key.

        Returns the updated record. Raises `NotFoundError` for an unknown job and `ValueError`
        for a status not in `JOB_STATUSES`.
        """
        if status is not None and status not in JOB_STATUSES:
            raise ValueError(f"job status {status!r} is not one of {', '.join(JOB_STATUSES)}")
        with self._write() as conn:
            row = conn.execute(JOB_BY_ID, (job_id,)).fetchone()
            if row is None:
                raise NotFoundError(f"no job {job_id!r}")
            merged = {**json_column(row[12]), **(detail or {})}
            conn.execute(
                """UPDATE jobs SET status = coalesce(?, status),
                    exit_code = coalesce(?, exit_code), started_at = coalesce(?, started_at),
                    ended_at = coalesce(?, ended_at), detail_json = ? WHERE id = ?""",
                (status, exit_code, started_at, ended_at, _dumps(merged), job_id),
            )
            row = conn.execute(JOB_BY_ID, (job_id,)).fetchone()
        return job_row(row)

    def finish_job(
        self,
        job_id: str,
        status: str,
        *,
        exit_code: int | None = None,
        detail: Mapping[str, Any] | None = None,
        ended_at: float | None = None,
    ) -> bool:
        """Record how the job ended, once: False (changing nothing) when it has ended already,
        so a later cleanup, a second reader or a late watcher never rewrites a final status.
        It ended at `ended_at` (when its nodes saw it end), kept between its start and now;
        None (or no finite number): now. Raises `NotFoundError` for an unknown job,
        `ValueError` for an unfinished `status`."""
        if status not in FINISHED_JOB_STATUSES:
            raise ValueError(f"{status!r} is not how a job ends")
        with self._write() as conn:
            row = conn.execute(JOB_BY_ID, (job_id,)).fetchone()
            if row is None:
                raise NotFoundError(f"no job {job_id!r}")
            if row[4] in FINISHED_JOB_STATUSES:
                return False
            merged = {**json_column(row[12]), **(detail or {})}
            now = self._clock()
            start = row[6] if row[6] is not None else row[5]  # started, else made
            ended = now
            if ended_at is not None and math.isfinite(ended_at):
                ended = min(now, max(start, ended_at))
            conn.execute(
                """UPDATE jobs SET status = ?, exit_code = coalesce(?, exit_code),
                    ended_at = ?, detail_json = ? WHERE id = ?""",
                (status, exit_code, ended, _dumps(merged), job_id),
            )
        return True

    # -- events -----------------------------------------------------------------------------

    def add_event(self, cluster: str, kind: str, message: str, *, job_id: str | None = None) -> int:
        """Append to the event log; returns the event's id."""
        with self._write() as conn:
            cur = conn.execute(
                "INSERT INTO events (ts, cluster, job_id, kind, message) VALUES (?, ?, ?, ?, ?)",
                (self._clock(), cluster, job_id, kind, message),
            )
            return int(cur.lastrowid or 0)

    def events(
        self, cluster: str | None = None, job_id: str | None = None, limit: int | None = 100
    ) -> list[EventRecord]:
        """The latest `limit` events (None: all) matching the filters, oldest first."""
        where, params = _filters(cluster=cluster, job_id=job_id)
        rows = self._read(
            "SELECT * FROM (SELECT id, ts, cluster, job_id, kind, message FROM events"
            f"{where} ORDER BY id DESC LIMIT ?) ORDER BY id",
            (*params, -1 if limit is None else limit),
        )
        return [EventRecord(*row) for row in rows]

    def event_log(
        self, name: str | None = None, *, after: int = 0, since: float | None = None
    ) -> list[EventRecord]:
        """Every event with an id above `after` and a time at or after `since`, oldest first; of
        `name` when given: a cluster's (its jobs' too) or a job's."""
        where = " WHERE id > ?"
        params: list[Any] = [after]
        if since is not None:
            where = f"{where} AND ts >= ?"
            params.append(since)
        if name is not None:
            where = f"{where} AND (cluster = ? OR job_id = ?)"
            params += [name, name]
        rows = self._read(f"SELECT {EVENT_COLS} FROM events{where} ORDER BY id", params)
        return [EventRecord(*row) for row in rows]

    # -- spans ------------------------------------------------------------------------------

    def spans(self, cluster: str | None = None, *, since: float | None = None) -> list[SpanRecord]:
        """The spans (of one cluster name, past clusters of that name included) still open or
        ended at or after `since`, oldest first."""
        return [_spans.record(row) for row in self._read(*_spans.select(cluster, since))]

    # -- intents ----------------------------------------------------------------------------

    def begin_intent(
        self, cluster: str, action: str, detail: Mapping[str, Any] | None = None
    ) -> int:
        """Record that a cloud mutation starts now; returns the intent's id."""
        with self._write() as conn:
            cur = conn.execute(
                "INSERT INTO intents (ts, cluster, action, detail_json) VALUES (?, ?, ?, ?)",
                (self._clock(), cluster, action, _dumps(detail or {})),
            )
            return int(cur.lastrowid or 0)

    def end_intent(self, intent_id: int, outcome: str) -> bool:
        """Close an open intent. Returns False (changing nothing) when it was already closed, so
        of two processes resolving one intent exactly one gets True. Raises `NotFoundError`."""
        with self._write() as conn:
            cur = conn.execute(
                "UPDATE intents SET closed_at = ?, outcome = ? WHERE id = ? AND closed_at IS NULL",
                (self._clock(), outcome, intent_id),
            )
            if cur.rowcount:
                return True
            if not conn.execute("SELECT 1 FROM intents WHERE id = ?", (intent_id,)).fetchone():
                raise NotFoundError(f"no intent {intent_id}")
            return False

    def open_intents(self, cluster: str | None = None) -> list[IntentRecord]:
        """Intents begun and never ended (a command died mid-way), oldest first."""
        where, params = _filters(cluster=cluster)
        where = f"{where} AND" if where else " WHERE"
        rows = self._read(
            f"SELECT {INTENT_COLS} FROM intents{where} closed_at IS NULL ORDER BY id", params
        )
        return [intent_row(row) for row in rows]

    @contextlib.contextmanager
    def intent(
        self, cluster: str, action: str, detail: Mapping[str, Any] | None = None
    ) -> Iterator[int]:
        """Begin an intent, yield its id, end it "ok" or "error: <Type>: <message>" (re-raised).

        Ctrl-C is recorded as an error too; only a killed process leaves the intent open.
        """
        intent_id = self.begin_intent(cluster, action, detail)
        try:
            yield intent_id
        except BaseException as exc:
            try:
                self.end_intent(intent_id, f"error: {type(exc).__name__}: {exc}"[:2000])
            except StateError:
                logger.warning("could not close intent %s", intent_id, exc_info=True)
            raise
        self.end_intent(intent_id, "ok")


def _use_wal(conn: sqlite3.Connection, path: Path) -> None:
    """Switch a new file to WAL (persistent). Processes racing to switch one file get SQLITE_BUSY
    at once, without the busy handler (it could deadlock), so retry until the busy timeout."""
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
        try:
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        except sqlite3.OperationalError as exc:
            if exc.sqlite_errorcode & 0xFF != sqlite3.SQLITE_BUSY or time.monotonic() > deadline:
                raise
            time.sleep(0.01)
            continue
        if mode != "wal":
            logger.warning("state file %s: WAL unavailable, journal mode %s", path, mode)
            return


def _migrate(conn: sqlite3.Connection, path: Path) -> None:
    """Bring the file to `SCHEMA_VERSION` in one transaction; refuse a newer file."""
    if conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION:
        return
    conn.execute("BEGIN IMMEDIATE")  # re-read under the lock: another process may have migrated
    try:
        version = int(conn.execute("PRAGMA user_version").fetchone()[0])
        if version > SCHEMA_VERSION:
            raise StateError(
                f"the state file {path} has schema version {version}, newer than this cloudtrain "
                f"knows (version {SCHEMA_VERSION}); upgrade cloudtrain"
            )
        for target in range(version + 1, SCHEMA_VERSION + 1):
            logger.info("migrating state file %s to schema version %d", path, target)
            for statement in _MIGRATIONS[target]:
                conn.execute(statement)
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


def _filters(**columns: str | None) -> tuple[str, list[str]]:
    used = {name: value for name, value in columns.items() if value is not None}
    where = " AND ".join(f"{name} = ?" for name in used)
    return (f" WHERE {where}" if where else "", list(used.values()))
