"""Helpers of tests/unit/service/test_service.py and tests/docker/service/test_service.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support.service import (
    TASK,
)

JOB_PATHS = ("", "/diff", "/evidence", "/events")
JOB_ACTIONS = ("/cancel", "/apply", "/revert", "/discard")


def error_of(response: Any) -> str:
    body = response.json()
    assert set(body) == {"error"}, body
    assert set(body["error"]) == {"code", "message"}, body
    return str(body["error"]["code"])


def submit(client: Any, repo: Path, task: dict[str, Any] = TASK, **extra: Any) -> Any:
    return client.post("/v1/jobs", json={"repo": str(repo), "task": task, **extra})
