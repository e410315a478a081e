"""Services over MCP with the SDK's own client: ``run_check`` of a check that needs a Redis
service (built from Debian's packages) passes, one whose service never gets ready is the
call's error ``SERVICE_NOT_READY`` with the reason; the job records both and leaves
nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import docker
import pytest
from mcp.client.client import Client

from tests.support.jobs import containers_of, make_repo
from tests.support.mcp import LIMITS, code, data, server_args, stdio, the_job
from tests.support.registries import network_table
from tests.support.services import CLIENTS, REDIS

pytestmark = [pytest.mark.docker, pytest.mark.timeout(1200)]

PING = "import redis\nprint(redis.Redis(host='cache', socket_timeout=5).ping())\n"
TASK: dict[str, Any] = {
    "prompt": "use the cache",
    "checks": {
        "ping": {"argv": ["python3", "-c", PING], "services": ["cache"]},
        "other": {"argv": ["true"], "services": ["broken"], "required": False},
    },
    "environment": {
        "setup": CLIENTS,
        "services": {
            "cache": REDIS,
            "broken": REDIS | {"ready": {"argv": ["false"], "timeout_seconds": 3}},
        },
    },
    "baseline_checks": False,
    "limits": LIMITS | {"wall_seconds": 900},
}


@pytest.mark.usefixtures("sandbox_image")
def test_run_check_reaches_its_service_and_names_one_that_is_not_ready(
    docker_client: docker.DockerClient, tmp_path: Path
) -> None:
    repo = make_repo(tmp_path / "repo")
    params = stdio(server_args(tmp_path / "files", repo, TASK, network_table()))

    async def scenario() -> tuple[dict[str, Any], str, str]:
        async with Client(params) as client:
            ping = data(await client.call_tool("run_check", {"checkId": "ping"}))
            other = await client.call_tool("run_check", {"checkId": "other"})
            return ping, code(other), str(other.content)

    ping, other_code, other_text = anyio.run(scenario)
    assert ping["status"] == "passed", ping
    assert "True" in str(ping["output"])
    assert other_code == "SERVICE_NOT_READY", other_text
    assert "service broken was not ready within 3 s" in other_text
    job = the_job(repo)
    assert [(s.name, s.exit) for s in job.services] == [
        ("cache", "running"),
        ("broken", "not ready"),
    ]
    assert containers_of(docker_client, job.job_id) == []
