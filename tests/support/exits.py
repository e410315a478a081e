"""Helpers of tests/unit/cli/test_exit_codes.py and tests/docker/cli/test_exit_codes.py."""

from __future__ import annotations

import json

from tests.support.jobs import EDIT, GREET, call

TASK = {
    "prompt": "Capitalize the greeting.",
    "checks": {"greet": GREET},
    "limits": {"memory_mb": 512, "workspace_mb": 64, "tmp_mb": 32, "wall_seconds": 120},
}
CALLS = {"turns": [[call("c1", EDIT)]], "final": "done"}


def _error(proc: object) -> str:
    out = json.loads(getattr(proc, "stdout", "") or "{}")
    return str(out["error"]["code"])
