"""Helpers of tests/unit/mcp/test_mcp.py and tests/docker/mcp/test_mcp.py."""

from __future__ import annotations

import json
from typing import Any

from controller.tools.schemas import tool_schemas
from tests.support.jobs import GREET

LIMITS = {"memory_mb": 512, "workspace_mb": 64, "tmp_mb": 32, "wall_seconds": 300}
TASK: dict[str, Any] = {
    "prompt": "Capitalize the greeting.",
    "checks": {"greet": GREET},
    "limits": LIMITS,
}
LOOP_TOOLS = [t["name"] for t in tool_schemas()]


def data(result: Any) -> dict[str, Any]:
    """A tool result's structured content, checked to be the JSON of its text too."""
    assert result.structured_content is not None
    assert json.loads(result.content[0].text) == result.structured_content
    content: dict[str, Any] = result.structured_content
    return content


def code(result: Any) -> str:
    assert result.is_error
    return str(data(result)["error"]["code"])
