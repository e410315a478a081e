"""Helpers of tests/unit/service/test_pin.py and tests/docker/service/test_pin.py."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.support.git import git
from tests.support.jobs import APP, FILES
from tests.support.service import CALLS, TASK

BETA_FILES = FILES | {
    "app.py": APP.replace("name\n", "name  # beta-only\n"),
    "secret.txt": "beta's secret\n",
}
"""Beta's repository: the greeting project (alpha's task would edit it), marked as beta's."""


def submit(client: httpx.Client, repo: Path) -> httpx.Response:
    return client.post("/v1/jobs", json={"repo": str(repo), "task": TASK, "calls": CALLS})


def error_of(response: httpx.Response) -> tuple[int, str, str]:
    body = response.json()
    assert set(body) == {"error"}, body
    return response.status_code, body["error"]["code"], body["error"]["message"]


def beta_marks(beta: Path) -> list[str]:
    """What of beta's repository must never reach alpha."""
    return [git(beta, "rev-parse", "HEAD").strip(), "beta-only", "beta's secret", "secret.txt"]
