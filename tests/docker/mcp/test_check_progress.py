"""``run_check`` over MCP with the SDK's own client on the real daemon: the server sends the
running check's output as progress notifications of the request, over stdio and over the
streamable HTTP transport (under runc and runsc), and the handle form waits again for a check
that answered ``running``."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import anyio
import docker
import pytest
from mcp.client.client import Client

from controller.sandbox.base import Runtime
from tests.support.jobs import containers_of, make_repo
from tests.support.mcp import LIMITS, code, data, server_args, stdio, the_job, until
from tests.support.paths import REPO_ROOT

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


def test_over_http_progress_carries_the_output_under_each_runtime(
    docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path, runtime: Runtime
) -> None:
    """The streamable HTTP transport: the same progress notifications, under runc and runsc,
    and the handle form; the session's end cancels the job."""
    del sandbox_image
    repo = make_repo(tmp_path / "repo")
    err_path = tmp_path / "server.err"
    args = [*server_args(tmp_path / "files", repo, TASK), "--runtime", runtime, "--http", "0"]
    notes: list[str] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        del progress, total
        notes.append(message or "")

    with err_path.open("w") as err:
        server = subprocess.Popen(
            [sys.executable, *args], stdout=subprocess.DEVNULL, stderr=err, cwd=REPO_ROOT
        )
        try:

            def url() -> str:
                found = re.search(r"(http://127\.0\.0\.1:\d+/mcp)", err_path.read_text())
                return found.group(1) if found else ""

            assert until(lambda: bool(url()), 60.0), err_path.read_text()

            async def scenario() -> None:
                async with Client(url()) as client:
                    brief = await client.call_tool(
                        "run_check", {"checkId": "brief"}, progress_callback=on_progress
                    )
                    assert data(brief)["status"] == "passed"
                    assert [f"out {i}" for i in range(8)] == re.findall(r"out \d", "\n".join(notes))
                    notes.clear()
                    first = data(
                        await client.call_tool(
                            "run_check",
                            {"checkId": "loop", "waitSeconds": 1.5},
                            progress_callback=on_progress,
                        )
                    )
                    assert first["status"] == "running"
                    assert _numbers("\n".join(notes))[:2] == [0, 1]
                    again = data(
                        await client.call_tool(
                            "run_check", {"handle": first["handle"], "waitSeconds": 1}
                        )
                    )
                    assert again["status"] == "running"
                    assert _numbers(again["output"])[0] == _numbers(first["output"])[-1] + 1

            anyio.run(scenario)
            job = the_job(repo)
            assert until(lambda: the_job(repo).state == "cancelled", 60.0), the_job(repo).state
            assert until(lambda: containers_of(docker_client, job.job_id) == [], 30.0)
        finally:
            server.terminate()
            server.wait(timeout=60)
