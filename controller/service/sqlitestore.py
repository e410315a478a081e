""":class:`~controller.service.store.ServiceStore` in one SQLite file (``state = "sqlite"``,
the default): embedded, one process, one connection serialised under a lock."""

from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path
from typing import Any

from controller.service.store import (
    COLUMNS,
    PENDING_STATES,
    QUEUED,
    RUNNING_STATES,
    Bundle,
    Event,
    EventData,
    JobRow,
    Lease,
    Quota,
    ReplicaInfo,
    first_startable,
    job_values,
    now,
    replica_of,
    row_of,
)

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


USAGE = "SELECT COUNT(*), COALESCE(SUM(containers), 0), COALESCE(SUM(clone), 0) FROM jobs"
"""A tenant's running jobs: how many, the containers and the clones they hold."""


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
        if "containers" not in columns:  # what a running job holds of its tenant's quotas
            self._db.execute("ALTER TABLE jobs ADD COLUMN containers INTEGER NOT NULL DEFAULT 1")
            self._db.execute("ALTER TABLE jobs ADD COLUMN clone INTEGER NOT NULL DEFAULT 0")

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

    def claim(self, job_id: str, owner: str, lease_until: float, quota: Quota) -> bool:
        """Moves a queued job to ``created`` for ``owner`` until ``lease_until``, when its
        tenant's running jobs leave room in ``quota`` and no job runs on its repository: all
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
                    count_sql = f"{USAGE} WHERE tenant = ? AND state IN ({marks})"
                    busy_sql = f"SELECT COUNT(*) FROM jobs WHERE repo = ? AND state IN ({marks})"  # noqa: S608 - placeholders only
                    count, held, clones = self._db.execute(count_sql, (tenant, *running)).fetchone()
                    (busy,) = self._db.execute(busy_sql, (repo, *running)).fetchone()
                    ok = quota.allows(int(count), int(held), int(clones)) and int(busy) == 0
                if ok:
                    self._db.execute(
                        "UPDATE jobs SET state = 'created', owner = ?, lease_until = ?,"
                        " containers = ?, clone = ? WHERE id = ?",
                        (owner, lease_until, quota.containers, int(quota.clone), job_id),
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
