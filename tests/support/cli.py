"""The ``patchbox`` command in a subprocess, as a user runs it, and the files a job reads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.support.paths import REPO_ROOT

ROOT = REPO_ROOT


def patchbox(
    *args: str,
    home: Path | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 300,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """``python3 -m controller ARGS`` from the checkout (or ``cwd``, with the checkout on
    ``PYTHONPATH``), with the test run's environment, ``PATCHBOX_HOME=home`` when given,
    and ``env`` on top."""
    full = {**os.environ, **(env or {})}
    if home is not None:
        full["PATCHBOX_HOME"] = str(home)
    if cwd is not None:
        paths = [str(ROOT), str(ROOT / "sandbox-image"), full.get("PYTHONPATH")]
        full["PYTHONPATH"] = os.pathsep.join(filter(None, paths))
    return subprocess.run(
        [sys.executable, "-m", "controller", *args],
        capture_output=True,
        text=True,
        env=full,
        cwd=cwd or ROOT,
        timeout=timeout,
        check=False,
    )


def job_files(
    folder: Path,
    task: dict[str, Any],
    calls: dict[str, Any],
    config: str = "spare_sandboxes = 0\n",
) -> list[str]:
    """Writes the task, calls and config files into ``folder``; returns their arguments."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "task.json").write_text(json.dumps(task))
    (folder / "calls.json").write_text(json.dumps(calls))
    (folder / "config.toml").write_text(config)
    return [
        "--task",
        str(folder / "task.json"),
        "--calls",
        str(folder / "calls.json"),
        "--config",
        str(folder / "config.toml"),
    ]
