"""Helpers of tests/unit/cli/test_remote.py and tests/docker/cli/test_remote.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from controller.client import ServiceClient
from tests.support.cli import patchbox
from tests.support.service import CALLS, TASK, TOKENS


def remote(running: Any, *args: str, token: str | None = None) -> Any:
    """``patchbox remote ARGS --server URL`` with alpha's token (or ``token``)."""
    env = {"PATCHBOX_TOKEN": TOKENS["alpha"] if token is None else token}
    return patchbox("remote", *args, "--server", running.url, env=env)


def files_for(folder: Path) -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "task.json").write_text(json.dumps(TASK))
    (folder / "calls.json").write_text(json.dumps(CALLS))
    return ["--task", str(folder / "task.json"), "--calls", str(folder / "calls.json")]


def error_of(proc: Any) -> dict[str, Any]:
    """The ``--json`` error object of a failed command."""
    data: dict[str, Any] = json.loads(proc.stdout)["error"]
    return data


def service_client(running: Any, tenant: str = "alpha") -> ServiceClient:
    return ServiceClient(running.url, TOKENS[tenant])


def data_dir(running: Any) -> Path:
    return Path(running.service.config.data_path())
