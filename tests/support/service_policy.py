"""Helpers of tests/unit/service/test_policy.py and tests/docker/service/test_policy.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.support.service import CALLS


def error_of(response: Any) -> tuple[int, str, str]:
    body = response.json()
    assert set(body) == {"error"}, body
    return response.status_code, body["error"]["code"], body["error"]["message"]


def not_allowed(tenant: str, *problems: str) -> tuple[int, str, str]:
    """The answer refusing a task of ``tenant`` for ``problems``."""
    message = f"tenant {tenant!r} may not run this task: " + "; ".join(problems)
    return 403, "TASK_NOT_ALLOWED", message


def submit(client: Any, repo: Path, task: dict[str, Any]) -> Any:
    return client.post("/v1/jobs", json={"repo": str(repo), "task": task, "calls": CALLS})


def _py_env(marker: str, *steps: list[str]) -> str:
    """``[environments.py]``: one setup step writing ``marker`` to /opt/m (and ``steps``)."""
    setup = [["sh", "-c", f"echo {marker} > /opt/m"], *steps]
    return f"[environments.py]\nsetup = {json.dumps(setup)}\n"
