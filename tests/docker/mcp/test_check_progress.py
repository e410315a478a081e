"""``run_check`` over MCP with the SDK's own client on the real daemon: the server sends the
running check's output as progress notifications of the request, and the handle form waits
again for a check that answered ``running``."""

from __future__ import annotations

import re
from pathlib import Path

import anyio
import docker
import pytest
from mcp.client.client import Client

from tests.docker.mcp.test_mcp import server_args, stdio, the_job
from tests.support.jobs import containers_of, make_repo
from tests.support.mcp import LIMITS, code, data

pytestmark = pytest.mark.docker

TASK = {
    "prompt": "watch a check",
    "checks": {
        "loop": {
            "argv": ["sh", "-c", 'i=0; while :; do echo "line $i"; i=$((i+1)); sleep 0.2; done'],
            "timeout_seconds": 600,
        },
        "brief": {
            "argv": ["sh", "-c", 'for i in 0 1 2 3 4 5 6 7; do echo "out $i"; sleep 0.3; done'],
            "timeout_seconds": 60,
        },
    },
    "baseline_checks": False,
    "limits": LIMITS,
}


def _numbers(text: str) -> list[int]:
    return [int(n) for n in re.findall(r"^line (\d+)$", text, re.MULTILINE)]


def test_progress_carries_the_output_and_the_handle_form_polls(
    docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> None:
    del sandbox_image
    repo = make_repo(tmp_path / "repo")
    params = stdio(server_args(tmp_path / "files", repo, TASK))
    notes: list[tuple[float, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        del total
        notes.append((progress, message))

    async def scenario() -> None:
        async with Client(params) as client:
            schema = next(t for t in (await client.list_tools()).tools if t.name == "run_check")
            assert {"checkId", "handle", "waitSeconds"} <= set(schema.input_schema["properties"])
            brief = await client.call_tool(
                "run_check", {"checkId": "brief"}, progress_callback=on_progress
            )
            assert data(brief)["status"] == "passed"
            told = "\n".join(m or "" for _, m in notes)
            assert [f"out {i}" for i in range(8)] == re.findall(r"out \d", told)
            assert [p for p, _ in notes] == sorted({p for p, _ in notes})  # increasing

            notes.clear()
            first = data(
                await client.call_tool(
                    "run_check",
                    {"checkId": "loop", "waitSeconds": 1.5},
                    progress_callback=on_progress,
                )
            )
            assert first["status"] == "running"
            handle = first["handle"]
            assert _numbers(first["output"])[:2] == [0, 1]
            assert _numbers("\n".join(m or "" for _, m in notes))[:2] == [0, 1]
            assert code(await client.call_tool("replace_text", {"path": "app.py",
                "oldText": "hello", "newText": "Hello"})) == "TOOL_CHECK_RUNNING"  # fmt: skip
            last = _numbers(first["output"])[-1]
            notes.clear()
            again = data(
                await client.call_tool(
                    "run_check",
                    {"handle": handle, "waitSeconds": 1},
                    progress_callback=on_progress,
                )
            )
            assert again["status"] == "running"
            assert _numbers(again["output"])[0] == last + 1
            assert notes
            unknown = await client.call_tool("run_check", {"handle": "chk_nope"})
            assert code(unknown) == "TOOL_HANDLE_UNKNOWN"
            assert not (await client.call_tool("list_files", {})).is_error  # reads go on

    anyio.run(scenario)
    # the client's end cancelled the job, its check with it: nothing of it runs
    job = the_job(repo)
    assert job.state == "cancelled"
    assert containers_of(docker_client, job.job_id) == []
