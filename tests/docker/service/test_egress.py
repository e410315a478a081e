"""A service job whose check declares egress, over real HTTP, under runc and runsc: the
tenant's ``egress_allow`` lets it reach its pair through the job's proxy (real Squid); the
job view returns every request with the check, as ``run --json`` does; the proxy and its
network are gone with the job."""

from __future__ import annotations

from pathlib import Path

import docker
import pytest

from controller.sandbox.labels import JOB, OWNER_FILTER
from tests.support.egress import FILES, SERVER_PORT, Outside
from tests.support.jobs import containers_of, make_repo
from tests.support.service import TASK, serving, wait_status, write_config
from tests.support.service_policy import submit

pytestmark = pytest.mark.docker

PAIR = f"{FILES}:{SERVER_PORT}"
FETCH = (
    "import urllib.request\n"
    f"print(urllib.request.urlopen('http://{PAIR}/hello', timeout=20).read().decode())\n"
)


@pytest.mark.usefixtures("sandbox_image", "proxy_tag")
def test_a_service_jobs_egress_check_reaches_its_pair_and_returns_its_requests(
    tmp_path: Path, docker_client: docker.DockerClient, runtime: str, outside: Outside
) -> None:
    host = f'[network]\nallow = ["{PAIR}"]\noutside = "{outside.name}"\n'
    config = write_config(
        tmp_path, runtime=runtime, host=host, tenants={"alpha": f'egress_allow = ["{PAIR}"]'}
    )
    check = {"argv": ["python3", "-c", FETCH], "egress": [PAIR], "timeout_seconds": 60}
    task = TASK | {"checks": {**TASK["checks"], "fetch": check}}
    repo = make_repo(tmp_path / "alpha" / "greet")
    with serving(config) as running:
        alpha = running.client("alpha")
        accepted = submit(alpha, repo, task)
        assert accepted.status_code == 202, accepted.text
        job_id = accepted.json()["job_id"]
        view = wait_status(alpha, job_id, {"failed", "awaiting_review", "cancelled"}, 600)
    assert view["status"] == "awaiting_review", view["error"]
    fetch = next(c for c in view["checks"] if c["id"] == "fetch")
    assert fetch["status"] == "passed", fetch
    requests = fetch["network"]
    assert requests, fetch
    assert {(r["host"], r["port"], r["allowed"]) for r in requests} == {(FILES, SERVER_PORT, True)}
    assert all(r["status"] == 200 and r["bytes_in"] > 0 for r in requests), requests
    greet = next(c for c in view["checks"] if c["id"] == "greet")
    assert not greet.get("network")  # a check without egress made no request
    assert containers_of(docker_client, job_id) == []
    assert not docker_client.networks.list(filters={"label": [OWNER_FILTER, f"{JOB}={job_id}"]})
