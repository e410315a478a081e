"""Injected faults: a bug (:func:`boom`), the Docker engine gone (:func:`engine_gone`), and
the crash reports they may leave."""

from __future__ import annotations

from typing import Any

import docker

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


def engine_gone(*_args: Any, **_kwargs: Any) -> Any:
    """Raises what docker-py lets through when the engine's socket is not there (requests'
    own ``ConnectionError``): a real client of a missing socket asked something."""
    client = docker.DockerClient(base_url="unix:///nonexistent/patchbox-test.sock", version="1.41")
    try:
        client.api.inspect_container("gone")
    finally:
        client.close()
    raise AssertionError("a client of a missing socket answered")


def crash_reports() -> set[str]:
    """The names of the crash reports under ``$PATCHBOX_HOME/crash``."""
    folder = patchbox_home() / "crash"
    return {p.name for p in folder.iterdir()} if folder.exists() else set()
