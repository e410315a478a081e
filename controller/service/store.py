"""The service's state: its jobs and their events, behind :class:`ServiceStore`.

The job's own record stays in the engine's :class:`controller.jobs.store.JobStore`; the
service keeps who asked for it (the tenant), its request and its state as the service sees
it (``queued``, then the engine's states), the events a client streams, and the git bundles
tenants uploaded. The service's job id is the engine's.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NotRequired, Protocol, TypedDict, final

from pydantic import BaseModel, ConfigDict

from controller.config.task import TaskSpec
from controller.jobs.records import ACTIVE
from controller.providers.scripted import CallsFile
from controller.repo.pin import PinRecord

QUEUED = "queued"
"""A job accepted by the service that no worker has started yet."""
RUNNING_STATES = ACTIVE
"""A job a worker holds (the engine's active states)."""
PENDING_STATES = RUNNING_STATES | {QUEUED}
"""What counts against a tenant's ``max_queued_jobs``; a bundle's file is kept while a job
in one of these states needs it."""


class StoredRequest(BaseModel):
    """A tenant's job request as the service keeps it with the job: what it sent (its task,
    its calls, its options) and what the service resolved (the repository's pin, or the
    bundle and its HEAD)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    task: TaskSpec
    calls: CallsFile | None = None
    """The scripted provider's calls; without them the operator's model is used."""
    include_local_changes: bool = False
    repo: str | None = None
    """The repository's real path (a job on a tenant's repository)."""
    pin: PinRecord | None = None
    """The repository as resolved at submit (absent in requests kept by older versions)."""
    bundle: str | None = None
    """The uploaded bundle's id (a job on a bundle)."""
    bundle_head: str | None = None
    rebase_of: str | None = None
    """The job whose diff this one carries onto the repository as it is now (a rebase)."""
    follow_of: str | None = None
    """The job whose result this one starts from (a follow-up)."""


@dataclass(frozen=True)
class JobRow:
    job_id: str
    tenant: str
    repo: str
    request: StoredRequest
    state: str
    created: float


@dataclass(frozen=True)
class Bundle:
    """A git bundle a tenant uploaded (``POST /v1/bundles``); its file is under the
    tenant's folder of the service's ``data_dir``."""

    bundle_id: str
    tenant: str
    head: str
    size: int
    created: float


@final
class ErrorData(TypedDict):
    """Why a job could not start (the event of its end state)."""

    code: str
    message: str


@final
class StateData(TypedDict):
    """A ``state`` event: the job's new state, why (``INTERRUPTED``), or its error."""

    state: str
    reason: NotRequired[str]
    error: NotRequired[ErrorData]


@final
class ToolCallData(TypedDict):
    """A ``tool_call`` event: one call of the job's tool loop."""

    turn: int
    id: str
    name: str
    ok: bool
    error_code: str | None
    verdict: NotRequired[str]
    """A ``run_check`` call's check verdict (``tests: failed, exit 1``)."""


@final
class CheckData(TypedDict):
    """A ``check`` event: one required check's result."""

    id: str
    status: str
    exit_code: int | None
    duration_ms: int


@final
class CheckOutputData(TypedDict):
    """A ``check_output`` event: lines of a running check's output, as they came."""

    check_id: str
    handle: str
    lines: list[str]
    dropped: int
    """Lines that came since the last such event and were not kept (the newest are)."""


EventData = StateData | ToolCallData | CheckData | CheckOutputData


@dataclass(frozen=True)
class Event:
    job_id: str
    seq: int
    type: str
    data: EventData

    def error(self) -> ErrorData | None:
        """The error of a ``state`` event that has one."""
        data = self.data
        # .get on a union of TypedDicts loses the type; ``in`` narrows it to StateData
        return data["error"] if "error" in data else None  # noqa: SIM401


class ServiceStore(Protocol):
    """The operations the service needs from its state."""

    def insert_job(self, row: JobRow) -> None: ...

    def update_state(self, job_id: str, state: str) -> None: ...

    def get_job(self, job_id: str) -> JobRow | None: ...

    def list_jobs(self, tenant: str) -> list[JobRow]: ...

    def jobs_in(self, states: frozenset[str]) -> list[JobRow]: ...

    def insert_job_within(self, row: JobRow, max_pending: int) -> bool: ...

    def next_queued(
        self, tenant: str, busy_repos: frozenset[str], *, bundles: bool = True
    ) -> JobRow | None: ...

    def append_event(self, job_id: str, type_: str, data: EventData) -> Event: ...

    def events_after(self, job_id: str, seq: int) -> list[Event]: ...

    def insert_bundle(self, bundle: Bundle) -> None: ...

    def get_bundle(self, bundle_id: str) -> Bundle | None: ...

    def delete_bundle(self, bundle_id: str) -> None: ...

    def bundles_before(self, created: float) -> list[Bundle]: ...

    def claim(self, job_id: str, owner: str, lease_until: float, max_running: int) -> bool: ...

    def renew(self, owner: str, lease_until: float) -> list[str]: ...

    def register(self, replica: ReplicaInfo) -> None: ...

    def replicas(self) -> list[ReplicaInfo]: ...

    def leases(self) -> list[Lease]: ...

    def take_over(self, job_id: str, old_owner: str | None, owner: str) -> bool: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Lease:
    """Who runs a job (a replica's ``HOST TOKEN``; None: a job started by a version without
    leases) and until when it has said so."""

    job_id: str
    owner: str | None
    until: float | None


@dataclass(frozen=True)
class ReplicaInfo:
    """What a replica tells the store each heartbeat: its name (``HOST TOKEN``), the
    repository roots it can see, its Docker engine and whether that answered, and until
    when this holds."""

    name: str
    roots: tuple[str, ...]
    engine: str
    engine_ok: bool
    until: float


SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    repo TEXT NOT NULL,
    request TEXT NOT NULL,
    state TEXT NOT NULL,
    created REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS jobs_tenant_state ON jobs (tenant, state, created);
CREATE TABLE IF NOT EXISTS events (
    job_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    type TEXT NOT NULL,
    data TEXT NOT NULL,
    PRIMARY KEY (job_id, seq)
);
CREATE TABLE IF NOT EXISTS bundles (
    id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    head TEXT NOT NULL,
    size INTEGER NOT NULL,
    created REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS replicas (
    name TEXT PRIMARY KEY,
    roots TEXT NOT NULL,
    engine TEXT NOT NULL,
    engine_ok INTEGER NOT NULL,
    until REAL NOT NULL
);
"""


class SqliteStore:
    """:class:`ServiceStore` in one SQLite file in WAL mode; one connection, serialised."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(SCHEMA)
        columns = {r[1] for r in self._db.execute("PRAGMA table_info(jobs)").fetchall()}
        if "owner" not in columns:  # a file made before leases: the two columns added
            self._db.execute("ALTER TABLE jobs ADD COLUMN owner TEXT")
            self._db.execute("ALTER TABLE jobs ADD COLUMN lease_until REAL")

    def _select(self, where: str, args: tuple[Any, ...]) -> list[JobRow]:
        sql = f"SELECT id, tenant, repo, request, state, created FROM jobs WHERE {where}"  # noqa: S608 - the clauses are this module's constants
        with self._lock:
            rows = self._db.execute(sql + " ORDER BY created, id", args).fetchall()
        return [row_of(r) for r in rows]

    def insert_job(self, row: JobRow) -> None:
        with self._lock:
            self._db.execute(
                f"INSERT INTO jobs ({COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)",  # noqa: S608 - constant
                job_values(row),
            )

    def update_state(self, job_id: str, state: str) -> None:
        with self._lock:
            self._db.execute("UPDATE jobs SET state = ? WHERE id = ?", (state, job_id))

    def get_job(self, job_id: str) -> JobRow | None:
        rows = self._select("id = ?", (job_id,))
        return rows[0] if rows else None

    def list_jobs(self, tenant: str) -> list[JobRow]:
        return self._select("tenant = ?", (tenant,))

    def jobs_in(self, states: frozenset[str]) -> list[JobRow]:
        marks = ", ".join("?" * len(states))
        return self._select(f"state IN ({marks})", tuple(sorted(states)))

    def insert_job_within(self, row: JobRow, max_pending: int) -> bool:
        """Inserts a queued ``row`` and its first event (``state: queued``) unless its
        tenant already has ``max_pending`` jobs queued or running: the count and the insert
        are one transaction (``BEGIN IMMEDIATE``), so requests that come at once cannot all
        pass. False when refused (nothing inserted)."""
        marks = ", ".join("?" * len(PENDING_STATES))
        sql = f"SELECT COUNT(*) FROM jobs WHERE tenant = ? AND state IN ({marks})"  # noqa: S608 - placeholders only
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                (count,) = self._db.execute(sql, (row.tenant, *sorted(PENDING_STATES))).fetchone()
                if int(count) >= max_pending:
                    self._db.execute("ROLLBACK")
                    return False
                self._db.execute(
                    f"INSERT INTO jobs ({COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)",  # noqa: S608 - constant
                    job_values(row, QUEUED),
                )
                self._db.execute(
                    "INSERT INTO events VALUES (?, 1, 'state', ?)",
                    (row.job_id, json.dumps({"state": QUEUED}, sort_keys=True)),
                )
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return True

    def next_queued(
        self, tenant: str, busy_repos: frozenset[str], *, bundles: bool = True
    ) -> JobRow | None:
        """The tenant's oldest queued job whose repository no running job holds; without
        ``bundles``, not a job on an uploaded bundle."""
        return first_startable(
            self._select("tenant = ? AND state = ?", (tenant, QUEUED)), busy_repos, bundles=bundles
        )

    def append_event(self, job_id: str, type_: str, data: EventData) -> Event:
        text = json.dumps(data, sort_keys=True)
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                (last,) = self._db.execute(
                    "SELECT COALESCE(MAX(seq), 0) FROM events WHERE job_id = ?", (job_id,)
                ).fetchone()
                seq = int(last) + 1
                self._db.execute(
                    "INSERT INTO events VALUES (?, ?, ?, ?)", (job_id, seq, type_, text)
                )
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return Event(job_id, seq, type_, data)

    def events_after(self, job_id: str, seq: int) -> list[Event]:
        with self._lock:
            rows = self._db.execute(
                "SELECT seq, type, data FROM events WHERE job_id = ? AND seq > ? ORDER BY seq",
                (job_id, seq),
            ).fetchall()
        return [Event(job_id, int(s), t, json.loads(d)) for s, t, d in rows]

    def insert_bundle(self, bundle: Bundle) -> None:
        with self._lock:
            self._db.execute(
                "INSERT INTO bundles VALUES (?, ?, ?, ?, ?)",
                (bundle.bundle_id, bundle.tenant, bundle.head, bundle.size, bundle.created),
            )

    def _bundles(self, where: str, args: tuple[Any, ...]) -> list[Bundle]:
        sql = f"SELECT id, tenant, head, size, created FROM bundles WHERE {where}"  # noqa: S608 - the clauses are this module's constants
        with self._lock:
            rows = self._db.execute(sql + " ORDER BY created, id", args).fetchall()
        return [Bundle(i, t, h, int(n), float(c)) for i, t, h, n, c in rows]

    def get_bundle(self, bundle_id: str) -> Bundle | None:
        rows = self._bundles("id = ?", (bundle_id,))
        return rows[0] if rows else None

    def delete_bundle(self, bundle_id: str) -> None:
        with self._lock:
            self._db.execute("DELETE FROM bundles WHERE id = ?", (bundle_id,))

    def bundles_before(self, created: float) -> list[Bundle]:
        return self._bundles("created < ?", (created,))

    def claim(self, job_id: str, owner: str, lease_until: float, max_running: int) -> bool:
        """Moves a queued job to ``created`` for ``owner`` until ``lease_until``, when its
        tenant runs fewer than ``max_running`` jobs and no job runs on its repository: all
        decided in one transaction. False when not (nothing changed)."""
        running = tuple(sorted(RUNNING_STATES))
        marks = ", ".join("?" * len(running))
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                found = self._db.execute(
                    "SELECT tenant, repo FROM jobs WHERE id = ? AND state = ?", (job_id, QUEUED)
                ).fetchone()
                ok = found is not None
                if ok:
                    tenant, repo = found
                    count_sql = f"SELECT COUNT(*) FROM jobs WHERE tenant = ? AND state IN ({marks})"  # noqa: S608 - placeholders only
                    busy_sql = f"SELECT COUNT(*) FROM jobs WHERE repo = ? AND state IN ({marks})"  # noqa: S608 - placeholders only
                    (count,) = self._db.execute(count_sql, (tenant, *running)).fetchone()
                    (busy,) = self._db.execute(busy_sql, (repo, *running)).fetchone()
                    ok = int(count) < max_running and int(busy) == 0
                if ok:
                    self._db.execute(
                        "UPDATE jobs SET state = 'created', owner = ?, lease_until = ?"
                        " WHERE id = ?",
                        (owner, lease_until, job_id),
                    )
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return ok

    def renew(self, owner: str, lease_until: float) -> list[str]:
        """Renews the leases ``owner`` holds; returns their jobs (a job missing from them
        is no longer the owner's: another replica took it over)."""
        running = tuple(sorted(RUNNING_STATES))
        marks = ", ".join("?" * len(running))
        sql = f"UPDATE jobs SET lease_until = ? WHERE owner = ? AND state IN ({marks}) RETURNING id"  # noqa: S608 - placeholders only
        with self._lock:
            return sorted(r[0] for r in self._db.execute(sql, (lease_until, owner, *running)))

    def register(self, replica: ReplicaInfo) -> None:
        values = (replica.name, json.dumps(replica.roots), replica.engine, int(replica.engine_ok))
        with self._lock:
            self._db.execute(
                "INSERT INTO replicas VALUES (?, ?, ?, ?, ?) ON CONFLICT (name) DO UPDATE SET"
                " roots = excluded.roots, engine = excluded.engine,"
                " engine_ok = excluded.engine_ok, until = excluded.until",
                (*values, replica.until),
            )
            self._db.execute("DELETE FROM replicas WHERE until < ?", (now() - 86400,))

    def replicas(self) -> list[ReplicaInfo]:
        with self._lock:
            rows = self._db.execute("SELECT * FROM replicas ORDER BY name").fetchall()
        return [replica_of(r) for r in rows]

    def leases(self) -> list[Lease]:
        """The running jobs' leases."""
        running = tuple(sorted(RUNNING_STATES))
        marks = ", ".join("?" * len(running))
        sql = f"SELECT id, owner, lease_until FROM jobs WHERE state IN ({marks}) ORDER BY id"  # noqa: S608 - placeholders only
        with self._lock:
            rows = self._db.execute(sql, running).fetchall()
        return [Lease(i, o, None if u is None else float(u)) for i, o, u in rows]

    def take_over(self, job_id: str, old_owner: str | None, owner: str) -> bool:
        """Makes ``owner`` the job's owner if ``old_owner`` still is: one replica of those
        that found the lease run out wins."""
        with self._lock:
            cursor = self._db.execute(
                "UPDATE jobs SET owner = ? WHERE id = ? AND owner IS ?", (owner, job_id, old_owner)
            )
        return cursor.rowcount == 1

    def close(self) -> None:
        with self._lock:
            self._db.close()


COLUMNS = "id, tenant, repo, request, state, created"


def job_values(row: JobRow, state: str | None = None) -> tuple[str, str, str, str, str, float]:
    """``row`` as the ``jobs`` table's :data:`COLUMNS` hold it (with ``state`` when given)."""
    request = row.request.model_dump_json(exclude_none=True)
    return (row.job_id, row.tenant, row.repo, request, state or row.state, row.created)


def first_startable(
    queued: list[JobRow], busy_repos: frozenset[str], *, bundles: bool
) -> JobRow | None:
    """The first of ``queued`` (oldest first) on a repository no running job holds; without
    ``bundles``, not a job on an uploaded bundle."""
    for row in queued:
        if row.repo not in busy_repos and (bundles or not row.request.bundle):
            return row
    return None


def row_of(values: tuple[Any, ...]) -> JobRow:
    """A job read back from the ``jobs`` table's :data:`COLUMNS`."""
    job_id, tenant, repo, request, state, created = values
    return JobRow(
        job_id, tenant, repo, StoredRequest.model_validate_json(request), state, float(created)
    )


def replica_of(values: tuple[Any, ...]) -> ReplicaInfo:
    """A replica read back from the ``replicas`` table."""
    name, roots, engine, engine_ok, until = values
    return ReplicaInfo(name, tuple(json.loads(roots)), engine, bool(engine_ok), float(until))


def now() -> float:
    return time.time()
