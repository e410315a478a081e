"""What an MCP client's model gets when a job ends without a change, when a required check
cannot run, when it reads a file that is not there and when it asks for line numbers:
through the official SDK's own client over stdio, on a real repository and the real daemon,
the same codes, remedies and answers the engine gives every front door."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import docker
from mcp.client.client import Client

from controller.jobs.store import JobStore
from controller.mcp.slot import PROPOSE
from tests.support.jobs import containers_of, make_repo
from tests.support.mcp import TASK, code, data, server_args, stdio


def test_no_change_a_missing_file_and_line_numbers_as_the_model_reads_them(
    docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> None:
    del sandbox_image
    repo = make_repo(tmp_path / "repo")
    params = stdio(server_args(tmp_path / "files", repo))

    async def scenario() -> tuple[Any, dict[str, Any], dict[str, Any]]:
        async with Client(params) as client:
            missing = await client.call_tool("read_file", {"path": "no/such.py"})
            numbered = data(
                await client.call_tool("read_file", {"path": "app.py", "lineNumbers": True})
            )
            proposal = data(await client.call_tool(PROPOSE, {"message": "nothing to change"}))
            return missing, numbered, proposal

    missing, numbered, proposal = anyio.run(scenario)
    assert code(missing) == "TOOL_FILE_NOT_FOUND"
    assert "no/such.py" in data(missing)["error"]["message"]
    first = numbered["content"].splitlines()[0]
    assert first.lstrip().startswith("1"), numbered["content"]
    assert proposal["status"] == "no_change"
    assert proposal["error"]["code"] == "NO_CHANGE"
    assert proposal["diff"] == ""
    [record] = [r for r in JobStore().all() if r.repo == str(repo.resolve())]
    assert (record.job_id, record.state) == (proposal["job_id"], "no_change")
    assert not containers_of(docker_client, record.job_id)


def test_a_check_that_cannot_run_is_the_first_calls_answer_with_its_remedy(
    docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> None:
    del sandbox_image
    repo = make_repo(tmp_path / "repo")
    missing = {"argv": ["sh", "-c", "patchbox-no-such-command"], "timeout_seconds": 30}
    task = TASK | {"checks": {"tests": missing}}
    params = stdio(server_args(tmp_path / "files", repo, task))

    async def scenario() -> Any:
        async with Client(params) as client:
            return await client.call_tool("read_file", {"path": "app.py"})

    answer = anyio.run(scenario)
    assert code(answer) == "CHECK_CANNOT_RUN"
    error = data(answer)["error"]
    assert error["hint"]["action"] == "use_environment"
    assert "give the task an environment" in error["hint"]["text"]
    [record] = [r for r in JobStore().all() if r.repo == str(repo.resolve())]
    assert (record.state, record.error.code if record.error else None) == (
        "failed",
        "CHECK_CANNOT_RUN",
    )
    assert record.tool_calls == []
    assert not containers_of(docker_client, record.job_id)
