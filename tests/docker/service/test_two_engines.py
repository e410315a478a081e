"""Two ``patchbox serve`` replicas on one PostgreSQL database, each on a Docker engine of its
own: the machine's daemon and a second ``dockerd`` started for this module
(``tests.support.dockerd``). Under a load of four tenants' jobs the second daemon is stopped:
the jobs running on it end ``failed`` with ``INTERRUPTED`` naming its engine, every other job
(the queued ones included) runs on the first replica's engine, each job once, each tenant's
``max_concurrent_jobs`` held across the replicas; nothing of the jobs is left on the first
engine, and once the second daemon runs again its replica removes what the interrupted
jobs left there: no container of them is left on either engine."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import psycopg
import pytest

from controller.jobs.store import JobStore
from controller.sandbox.image import ImageBuilder
from controller.sandbox.labels import JOB
from controller.service.engines import engine_lost, engine_name
from tests.support.dockerd import Dockerd, missing, start_dockerd
from tests.support.jobs import containers_of, make_repo
from tests.support.postgres import Cluster
from tests.support.replicas import Replica, max_overlap, start_replica
from tests.support.service import CALLS, END, LIMITS, SLOW_CALLS, slow_task, write_config
from tests.support.service_http import submit

pytestmark = [pytest.mark.docker, pytest.mark.timeout(900)]

TENANTS = ("alpha", "beta", "gamma", "delta")
FAST_PER_TENANT = 20
LIMIT = 2  # each tenant's max_concurrent_jobs (write_config)
SLOW: dict[str, Any] = {
    **slow_task(240),  # the longest check a tenant may run by default
    "limits": {**LIMITS, "wall_seconds": 600},  # still running when the engine goes
}


@pytest.fixture(scope="module")
def second_engine(docker_client: docker.DockerClient, sandbox_image: str) -> Iterator[Dockerd]:
    """A second daemon with the images a job uses (the sandbox image and its base)."""
    del sandbox_image  # built first: both images are then on the machine's daemon
    why = missing()
    if why is not None:
        pytest.skip(why)
    images = ImageBuilder(docker_client).status()
    assert images["ready"], images
    daemon = start_dockerd(str(docker_client.info()["Driver"]))
    try:
        daemon.load(str(images["base"]), str(images["tag"]))
        yield daemon
    finally:
        daemon.close()


def _rows(dsn: str) -> dict[str, tuple[str, str | None]]:
    """Each job's state and owner, by id."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT id, state, owner FROM jobs").fetchall()
    return {job_id: (state, owner) for job_id, state, owner in rows}


def _replicas(dsn: str) -> dict[str, tuple[str, bool]]:
    """Each replica's name and whether its engine answered, by its engine."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT engine, name, engine_ok FROM replicas").fetchall()
    return {engine: (name, ok) for engine, name, ok in rows}


def _until(what: str, ready: Any, timeout: float, pause: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := ready()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(pause)
    return found


def _submit(
    replicas: list[Replica], tmp_path: Path, tenant_of: dict[str, str], **job: Any
) -> list[str]:
    """:data:`FAST_PER_TENANT` jobs of each tenant, sent to the replicas in turn."""
    ids = []
    for n in range(FAST_PER_TENANT):
        for i, tenant in enumerate(TENANTS):
            repo = make_repo(tmp_path / tenant / f"repo-{n}")
            with replicas[(n + i) % len(replicas)].client(tenant) as client:
                answer = submit(client, repo, **job)
            assert answer.status_code == 202, answer.text
            ids.append(answer.json()["job_id"])
            tenant_of[ids[-1]] = tenant
    return ids


def _submit_slow(replica: Replica, tmp_path: Path, tenant_of: dict[str, str]) -> list[str]:
    """A slow job of alpha's and one of beta's."""
    ids = []
    for tenant in ("alpha", "beta"):
        with replica.client(tenant) as client:
            answer = submit(
                client, make_repo(tmp_path / tenant / "slow"), task=SLOW, calls=SLOW_CALLS
            )
        assert answer.status_code == 202, answer.text
        ids.append(answer.json()["job_id"])
        tenant_of[ids[-1]] = tenant
    return ids


def _ended(replica: Replica, tenant_of: dict[str, str], timeout: float) -> dict[str, Any]:
    """Each job's view once it ended."""
    views: dict[str, Any] = {}
    deadline = time.monotonic() + timeout
    for job_id, tenant in tenant_of.items():
        with replica.client(tenant) as client:
            while (view := client.get(f"/v1/jobs/{job_id}").json())["status"] not in END:
                assert time.monotonic() < deadline, view
                time.sleep(0.5)
        views[job_id] = view
    return views


def _assert_each_ran_once_within_the_limits(
    dsn: str, tenant_of: dict[str, str], history: dict[str, dict[str, float]], cut: set[str]
) -> None:
    with psycopg.connect(dsn) as conn:
        preparing = conn.execute(
            "SELECT job_id, COUNT(*) FROM events WHERE data LIKE '%\"preparing\"%' GROUP BY job_id"
        ).fetchall()
    counts: dict[str, int] = dict(preparing)
    assert set(counts) <= set(tenant_of)
    assert [j for j in tenant_of if counts.get(j, 0) > 1] == []  # none ran twice
    # every job ran, but those its engine lost between their claim and their start
    assert [j for j in tenant_of if j not in counts and "preparing" in history.get(j, {})] == []
    assert [j for j in tenant_of if j not in counts and j not in cut] == []
    for tenant in TENANTS:
        spans = [
            (h["preparing"], max(h.values()))
            for j, h in history.items()
            if tenant_of[j] == tenant and "preparing" in h
        ]
        assert max_overlap(spans) <= LIMIT, tenant  # across the replicas


def _left_on(engine: Dockerd, jobs: set[str], timeout: float) -> set[str]:
    """The jobs of ``jobs`` with a container on ``engine``, once none is left or after
    ``timeout`` seconds."""
    with contextlib.closing(engine.client()) as client:
        deadline = time.monotonic() + timeout
        while True:
            found = client.containers.list(all=True, filters={"label": JOB}, sparse=True)
            left = {str((c.attrs.get("Labels") or {}).get(JOB)) for c in found} & jobs
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(1)


def test_a_second_engine_stopped_under_load_interrupts_only_its_running_jobs(
    docker_client: docker.DockerClient,
    second_engine: Dockerd,
    tmp_path: Path,
    postgres_cluster: Cluster,
) -> None:
    dsn = postgres_cluster.database()
    config = write_config(
        tmp_path, postgres=dsn, workers=4, max_queued_jobs=30, tenant_names=TENANTS
    )
    tenant_of: dict[str, str] = {}
    second = start_replica(config, tmp_path / "second.log", env={"DOCKER_HOST": second_engine.host})
    first: Replica | None = None
    try:
        # The second replica alone: it takes the slow jobs, one of alpha's and one of beta's.
        slow = _submit_slow(second, tmp_path, tenant_of)
        _until(
            "the slow jobs to run", lambda: all(_rows(dsn)[j][0] == "running" for j in slow), 240
        )
        first = start_replica(config, tmp_path / "first.log")
        fast = _submit([first, second], tmp_path, tenant_of, calls=CALLS)
        mine = _replicas(dsn)[second_engine.host][0]

        def busy_second() -> list[str]:
            rows = _rows(dsn)
            ended = sum(1 for j in fast if rows[j][0] in END)
            running = [
                j for j, (state, owner) in rows.items() if owner == mine and state == "running"
            ]
            return running if ended >= 8 and set(running) - set(slow) else []

        on_second = _until("the second engine to run fast jobs mid-load", busy_second, 600)
        assert set(slow) <= set(on_second)
        stopped_at = time.time()
        second_engine.stop()  # SIGTERM: the engine goes away under its jobs
        views = _ended(first, tenant_of, timeout=1200)
        lost_ok = _replicas(dsn)[second_engine.host][1]
        owners = {j: owner for j, (_, owner) in _rows(dsn).items()}
        # The second daemon again: it stopped its containers when it stopped.
        second_engine.start()
        _until("the second engine to answer", lambda: _replicas(dsn)[second_engine.host][1], 180)
        still = _left_on(second_engine, set(views), timeout=90)
    finally:
        if first is not None:
            first.stop()
        second.stop()
    store = JobStore()
    history: dict[str, dict[str, float]] = {}
    for j in views:
        with contextlib.suppress(Exception):  # a job its engine lost before it started
            history[j] = dict(store.load(j).history)
    assert lost_ok is False
    # The jobs on the second engine when it stopped: those the second replica took and had
    # not finished by then (it takes none once it sees its engine gone).
    cut = {
        j
        for j in views
        if owners[j] == mine and history.get(j, {}).get("awaiting_review", stopped_at) >= stopped_at
    }
    lost = engine_lost(second_engine.host)
    interrupted = {
        j
        for j in cut
        if (views[j]["status"], views[j]["error"])
        == ("failed", {"code": "INTERRUPTED", "message": lost})
    }
    assert set(slow) <= interrupted  # still running their long check when the engine went
    # a fast job whose checks were done when the engine went keeps its decision (only its
    # containers' removal failed); every other job of the second engine is INTERRUPTED
    finished = {j: views[j]["status"] for j in cut - interrupted}
    assert set(finished.values()) <= {"awaiting_review"}, finished
    assert not set(slow) & set(finished)
    others = {j: v["status"] for j, v in views.items() if j not in cut}
    assert set(others.values()) == {"awaiting_review"}, others
    after = {owners[j] for j in others if history[j]["preparing"] > stopped_at}
    assert after == {_replicas(dsn)[engine_name()][0]}  # the queue ran on the first replica
    _assert_each_ran_once_within_the_limits(dsn, tenant_of, history, cut)
    assert still == set()  # no job's container is left on the second engine
    assert [j for j in views if containers_of(docker_client, j)] == []


def test_a_replica_killed_under_load_loses_only_its_running_jobs_and_leaves_nothing(
    docker_client: docker.DockerClient,
    second_engine: Dockerd,
    tmp_path: Path,
    postgres_cluster: Cluster,
) -> None:
    """SIGKILL of the second engine's replica mid-load: the first replica takes its running
    jobs over (``INTERRUPTED``) and runs the rest once each, within the tenants' limits;
    what the killed replica left on its engine goes when a replica starts there again."""
    dsn = postgres_cluster.database()
    config = write_config(
        tmp_path,
        postgres=dsn,
        workers=4,
        max_queued_jobs=30,
        tenant_names=TENANTS,
        service={"lease_seconds": 3},
    )
    env = {"DOCKER_HOST": second_engine.host}
    tenant_of: dict[str, str] = {}
    second = start_replica(config, tmp_path / "second.log", env=env)
    first: Replica | None = None
    third: Replica | None = None
    try:
        slow = _submit_slow(second, tmp_path, tenant_of)
        _until(
            "the slow jobs to run", lambda: all(_rows(dsn)[j][0] == "running" for j in slow), 240
        )
        first = start_replica(config, tmp_path / "first.log")
        fast = _submit([first, second], tmp_path, tenant_of, calls=CALLS)
        mine = _replicas(dsn)[second_engine.host][0]

        def busy_second() -> list[str]:
            rows = _rows(dsn)
            ended = sum(1 for j in fast if rows[j][0] in END)
            held = [
                j
                for j, (state, owner) in rows.items()
                if owner == mine and state not in END and state != "queued"
            ]
            return held if ended >= 8 and set(held) - set(slow) else []

        _until("the second replica to run fast jobs mid-load", busy_second, 600)
        killed_at = time.time()
        second.kill()
        views = _ended(first, tenant_of, timeout=1200)
        third = start_replica(config, tmp_path / "third.log", env=env)  # settles its engine
        still = _left_on(second_engine, set(views), timeout=90)
    finally:
        for replica in (first, third):
            if replica is not None:
                replica.stop()
        if second.proc.poll() is None:
            second.kill()
    store = JobStore()
    history: dict[str, dict[str, float]] = {}
    for j in views:
        with contextlib.suppress(Exception):  # a job claimed but not started when killed
            history[j] = dict(store.load(j).history)
    cut = {j for j, v in views.items() if v["status"] == "failed"}  # what the kill cut short
    assert set(slow) <= cut
    assert {j: views[j]["error"]["code"] for j in cut} == dict.fromkeys(cut, "INTERRUPTED")
    assert all(history.get(j, {}).get("created", 0) < killed_at for j in cut)
    others = {j: v["status"] for j, v in views.items() if j not in cut}
    assert set(others.values()) == {"awaiting_review"}, others
    _assert_each_ran_once_within_the_limits(dsn, tenant_of, history, cut)
    assert still == set()  # what the killed replica left on its engine is gone
    assert [j for j in views if containers_of(docker_client, j)] == []
