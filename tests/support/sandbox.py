"""What the daemon's fixtures in ``tests/conftest.py`` and the tests that use them share."""

from __future__ import annotations

import os
from collections.abc import Callable

from controller.sandbox.docker import DockerSandbox

SandboxFactory = Callable[..., DockerSandbox]
"""``make_sandbox``: starts a sandbox (``runtime=``, ``limits=`` or limit fields)."""


def _require_runsc() -> bool:
    """A missing gVisor runtime fails the test (under CI or ``PATCHBOX_REQUIRE_RUNSC=1``)
    instead of skipping it."""
    return (
        os.environ.get("CI", "").lower() == "true"
        or os.environ.get("PATCHBOX_REQUIRE_RUNSC") == "1"
    )
