"""The service counts a job's services against its tenant's ``max_sandboxes``, over real
HTTP: a job whose environment has a Redis service holds two containers, so with
``max_sandboxes = 2`` the tenant's next job waits queued until it ends (although
``max_concurrent_jobs`` is 2); a task that needs more containers at once than
``max_sandboxes`` is refused when submitted."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import docker
import pytest

from controller.sandbox.labels import JOB, KIND
from tests.support.jobs import make_repo
from tests.support.registries import network_table
from tests.support.service import (
    CALLS,
    SLOW_CALLS,
    TASK,
    serving,
    slow_task,
    wait_status,
    write_config,
)
from tests.support.service_policy import error_of
from tests.support.services import REDIS

pytestmark = [pytest.mark.docker, pytest.mark.timeout(1200)]

END = {"awaiting_review", "no_change", "failed", "cancelled"}


def _service_toml(table: str, spec: dict[str, Any]) -> str:
    """``spec`` (a service of :mod:`tests.support.services`) as TOML tables."""
    build = spec["build"]
    ready = spec["ready"]
    return (
        f"[{table}]\nuser = {json.dumps(spec['user'])}\ncommand = {json.dumps(spec['command'])}\n"
        f"[{table}.build]\nsetup = {json.dumps(build['setup'])}\n"
        f"[{table}.ready]\nargv = {json.dumps(ready['argv'])}\n"
        f"timeout_seconds = {ready['timeout_seconds']}\n"
    )


def _host() -> str:
    return (
        network_table()
        + '[environments.cache]\nsetup = [["true"]]\n'
        + _service_toml("environments.cache.services.cache", REDIS)
        + '[environments.two]\nsetup = [["true"]]\n'
        + _service_toml("environments.two.services.one", REDIS)
        + _service_toml("environments.two.services.other", REDIS)
    )


def _services_of(client: docker.DockerClient, job_id: str) -> list[str]:
    found = client.containers.list(
        filters={"label": [f"{JOB}={job_id}", f"{KIND}=service"]}, sparse=True
    )
    return [str(c.id) for c in found]


def test_a_job_s_services_count_against_max_sandboxes(
    tmp_path: Path, client: docker.DockerClient
) -> None:
    config = write_config(
        tmp_path,
        host=_host(),
        tenants={"alpha": 'environments = ["cache", "two"]\nmax_sandboxes = 2'},
    )
    first_repo = make_repo(tmp_path / "alpha" / "first")
    second_repo = make_repo(tmp_path / "alpha" / "second")
    held = slow_task(8)
    held["checks"]["slow"]["services"] = ["cache"]
    with serving(config) as running:
        alpha = running.client("alpha")
        refused = alpha.post(
            "/v1/jobs",
            json={"repo": str(first_repo), "task": TASK | {"environment": "two"}},
        )
        status, code, message = error_of(refused)
        assert (status, code) == (403, "TASK_NOT_ALLOWED")
        assert "needs 3 containers at once (its sandbox and 2 services)" in message
        assert "max_sandboxes = 2" in message
        first = alpha.post(
            "/v1/jobs",
            json={
                "repo": str(first_repo),
                "task": held | {"environment": "cache"},
                "calls": SLOW_CALLS,
            },
        ).json()["job_id"]
        deadline = time.monotonic() + 900
        while not _services_of(client, first):
            assert time.monotonic() < deadline, "the first job's service did not start"
            time.sleep(0.2)
        second = alpha.post(
            "/v1/jobs", json={"repo": str(second_repo), "task": TASK, "calls": CALLS}
        ).json()["job_id"]
        time.sleep(2.0)  # a dispatch would have started it by now
        listed = {j["job_id"]: j["status"] for j in alpha.get("/v1/jobs").json()["jobs"]}
        assert listed[first] == "running"
        assert listed[second] == "queued", listed
        view = wait_status(alpha, first, END, timeout=600)
        assert view["status"] == "no_change", view.get("error")
        [service] = view["services"]  # the job's view names its service container
        assert (service["name"], service["sandbox"], service["exit"]) == (
            "cache",
            "loop",
            "running",
        )
        assert service["image_id"].startswith("sha256:")
        assert service["ready_seconds"] > 0
        assert wait_status(alpha, second, END, timeout=300)["status"] in END
    assert _services_of(client, first) == []
