"""An egress check over MCP with the SDK's own client: ``run_check`` answers the check's
requests through the job's proxy (``network``), and a task whose egress the host
configuration does not allow gets ``EGRESS_NOT_ALLOWED`` at its first call, no sandbox
started."""

from __future__ import annotations

from pathlib import Path

import anyio
import docker
import pytest
from mcp.client.client import Client

from tests.support.egress import FILES, SERVER_PORT, Outside
from tests.support.jobs import containers_of, make_repo
from tests.support.mcp import LIMITS, code, data, server_args, stdio, the_job

pytestmark = pytest.mark.docker

PAIR = f"{FILES}:{SERVER_PORT}"
FETCH = (
    "import urllib.request\n"
    f"print(urllib.request.urlopen('http://{FILES}:{SERVER_PORT}/hello', timeout=20).read())\n"
)
TASK = {
    "prompt": "fetch",
    "checks": {"fetch": {"argv": ["python3", "-c", FETCH], "egress": [PAIR]}},
    "baseline_checks": False,
    "limits": LIMITS,
}


@pytest.mark.usefixtures("sandbox_image", "proxy_tag")
def test_run_check_answers_the_checks_requests(
    docker_client: docker.DockerClient, tmp_path: Path, outside: Outside
) -> None:
    repo = make_repo(tmp_path / "repo")
    config = f'[network]\nallow = ["{PAIR}"]\noutside = "{outside.name}"\n'
    params = stdio(server_args(tmp_path / "files", repo, TASK, config))

    async def scenario() -> dict[str, object]:
        async with Client(params) as client:
            return data(await client.call_tool("run_check", {"checkId": "fetch"}))

    result = anyio.run(scenario)
    assert result["status"] == "passed", result
    assert "hello from the outside" in str(result["output"])
    network = result["network"]
    assert isinstance(network, list)
    assert [(r["host"], r["port"], r["allowed"]) for r in network] == [(FILES, SERVER_PORT, True)]
    job = the_job(repo)
    assert containers_of(docker_client, job.job_id) == []


@pytest.mark.usefixtures("sandbox_image")
def test_egress_the_operator_does_not_allow_is_the_first_calls_error(
    docker_client: docker.DockerClient, tmp_path: Path
) -> None:
    repo = make_repo(tmp_path / "repo")
    config = '[network]\nallow = ["*.example.org:443"]\n'
    params = stdio(server_args(tmp_path / "files", repo, TASK, config))
    before = {c.id for c in docker_client.containers.list(all=True, sparse=True)}

    async def scenario() -> tuple[str, str]:
        async with Client(params) as client:
            answer = await client.call_tool("list_files", {})
            assert answer.is_error
            return code(answer), str(answer.content)

    found, text = anyio.run(scenario)
    assert found == "EGRESS_NOT_ALLOWED", text
    assert PAIR in text
    after = {c.id for c in docker_client.containers.list(all=True, sparse=True)}
    assert after <= before
