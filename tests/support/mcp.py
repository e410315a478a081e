"""Helpers of the MCP tests (tests/unit/mcp and tests/docker/mcp): the session's task, a
server's arguments, reading tool results."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mcp.client.stdio import StdioServerParameters

from controller.jobs.records import JobRecord
from controller.jobs.store import JobStore
from controller.tools.schemas import tool_schemas
from tests.support.jobs import GREET
from tests.support.paths import REPO_ROOT

LIMITS = {"memory_mb": 512, "workspace_mb": 64, "tmp_mb": 32, "wall_seconds": 300}
TASK: dict[str, Any] = {
    "prompt": "Capitalize the greeting.",
    "checks": {"greet": GREET},
    "limits": LIMITS,
}
LOOP_TOOLS = [t["name"] for t in tool_schemas()]
ROOT = REPO_ROOT
EDIT = {"path": "app.py", "oldText": '"hello "', "newText": '"Hello "'}


def data(result: Any) -> dict[str, Any]:
    """A tool result's structured content, checked to be the JSON of its text too."""
    assert result.structured_content is not None
    assert json.loads(result.content[0].text) == result.structured_content
    content: dict[str, Any] = result.structured_content
    return content


def code(result: Any) -> str:
    assert result.is_error
    return str(data(result)["error"]["code"])


def server_args(
    folder: Path, repo: Path, task: dict[str, Any] | None = None, config: str = ""
) -> list[str]:
    """``-m controller mcp`` with a task and a config file (no spare sandboxes)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "task.json").write_text(json.dumps(task or TASK))
    (folder / "config.toml").write_text("spare_sandboxes = 0\n" + config)
    return [
        *("-m", "controller", "mcp", "--repo", str(repo)),
        *("--task", str(folder / "task.json"), "--config", str(folder / "config.toml")),
    ]


def stdio(args: list[str]) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable, args=args, env=dict(os.environ), cwd=str(ROOT)
    )


def the_job(repo: Path) -> JobRecord:
    """The one job of ``repo`` (each test makes its own repository)."""
    found = [r for r in JobStore().all() if r.repo == str(repo.resolve())]
    assert len(found) == 1, [r.job_id for r in found]
    return found[0]


def until(condition: Callable[[], bool], seconds: float = 20.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()
