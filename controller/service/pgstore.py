""":class:`~controller.service.store.ServiceStore` on PostgreSQL (``state = "postgres"``),
through psycopg 3: one database that several ``patchbox serve`` processes can share.

The schema is versioned: :data:`MIGRATIONS` are applied in order at start, each once, under
a transaction-scoped advisory lock, so replicas that start together apply them once. A
tenant's pending-job count and the insert that depends on it are one transaction holding a
lock on the tenant (an advisory lock on its name), so requests that reach different
replicas at once cannot all pass ``max_queued_jobs``; a job's next event number is chosen
under a lock on the job, so no two writers give one number twice."""

from __future__ import annotations

import json
import threading
from typing import Any

import psycopg

from controller.errors import NotReadyError
from controller.service.store import (
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

MIGRATIONS: list[str] = [
    """
    CREATE TABLE jobs (
        id TEXT PRIMARY KEY,
        tenant TEXT NOT NULL,
        repo TEXT NOT NULL,
        request TEXT NOT NULL,
        state TEXT NOT NULL,
        created DOUBLE PRECISION NOT NULL
    );
    CREATE INDEX jobs_tenant_state ON jobs (tenant, state, created);
    CREATE TABLE events (
        job_id TEXT NOT NULL,
        seq INTEGER NOT NULL,
        type TEXT NOT NULL,
        data TEXT NOT NULL,
        PRIMARY KEY (job_id, seq)
    );
    CREATE TABLE bundles (
        id TEXT PRIMARY KEY,
        tenant TEXT NOT NULL,
        head TEXT NOT NULL,
        size BIGINT NOT NULL,
        created DOUBLE PRECISION NOT NULL
    );
    """,
    """
    ALTER TABLE jobs ADD COLUMN owner TEXT, ADD COLUMN lease_until DOUBLE PRECISION;
    CREATE INDEX jobs_repo_state ON jobs (repo, state);
    """,
    """
    CREATE TABLE replicas (
        name TEXT PRIMARY KEY,
        roots TEXT NOT NULL,
        engine TEXT NOT NULL,
        engine_ok BOOLEAN NOT NULL,
        until DOUBLE PRECISION NOT NULL
    );
    """,
    """
    ALTER TABLE jobs ADD COLUMN containers INTEGER NOT NULL DEFAULT 1,
        ADD COLUMN clone BOOLEAN NOT NULL DEFAULT false;
    """,
]
"""The schema, one step per version (version N is ``MIGRATIONS[N - 1]``); a step is never
changed once released, a new one is appended."""

MIGRATION_LOCK = 0x70627831
"""The advisory lock the migrations are applied under (any number; patchbox's own)."""

_COLUMNS = "id, tenant, repo, request, state, created"
INSERT_JOB = (
    "INSERT INTO jobs (id, tenant, repo, request, state, created) VALUES (%s, %s, %s, %s, %s, %s)"
)
LOCK_ON = "SELECT pg_advisory_xact_lock(hashtext(%s))"
"""A lock on a name (``tenant:NAME``, ``job:ID``) until the transaction ends."""


class PostgresStore:
    """:class:`ServiceStore` in a PostgreSQL database named by ``dsn``
    (``postgresql://...``); one connection, serialised within the process."""

    def __init__(self, dsn: str, *, connect_timeout: int = 10) -> None:
        self._lock = threading.Lock()
        try:
            self._db = psycopg.connect(dsn, autocommit=True, connect_timeout=connect_timeout)
        except psycopg.OperationalError as exc:
            msg = f"the service's database cannot be reached: {str(exc).strip()[:300]}"
            raise NotReadyError(msg) from exc
        self.migrate()

    def migrate(self) -> int:
        """Applies the steps of :data:`MIGRATIONS` the database does not have yet; returns
        the schema's version."""
        with self._lock, self._db.transaction():
            self._db.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations ("
                " version INTEGER PRIMARY KEY, applied DOUBLE PRECISION NOT NULL)"
            )
            row = self._db.execute("SELECT COALESCE(MAX(version), 0) FROM schema_migrations")
            current = int(_one(row.fetchone()))
            for version in range(current + 1, len(MIGRATIONS) + 1):
                self._db.execute(MIGRATIONS[version - 1].encode())
                self._db.execute(
                    "INSERT INTO schema_migrations VALUES (%s, EXTRACT(EPOCH FROM now()))",
                    (version,),
                )
        return len(MIGRATIONS)

    def _select(self, where: str, args: tuple[Any, ...]) -> list[JobRow]:
        sql = f"SELECT {_COLUMNS} FROM jobs WHERE {where} ORDER BY created, id"  # noqa: S608 - the clauses are this module's constants
        with self._lock:
            rows = self._db.execute(sql.encode(), args).fetchall()
        return [row_of(tuple(r)) for r in rows]

    def insert_job(self, row: JobRow) -> None:
        with self._lock:
            self._db.execute(INSERT_JOB, job_values(row))

    def update_state(self, job_id: str, state: str) -> None:
        with self._lock:
            self._db.execute("UPDATE jobs SET state = %s WHERE id = %s", (state, job_id))

    def get_job(self, job_id: str) -> JobRow | None:
        rows = self._select("id = %s", (job_id,))
        return rows[0] if rows else None

    def list_jobs(self, tenant: str) -> list[JobRow]:
        return self._select("tenant = %s", (tenant,))

    def jobs_in(self, states: frozenset[str]) -> list[JobRow]:
        return self._select("state = ANY(%s)", (sorted(states),))

    def insert_job_within(self, row: JobRow, max_pending: int) -> bool:
        """Inserts a queued ``row`` and its first event (``state: queued``) unless its
        tenant already has ``max_pending`` jobs queued or running, in one transaction under
        the tenant's lock. False when refused (nothing inserted)."""
        with self._lock, self._db.transaction():
            self._db.execute(LOCK_ON, ("tenant:" + row.tenant,))
            count = _one(
                self._db.execute(
                    "SELECT COUNT(*) FROM jobs WHERE tenant = %s AND state = ANY(%s)",
                    (row.tenant, sorted(PENDING_STATES)),
                ).fetchone()
            )
            if int(count) >= max_pending:
                return False
            self._db.execute(INSERT_JOB, job_values(row, QUEUED))
            self._db.execute(
                "INSERT INTO events VALUES (%s, 1, 'state', %s)",
                (row.job_id, json.dumps({"state": QUEUED}, sort_keys=True)),
            )
        return True

    def next_queued(
        self, tenant: str, busy_repos: frozenset[str], *, bundles: bool = True
    ) -> JobRow | None:
        """The tenant's oldest queued job whose repository no running job holds; without
        ``bundles``, not a job on an uploaded bundle."""
        return first_startable(
            self._select("tenant = %s AND state = %s", (tenant, QUEUED)),
            busy_repos,
            bundles=bundles,
        )

    def append_event(self, job_id: str, type_: str, data: EventData) -> Event:
        text = json.dumps(data, sort_keys=True)
        with self._lock, self._db.transaction():
            self._db.execute(LOCK_ON, ("job:" + job_id,))
            last = _one(
                self._db.execute(
                    "SELECT COALESCE(MAX(seq), 0) FROM events WHERE job_id = %s", (job_id,)
                ).fetchone()
            )
            seq = int(last) + 1
            self._db.execute(
                "INSERT INTO events VALUES (%s, %s, %s, %s)", (job_id, seq, type_, text)
            )
        return Event(job_id, seq, type_, data)

    def events_after(self, job_id: str, seq: int) -> list[Event]:
        with self._lock:
            rows = self._db.execute(
                "SELECT seq, type, data FROM events WHERE job_id = %s AND seq > %s ORDER BY seq",
                (job_id, seq),
            ).fetchall()
        return [Event(job_id, int(s), t, json.loads(d)) for s, t, d in rows]

    def insert_bundle(self, bundle: Bundle) -> None:
        with self._lock:
            self._db.execute(
                "INSERT INTO bundles VALUES (%s, %s, %s, %s, %s)",
                (bundle.bundle_id, bundle.tenant, bundle.head, bundle.size, bundle.created),
            )

    def _bundles(self, where: str, args: tuple[Any, ...]) -> list[Bundle]:
        columns = "id, tenant, head, size, created"
        sql = f"SELECT {columns} FROM bundles WHERE {where} ORDER BY created, id"  # noqa: S608 - the clauses are this module's constants
        with self._lock:
            rows = self._db.execute(sql.encode(), args).fetchall()
        return [Bundle(i, t, h, int(n), float(c)) for i, t, h, n, c in rows]

    def get_bundle(self, bundle_id: str) -> Bundle | None:
        rows = self._bundles("id = %s", (bundle_id,))
        return rows[0] if rows else None

    def delete_bundle(self, bundle_id: str) -> None:
        with self._lock:
            self._db.execute("DELETE FROM bundles WHERE id = %s", (bundle_id,))

    def bundles_before(self, created: float) -> list[Bundle]:
        return self._bundles("created < %s", (created,))

    def claim(self, job_id: str, owner: str, lease_until: float, quota: Quota) -> bool:
        """Moves a queued job to ``created`` for ``owner`` until ``lease_until``, when its
        tenant's running jobs leave room in ``quota`` and no job runs on its repository, in
        one transaction under the tenant's and the repository's locks (taken in that order
        by every replica). False when not (nothing changed)."""
        running = sorted(RUNNING_STATES)
        with self._lock, self._db.transaction():
            found = self._db.execute(
                "SELECT tenant, repo FROM jobs WHERE id = %s AND state = %s", (job_id, QUEUED)
            ).fetchone()
            if found is None:
                return False
            tenant, repo = found
            self._db.execute(LOCK_ON, ("tenant:" + tenant,))
            self._db.execute(LOCK_ON, ("repo:" + repo,))
            usage = self._db.execute(
                "SELECT COUNT(*), COALESCE(SUM(containers), 0), COUNT(*) FILTER (WHERE clone)"
                " FROM jobs WHERE tenant = %s AND state = ANY(%s)",
                (tenant, running),
            ).fetchone()
            assert usage is not None  # noqa: S101 - an aggregate always answers one row
            count, held, clones = (int(v) for v in usage)
            busy = _one(
                self._db.execute(
                    "SELECT COUNT(*) FROM jobs WHERE repo = %s AND state = ANY(%s)", (repo, running)
                ).fetchone()
            )
            if not quota.allows(count, held, clones) or int(busy) > 0:
                return False
            moved = self._db.execute(
                "UPDATE jobs SET state = 'created', owner = %s, lease_until = %s,"
                " containers = %s, clone = %s WHERE id = %s AND state = %s",
                (owner, lease_until, quota.containers, quota.clone, job_id, QUEUED),
            )
            return moved.rowcount == 1

    def renew(self, owner: str, lease_until: float) -> list[str]:
        """Renews the leases ``owner`` holds; returns their jobs (a job missing from them
        is no longer the owner's: another replica took it over)."""
        with self._lock:
            rows = self._db.execute(
                "UPDATE jobs SET lease_until = %s WHERE owner = %s AND state = ANY(%s)"
                " RETURNING id",
                (lease_until, owner, sorted(RUNNING_STATES)),
            ).fetchall()
        return sorted(r[0] for r in rows)

    def register(self, replica: ReplicaInfo) -> None:
        values = (replica.name, json.dumps(replica.roots), replica.engine, replica.engine_ok)
        with self._lock, self._db.transaction():
            self._db.execute(
                "INSERT INTO replicas VALUES (%s, %s, %s, %s, %s) ON CONFLICT (name) DO UPDATE"
                " SET roots = excluded.roots, engine = excluded.engine,"
                " engine_ok = excluded.engine_ok, until = excluded.until",
                (*values, replica.until),
            )
            self._db.execute("DELETE FROM replicas WHERE until < %s", (now() - 86400,))

    def replicas(self) -> list[ReplicaInfo]:
        with self._lock:
            rows = self._db.execute("SELECT * FROM replicas ORDER BY name").fetchall()
        return [replica_of(r) for r in rows]

    def leases(self) -> list[Lease]:
        """The running jobs' leases."""
        with self._lock:
            rows = self._db.execute(
                "SELECT id, owner, lease_until FROM jobs WHERE state = ANY(%s) ORDER BY id",
                (sorted(RUNNING_STATES),),
            ).fetchall()
        return [Lease(i, o, None if u is None else float(u)) for i, o, u in rows]

    def take_over(self, job_id: str, old_owner: str | None, owner: str) -> bool:
        """Makes ``owner`` the job's owner if ``old_owner`` still is: one replica of those
        that found the lease run out wins."""
        with self._lock:
            moved = self._db.execute(
                "UPDATE jobs SET owner = %s WHERE id = %s AND owner IS NOT DISTINCT FROM %s",
                (owner, job_id, old_owner),
            )
        return moved.rowcount == 1

    def close(self) -> None:
        with self._lock:
            self._db.close()


def _one(row: tuple[Any, ...] | None) -> Any:
    assert row is not None  # noqa: S101 - an aggregate always answers one row
    return row[0]
