"""Helpers of tests/unit/cli/test_cli.py and tests/docker/cli/test_cli.py."""

from __future__ import annotations

import os
import subprocess
import sys


def _patchbox(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "controller", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=600,
        check=False,
    )
