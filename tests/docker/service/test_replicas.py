"""Several ``patchbox serve`` processes (replicas) on one PostgreSQL database, sharing
``$PATCHBOX_HOME``: one queue, each job run once by one replica, a tenant's
``max_concurrent_jobs`` held across replicas; a replica killed with SIGKILL loses its jobs
when its lease runs out (they end ``failed`` with ``INTERRUPTED``, their containers removed
by the other replica) and its queued jobs run on the other; a replica whose own engine
stops answering claims nothing, its jobs end ``INTERRUPTED`` naming the engine, the other
replica runs the queue, and once the engine answers again nothing of them is left on it; a
replica claims only jobs under the repository roots it can see."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import docker
import psycopg
import pytest

from controller.jobs.store import JobStore
from tests.support.jobs import containers_of, make_repo
from tests.support.postgres import Cluster
from tests.support.replicas import EngineGate, Replica, max_overlap, start_replica
from tests.support.service import CALLS, END, SLOW_CALLS, slow_task, write_config
from tests.support.service_http import submit

pytestmark = pytest.mark.docker


def _wait(
    replica: Replica, tenant: str, job_id: str, states: set[str], timeout: float = 240
) -> Any:
    deadline = time.monotonic() + timeout
    with replica.client(tenant) as client:
        while True:
            view = client.get(f"/v1/jobs/{job_id}").json()
            if view["status"] in states:
                return view
            assert time.monotonic() < deadline, view
            time.sleep(0.2)


def test_two_replicas_run_one_queue_each_job_once_within_the_tenants_limit(
    docker_client: docker.DockerClient,
    sandbox_image: str,
    tmp_path: Path,
    postgres_cluster: Cluster,
) -> None:
    del docker_client, sandbox_image
    dsn = postgres_cluster.database()
    config = write_config(tmp_path, postgres=dsn, max_queued_jobs=20)
    replicas = [start_replica(config, tmp_path / f"replica-{i}.log") for i in range(2)]
    jobs: list[tuple[str, str]] = []
    try:
        for n in range(12):
            tenant = "alpha" if n % 2 == 0 else "beta"
            repo = make_repo(tmp_path / tenant / f"repo-{n}")
            with replicas[n % 2].client(tenant) as client:
                answer = submit(client, repo, calls=CALLS)
                assert answer.status_code == 202, answer.text
                jobs.append((tenant, answer.json()["job_id"]))
        views = [_wait(replicas[0], tenant, job_id, END) for tenant, job_id in jobs]
    finally:
        for replica in replicas:
            replica.stop()
    assert [v["status"] for v in views] == ["awaiting_review"] * 12, [v["error"] for v in views]
    with psycopg.connect(dsn) as conn:
        owners = {o for (o,) in conn.execute("SELECT DISTINCT owner FROM jobs").fetchall()}
        preparing = conn.execute(
            "SELECT job_id, COUNT(*) FROM events WHERE data LIKE '%\"preparing\"%' GROUP BY job_id"
        ).fetchall()
    assert len(owners) == 2  # both replicas ran jobs
    assert sorted(preparing) == sorted((job_id, 1) for _, job_id in jobs)  # each ran once
    store = JobStore()
    for tenant in ("alpha", "beta"):
        spans = []
        for owner, job_id in jobs:
            if owner == tenant:
                history = dict(store.load(job_id).history)
                spans.append((history["preparing"], history["awaiting_review"]))
        assert max_overlap(spans) <= 2  # the tenant's max_concurrent_jobs, across replicas


def test_a_killed_replicas_jobs_end_interrupted_and_its_queue_runs_on_the_other(
    docker_client: docker.DockerClient,
    sandbox_image: str,
    tmp_path: Path,
    postgres_cluster: Cluster,
) -> None:
    del sandbox_image
    dsn = postgres_cluster.database()
    config = write_config(tmp_path, postgres=dsn, service={"lease_seconds": 3})
    first = start_replica(config, tmp_path / "first.log")
    second: Replica | None = None
    try:
        slow, fast = [], []
        with first.client() as alpha:
            for n in range(2):
                repo = make_repo(tmp_path / "alpha" / f"slow-{n}")
                answer = submit(alpha, repo, task=slow_task(120), calls=SLOW_CALLS)
                slow.append(answer.json()["job_id"])
            for n in range(2):
                repo = make_repo(tmp_path / "alpha" / f"fast-{n}")
                fast.append(submit(alpha, repo, calls=CALLS).json()["job_id"])
        for job_id in slow:
            _wait(first, "alpha", job_id, {"running"})
        second = start_replica(config, tmp_path / "second.log")
        time.sleep(3)  # the second replica is up and cannot take the tenant's third job
        with second.client() as alpha:
            assert [alpha.get(f"/v1/jobs/{j}").json()["status"] for j in fast] == ["queued"] * 2
        first.kill()
        ended = [_wait(second, "alpha", job_id, END, timeout=60) for job_id in slow]
        done = [_wait(second, "alpha", job_id, END) for job_id in fast]
    finally:
        if first.proc.poll() is None:
            first.kill()
        if second is not None:
            second.stop()
    assert [(v["status"], v["error"]["code"]) for v in ended] == [("failed", "INTERRUPTED")] * 2
    assert [v["status"] for v in done] == ["awaiting_review"] * 2
    for job_id in slow:
        assert containers_of(docker_client, job_id) == []
    with psycopg.connect(dsn) as conn:
        reasons = conn.execute(
            "SELECT COUNT(*) FROM events WHERE data LIKE '%INTERRUPTED%'"
        ).fetchone()
    assert reasons == (2,)


def test_a_replicas_engine_that_stops_answering_interrupts_its_jobs_and_the_other_goes_on(
    docker_client: docker.DockerClient,
    sandbox_image: str,
    tmp_path: Path,
    postgres_cluster: Cluster,
) -> None:
    del sandbox_image
    dsn = postgres_cluster.database()
    config = write_config(tmp_path, postgres=dsn, service={"lease_seconds": 3})
    gate = EngineGate()
    first = start_replica(config, tmp_path / "first.log", env={"DOCKER_HOST": gate.url})
    second: Replica | None = None
    try:
        with first.client() as alpha:
            slow = []
            for n in range(2):
                repo = make_repo(tmp_path / "alpha" / f"slow-{n}")
                answer = submit(alpha, repo, task=slow_task(120), calls=SLOW_CALLS)
                slow.append(answer.json()["job_id"])
            for job_id in slow:
                _wait(first, "alpha", job_id, {"running"})
            fast = [
                submit(alpha, make_repo(tmp_path / "alpha" / f"fast-{n}"), calls=CALLS).json()[
                    "job_id"
                ]
                for n in range(2)
            ]
        second = start_replica(config, tmp_path / "second.log")
        gate.cut()
        ended = [_wait(second, "alpha", job_id, END, timeout=60) for job_id in slow]
        done = [_wait(second, "alpha", job_id, END) for job_id in fast]
        with psycopg.connect(dsn) as conn:
            owners: dict[str, str] = dict(conn.execute("SELECT id, owner FROM jobs").fetchall())
            engine_ok: dict[str, bool] = dict(
                conn.execute("SELECT engine, engine_ok FROM replicas").fetchall()
            )
        assert engine_ok[gate.url] is False
        gate.restore()
        deadline = time.monotonic() + 30
        while any(containers_of(docker_client, j) for j in slow) and time.monotonic() < deadline:
            time.sleep(0.5)
    finally:
        first.stop()
        gate.close()
        if second is not None:
            second.stop()
    lost = f"interrupted: the Docker engine {gate.url} stopped answering"
    assert [(v["status"], v["error"]["code"], v["error"]["message"]) for v in ended] == [
        ("failed", "INTERRUPTED", lost)
    ] * 2
    assert [v["status"] for v in done] == ["awaiting_review"] * 2
    assert owners[slow[0]] == owners[slow[1]] != owners[fast[0]] == owners[fast[1]]
    for job_id in slow:
        assert containers_of(docker_client, job_id) == []


def test_a_replica_claims_only_jobs_under_the_roots_it_can_see(
    docker_client: docker.DockerClient,
    sandbox_image: str,
    tmp_path: Path,
    postgres_cluster: Cluster,
) -> None:
    del docker_client, sandbox_image
    dsn = postgres_cluster.database()
    alpha_root = str(tmp_path / "alpha")
    narrow = tmp_path / "narrow.toml"
    write_config(tmp_path, postgres=dsn, service={"visible_roots": ["/nowhere"]}).rename(narrow)
    wide = write_config(tmp_path, postgres=dsn)
    first = start_replica(narrow, tmp_path / "narrow.log")
    second: Replica | None = None
    try:
        with first.client() as alpha:
            job_id = submit(alpha, make_repo(tmp_path / "alpha" / "seen"), calls=CALLS).json()[
                "job_id"
            ]
        time.sleep(3)
        with first.client() as alpha:
            assert alpha.get(f"/v1/jobs/{job_id}").json()["status"] == "queued"
        second = start_replica(wide, tmp_path / "wide.log")
        view = _wait(second, "alpha", job_id, END)
        with psycopg.connect(dsn) as conn:
            roots: dict[str, str] = dict(
                conn.execute("SELECT name, roots FROM replicas").fetchall()
            )
    finally:
        first.stop()
        if second is not None:
            second.stop()
    assert view["status"] == "awaiting_review"
    assert sorted(roots.values()) == sorted(
        ['["/nowhere"]', f'["{alpha_root}", "{tmp_path / "beta"}"]']
    )
