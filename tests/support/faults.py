"""Helpers of tests/unit/cli/test_internal_error.py and tests/docker/cli/test_internal_error.py."""

from __future__ import annotations

from typing import Any

from controller.paths import patchbox_home

SECRET = "sk-crash-9f8e7d6c5b4a3210"  # noqa: S105 - a planted fake key
"""Planted in the environment and in the injected exception's message."""


class BoomError(RuntimeError):
    pass


def boom(*_args: Any, **_kwargs: Any) -> Any:
    msg = f"injected fault with key {SECRET}"
    raise BoomError(msg)


def crash_report(message: str) -> str:
    name = message.split("crash report is ", 1)[1].split(" ", 1)[0]
    assert name.startswith("crash/")
    return (patchbox_home() / name).read_text()
