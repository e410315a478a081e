"""The service under load, on loopback: four tenants submit forty jobs in all to one
``patchbox serve`` process at once (``bench/bench_service.py``'s driver). Every job is
accepted, ends ``awaiting_review`` and is listed to its tenant alone; no container of any of
them is left; the API answers within bounds while the jobs run. The figures this prints are
the ones ``docs/performance.md`` reports."""

from __future__ import annotations

import sys
from pathlib import Path

import docker
import httpx
import pytest

from tests.support.paths import BENCH

sys.path.insert(0, str(BENCH))

from bench_concurrency import CALLS, TASK
from bench_concurrency import greet_repo as make_repo
from bench_service import batch, leaked, serving, tenants_in, write_config
from common import percentile

pytestmark = pytest.mark.docker

TENANTS = 4
JOBS = 40
WORKERS = 4


def test_four_tenants_forty_jobs_none_lost_none_leaked(
    tmp_path: Path, docker_client: docker.DockerClient, sandbox_image: str
) -> None:
    assert sandbox_image
    load = batch(tmp_path, TENANTS, JOBS, WORKERS, max_concurrent=WORKERS // TENANTS)
    assert load.refused == []
    assert len(load.accepted) == JOBS
    assert len(set(load.accepted)) == JOBS
    assert load.lost == [], {j: load.statuses.get(j) for j in load.lost}
    assert leaked(docker_client, load.accepted) == []
    assert len(load.jobs) == JOBS
    submit_p99, list_p99 = percentile(load.submits, 99), percentile(load.polls, 99)
    # bounds far above what a loaded two-core machine shows, far below a stalled event loop
    assert submit_p99 < 2.0, load.submits
    assert list_p99 < 2.0
    assert load.wall < 600
    print(
        f"\n{TENANTS} tenants, {JOBS} jobs, {WORKERS} workers: wall {load.wall:.1f} s, "
        f"{JOBS / load.wall * 60:.1f} jobs/min; submit p50 "
        f"{percentile(load.submits, 50) * 1000:.1f} ms p99 {submit_p99 * 1000:.1f} ms; list p50 "
        f"{percentile(load.polls, 50) * 1000:.1f} ms p99 {list_p99 * 1000:.1f} ms; job p50 "
        f"{percentile(load.jobs, 50):.1f} s p99 {percentile(load.jobs, 99):.1f} s"
    )


def test_each_tenant_lists_only_its_own_jobs(tmp_path: Path) -> None:
    """The same driver's service with no worker (nothing runs, no Docker): each tenant's
    list is exactly the jobs it sent."""
    group = tenants_in(tmp_path / "roots", 2, 1)
    config = write_config(tmp_path, group, workers=0)
    with serving(config, tmp_path / "home") as url:
        mine: dict[str, set[str]] = {}
        for n, tenant in enumerate(group):
            headers = {"Authorization": f"Bearer {tenant.token}"}
            with httpx.Client(base_url=url, headers=headers) as client:
                ids = set()
                for i in range(3):
                    repo = make_repo(tenant.root / f"r{n}{i}", i)
                    body = {"repo": str(repo), "task": TASK, "calls": CALLS}
                    response = client.post("/v1/jobs", json=body)
                    assert response.status_code == 202, response.text
                    ids.add(response.json()["job_id"])
                mine[tenant.name] = ids
        for tenant in group:
            headers = {"Authorization": f"Bearer {tenant.token}"}
            listed = httpx.get(f"{url}/v1/jobs", headers=headers).json()["jobs"]
            assert {j["job_id"] for j in listed} == mine[tenant.name]
            assert {j["status"] for j in listed} == {"queued"}
