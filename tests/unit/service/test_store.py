"""The service's store, one contract for both backends: SQLite (a file) and PostgreSQL (a
real server, a throwaway cluster on loopback). Jobs, their events in order, bundles, the
queue's order, and the tenant's pending-job quota held when many writers (separate
connections, as separate replicas are) insert at once."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from controller.service.pgstore import MIGRATIONS, PostgresStore
from controller.service.sqlitestore import SqliteStore
from controller.service.store import Bundle, JobRow, Quota, ReplicaInfo, ServiceStore
from tests.support.postgres import Cluster
from tests.support.service import stored

T = 1_765_000_000.0


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """``(kind, where)``: a SQLite file, or a new database of the session's cluster."""
    if request.param == "sqlite":
        yield "sqlite", str(tmp_path / "service.db")
    else:
        cluster: Cluster = request.getfixturevalue("postgres_cluster")
        yield "postgres", cluster.database()


def _open(backend: tuple[str, str]) -> ServiceStore:
    kind, where = backend
    return SqliteStore(Path(where)) if kind == "sqlite" else PostgresStore(where)


@pytest.fixture
def store(backend: tuple[str, str]) -> Iterator[ServiceStore]:
    opened = _open(backend)
    yield opened
    opened.close()


def _row(job_id: str, tenant: str = "alpha", repo: str = "/r/a", n: int = 0, **req: str) -> JobRow:
    return JobRow(job_id, tenant, repo, stored(**req), "queued", T + n)


def test_jobs_are_kept_listed_and_moved(store: ServiceStore) -> None:
    store.insert_job(_row("20260101-000000-aaaa0001", n=2))
    store.insert_job(_row("20260101-000000-aaaa0002", n=1, bundle="b1"))
    store.insert_job(_row("20260101-000000-bbbb0001", tenant="beta"))
    got = store.get_job("20260101-000000-aaaa0001")
    assert got is not None
    assert (got.tenant, got.repo, got.state, got.created) == ("alpha", "/r/a", "queued", T + 2)
    assert got.request == stored()
    assert store.get_job("20260101-000000-none0001") is None
    assert [r.job_id for r in store.list_jobs("alpha")] == [
        "20260101-000000-aaaa0002",
        "20260101-000000-aaaa0001",
    ]
    store.update_state("20260101-000000-aaaa0002", "running")
    assert [r.job_id for r in store.jobs_in(frozenset({"running"}))] == ["20260101-000000-aaaa0002"]
    queued = store.next_queued("alpha", frozenset())
    assert queued is not None
    assert queued.job_id == "20260101-000000-aaaa0001"
    assert store.next_queued("alpha", frozenset({"/r/a"})) is None
    store.insert_job(_row("20260101-000000-aaaa0003", n=3, bundle="b2"))
    only_repos = store.next_queued("alpha", frozenset({"/r/a"}), bundles=False)
    assert only_repos is None


def test_events_are_numbered_in_order_and_read_after_a_mark(store: ServiceStore) -> None:
    assert store.insert_job_within(_row("20260101-000000-aaaa0001"), max_pending=5)
    first = store.events_after("20260101-000000-aaaa0001", 0)
    assert [(e.seq, e.type, e.data) for e in first] == [(1, "state", {"state": "queued"})]
    for state in ("preparing", "running"):
        store.append_event("20260101-000000-aaaa0001", "state", {"state": state})
    after = store.events_after("20260101-000000-aaaa0001", 1)
    assert [(e.seq, e.data) for e in after] == [
        (2, {"state": "preparing"}),
        (3, {"state": "running"}),
    ]


def test_bundles_are_kept_found_and_dropped(store: ServiceStore) -> None:
    store.insert_bundle(Bundle("b1", "alpha", "a" * 40, 1234, T))
    store.insert_bundle(Bundle("b2", "alpha", "b" * 40, 99, T + 10))
    assert store.get_bundle("b1") == Bundle("b1", "alpha", "a" * 40, 1234, T)
    assert [b.bundle_id for b in store.bundles_before(T + 5)] == ["b1"]
    store.delete_bundle("b1")
    assert store.get_bundle("b1") is None


def test_a_tenants_quota_holds_across_writers_at_once(backend: tuple[str, str]) -> None:
    """Eight writers (each its own connection, as replicas are) insert 40 jobs at once for
    one tenant with a quota of 10: exactly 10 are queued, each with its first event."""
    writers = [_open(backend) for _ in range(8)]
    accepted: list[bool] = []
    lock = threading.Lock()

    def write(index: int) -> None:
        for k in range(5):
            ok = writers[index].insert_job_within(
                _row(f"20260101-000000-{index:04d}{k:04d}", n=index * 10 + k), max_pending=10
            )
            with lock:
                accepted.append(ok)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert (accepted.count(True), accepted.count(False)) == (10, 30)
    rows = writers[0].list_jobs("alpha")
    assert len(rows) == 10
    for row in rows:
        assert [e.seq for e in writers[0].events_after(row.job_id, 0)] == [1]
    for w in writers:
        w.close()


def test_events_from_many_writers_get_distinct_numbers(backend: tuple[str, str]) -> None:
    writers = [_open(backend) for _ in range(4)]
    assert writers[0].insert_job_within(_row("20260101-000000-aaaa0001"), max_pending=5)

    def write(index: int) -> None:
        for k in range(10):
            state = f"w{index}-{k}"
            writers[index].append_event("20260101-000000-aaaa0001", "state", {"state": state})

    threads = [threading.Thread(target=write, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    events = writers[1].events_after("20260101-000000-aaaa0001", 0)
    assert [e.seq for e in events] == list(range(1, 42))
    assert len({e.data.get("state") for e in events}) == 41  # none overwritten
    for w in writers:
        w.close()


@pytest.mark.usefixtures("postgres_cluster")
def test_postgres_migrations_are_versioned_and_applied_once(postgres_cluster: Cluster) -> None:
    dsn = postgres_cluster.database()
    stores = [PostgresStore(dsn) for _ in range(3)]  # three replicas starting on one database
    with psycopg.connect(dsn) as conn:
        versions = conn.execute("SELECT version FROM schema_migrations ORDER BY version").fetchall()
    assert [v for (v,) in versions] == list(range(1, len(MIGRATIONS) + 1))
    assert stores[0].migrate() == len(MIGRATIONS)
    for s in stores:
        s.close()


def test_an_unreachable_database_is_not_ready(postgres_cluster: Cluster) -> None:
    from controller.errors import ErrorCode, PatchboxError

    wrong = f"postgresql://patchbox@127.0.0.1:{postgres_cluster.port}/no_such_database"
    with pytest.raises(PatchboxError) as info:
        PostgresStore(wrong, connect_timeout=5)
    assert info.value.code is ErrorCode.ENVIRONMENT_NOT_READY
    assert "no_such_database" in info.value.message


def test_postgres_counts_a_tenants_jobs_under_the_tenants_lock(postgres_cluster: Cluster) -> None:
    """Another replica holding the tenant's lock (and queueing a job under it) makes this
    replica's insert wait, then count that job: the quota is decided in the database."""
    dsn = postgres_cluster.database()
    store = PostgresStore(dsn)
    other = psycopg.connect(dsn)
    other.execute("SELECT pg_advisory_xact_lock(hashtext('tenant:alpha'))")
    result: list[bool] = []
    waiting = threading.Thread(
        target=lambda: result.append(
            store.insert_job_within(_row("20260101-000000-aaaa0002"), max_pending=1)
        )
    )
    waiting.start()
    waiting.join(timeout=1.0)
    assert waiting.is_alive(), "the insert did not wait for the tenant's lock"
    other.execute(
        "INSERT INTO jobs VALUES (%s, 'alpha', '/r/x', %s, 'queued', %s)",
        ("20260101-000000-aaaa0001", stored().model_dump_json(), T),
    )
    other.commit()
    waiting.join(timeout=10)
    assert result == [False]
    assert [r.job_id for r in store.list_jobs("alpha")] == ["20260101-000000-aaaa0001"]
    other.close()
    store.close()


def test_a_claim_is_decided_in_the_database(store: ServiceStore) -> None:
    """A queued job is claimed once; the tenant's running limit and the one job per
    repository hold whoever claims; a lease is renewed by its owner and taken over by one
    replica only."""
    for n, (job_id, repo) in enumerate(
        [
            ("20260101-000000-aaaa0001", "/r/a"),
            ("20260101-000000-aaaa0002", "/r/a"),
            ("20260101-000000-aaaa0003", "/r/b"),
            ("20260101-000000-aaaa0004", "/r/c"),
        ]
    ):
        store.insert_job(_row(job_id, repo=repo, n=n))
    assert store.claim("20260101-000000-aaaa0001", "h one", T + 30, Quota(2))
    assert not store.claim("20260101-000000-aaaa0001", "h two", T + 30, Quota(2))
    assert not store.claim("20260101-000000-aaaa0002", "h two", T + 30, Quota(2))  # /r/a
    assert store.claim("20260101-000000-aaaa0003", "h two", T + 30, Quota(2))
    assert not store.claim("20260101-000000-aaaa0004", "h two", T + 30, Quota(2))  # limit
    claimed = store.get_job("20260101-000000-aaaa0001")
    assert claimed is not None
    assert claimed.state == "created"
    store.update_state("20260101-000000-aaaa0003", "running")
    assert store.renew("h two", T + 90) == ["20260101-000000-aaaa0003"]
    leases = {lease.job_id: (lease.owner, lease.until) for lease in store.leases()}
    assert leases == {
        "20260101-000000-aaaa0001": ("h one", T + 30),
        "20260101-000000-aaaa0003": ("h two", T + 90),
    }
    assert store.take_over("20260101-000000-aaaa0001", "h one", "h two")
    assert not store.take_over("20260101-000000-aaaa0001", "h one", "h three")  # one wins
    store.update_state("20260101-000000-aaaa0001", "failed")
    assert store.claim("20260101-000000-aaaa0002", "h three", T + 30, Quota(2))
    assert [lease.job_id for lease in store.leases()] == [
        "20260101-000000-aaaa0002",
        "20260101-000000-aaaa0003",
    ]


def test_many_replicas_claiming_at_once_run_each_job_once(backend: tuple[str, str]) -> None:
    """Six writers race to claim 12 queued jobs on 12 repositories with a running limit of
    4: 4 claims succeed, each job at most once."""
    first = _open(backend)
    for n in range(12):
        first.insert_job(_row(f"20260101-000000-cccc{n:04d}", repo=f"/r/{n}", n=n))
    writers = [_open(backend) for _ in range(6)]
    won: list[tuple[int, str]] = []
    lock = threading.Lock()

    def race(index: int) -> None:
        for n in range(12):
            job_id = f"20260101-000000-cccc{n:04d}"
            if writers[index].claim(job_id, f"h w{index}", T + 30, Quota(4)):
                with lock:
                    won.append((index, job_id))

    threads = [threading.Thread(target=race, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 4
    assert len({job_id for _, job_id in won}) == 4
    for w in [first, *writers]:
        w.close()


def test_a_lease_taken_over_is_no_longer_renewed_by_its_old_owner(store: ServiceStore) -> None:
    """What fences a replica off a job: once another replica took the job over, the old
    owner's renewal no longer names it."""
    store.insert_job(_row("20260101-000000-dddd0001"))
    assert store.claim("20260101-000000-dddd0001", "h one", T + 30, Quota(1))
    assert store.renew("h one", T + 40) == ["20260101-000000-dddd0001"]
    assert store.take_over("20260101-000000-dddd0001", "h one", "h two")
    assert store.renew("h one", T + 50) == []
    assert store.renew("h two", T + 50) == ["20260101-000000-dddd0001"]


def test_replicas_tell_the_store_their_roots_and_engine(store: ServiceStore) -> None:
    """Each replica's latest word is kept, one row per replica; a replica silent for a day
    is forgotten."""
    now = time.time()
    store.register(
        ReplicaInfo(
            "h old", ("/srv/a",), "unix:///run/old.sock", engine_ok=True, until=now - 90_000
        )
    )
    store.register(
        ReplicaInfo("h one", ("/srv/a",), "unix:///run/one.sock", engine_ok=True, until=now + 30)
    )
    store.register(
        ReplicaInfo("h two", ("/srv/a", "/srv/b"), "tcp://10.0.0.2:2375", engine_ok=True, until=now)
    )
    store.register(
        ReplicaInfo("h one", ("/srv/a",), "unix:///run/one.sock", engine_ok=False, until=now + 60)
    )
    assert store.replicas() == [
        ReplicaInfo("h one", ("/srv/a",), "unix:///run/one.sock", engine_ok=False, until=now + 60),
        ReplicaInfo(
            "h two", ("/srv/a", "/srv/b"), "tcp://10.0.0.2:2375", engine_ok=True, until=now
        ),
    ]


def test_a_claim_holds_the_tenants_containers_and_clones(store: ServiceStore) -> None:
    """``max_sandboxes`` and ``max_clones`` decided in the database, like the running
    limit: what running jobs hold is counted whoever claimed them."""
    ids = [f"20260101-000000-bcbc000{n}" for n in range(6)]
    for n, job_id in enumerate(ids):
        store.insert_job(_row(job_id, repo=f"/r/{n}", n=n))
    two = Quota(9, containers=2, max_containers=3)
    one = Quota(9, containers=1, max_containers=3)
    clone = Quota(9, clone=True, max_clones=1)
    assert store.claim(ids[0], "h one", T + 30, two)
    assert not store.claim(ids[1], "h two", T + 30, two)  # 2 + 2 > 3
    assert store.claim(ids[2], "h two", T + 30, one)  # 2 + 1
    assert store.claim(ids[3], "h one", T + 30, clone)
    assert not store.claim(ids[4], "h two", T + 30, clone)  # one clone at a time
    assert not store.claim(ids[5], "h two", T + 30, Quota(9, max_containers=4))  # 2+1+1+1 > 4
    store.update_state(ids[0], "awaiting_review")
    assert not store.claim(ids[1], "h two", T + 30, two)  # ids 2 and 3 hold 2: 2 + 2 > 3
    store.update_state(ids[3], "failed")
    assert store.claim(ids[1], "h two", T + 30, two)  # 1 + 2
    assert store.claim(ids[4], "h one", T + 30, clone)
