"""Remedies said by each front door over the real thing: the CLI in a subprocess and the MCP
server through the SDK's own client, on a repository with local changes (the daemon is
needed to open a job)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import docker
import pytest
from mcp.client.client import Client

from controller.config.host import HostConfig
from controller.config.task import TaskSpec
from controller.mcp.server import build_server
from controller.mcp.slot import Options, Sessions, Slot
from tests.support.cli import job_files, patchbox
from tests.support.jobs import GREET, make_repo

TASK: dict[str, Any] = {"prompt": "Capitalize the greeting.", "checks": {"greet": GREET}}
CALLS: dict[str, Any] = {"turns": [], "final": "nothing"}


@pytest.mark.docker
def test_the_cli_says_the_flag(docker_client: docker.DockerClient, tmp_path: Path) -> None:
    del docker_client
    repo = make_repo(tmp_path / "repo")
    (repo / "app.py").write_text("# a local change\n")
    args = job_files(tmp_path / "files", TASK, CALLS)
    ran = patchbox("run", "--repo", str(repo), *args, "--json", home=tmp_path / "home")
    assert ran.returncode == 1, ran.stderr
    error = json.loads(ran.stdout)["error"]
    assert error["code"] == "CONSENT_REQUIRED"
    engine, remedy = error["message"].split("; pass ")
    assert "--" not in engine  # the engine's words; the flag is the CLI's remedy
    assert remedy == "--include-local-changes to include them"
    assert error["hint"] == {
        "option": "include_local_changes",
        "text": "pass --include-local-changes to include them",
    }
    text = patchbox("run", "--repo", str(repo), *args, home=tmp_path / "home")
    assert text.returncode == 1, text.stderr
    assert text.stdout == ""  # refused before any job: the error line, and no job
    [line] = text.stderr.splitlines()[-1:]
    assert line.startswith("patchbox: error CONSENT_REQUIRED: the work tree has local changes")
    assert line.endswith("pass --include-local-changes to include them")


@pytest.mark.docker
def test_mcp_says_the_server_option(
    docker_client: docker.DockerClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    del docker_client
    monkeypatch.setenv("PATCHBOX_HOME", str(tmp_path / "home"))
    repo = make_repo(tmp_path / "repo")
    (repo / "app.py").write_text("# a local change\n")
    opts = Options(
        repo=repo,
        task=TaskSpec.model_validate(TASK),
        config=HostConfig(spare_sandboxes=0),
        task_given=True,
    )
    server = build_server(opts, Sessions(lambda: Slot(opts, lambda _m: None)))

    async def scenario() -> dict[str, Any]:
        async with Client(server) as client:
            result = await client.call_tool("list_files", {})
            assert result.is_error
            assert result.structured_content is not None
            content: dict[str, Any] = result.structured_content
            return content

    error = anyio.run(scenario)["error"]
    assert error["code"] == "CONSENT_REQUIRED"
    assert "--" not in error["message"]
    assert error["hint"] == {
        "option": "include_local_changes",
        "text": "start `patchbox mcp` with --include-local-changes to include them",
    }
