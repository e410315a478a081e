"""Closing a sandbox whose container Docker is already removing (a claimed spare ends and is
removed by Docker) is a quiet success; any other failure to remove it is logged as an
error. A sandbox closed later is removed on a thread of its own, and the job's ``finish``
waits for that removal (and raises a bug in it). Pure unit tests: the container is a
stand-in that only knows ``remove``."""

from __future__ import annotations

import threading
from collections.abc import MutableMapping
from types import SimpleNamespace
from typing import Any, cast

import docker.errors
import pytest
import structlog.testing

from controller.sandbox.base import SandboxSpec
from controller.sandbox.docker import DockerSandbox
from controller.sandbox.prepare import Prepared
from tests.support.faults import engine_gone


class _Container:
    short_id = "0123456789ab"

    def __init__(self, status: int, explanation: str) -> None:
        self.status = status
        self.explanation = explanation
        self.removed = 0

    def remove(self, **_: Any) -> None:
        self.removed += 1
        response = cast("Any", SimpleNamespace(status_code=self.status))  # what it reads
        raise docker.errors.APIError("remove", response=response, explanation=self.explanation)


def _close(container: _Container) -> list[MutableMapping[str, Any]]:
    spec = SandboxSpec(image="patchbox-sandbox:test", job_id="job-1")
    box = DockerSandbox(cast("Any", None), spec, cast("Any", container))
    with structlog.testing.capture_logs() as logs:
        box.close()
        box.close()  # a second close does nothing
    assert container.removed == 1
    return logs


def test_a_removal_already_in_progress_is_not_an_error() -> None:
    explanation = "removal of container 0123 is already in progress"
    logs = _close(_Container(409, explanation))
    assert [e["event"] for e in logs] == ["sandbox_removal_in_progress"]
    assert logs[0]["log_level"] == "debug"


@pytest.mark.parametrize(
    ("status", "explanation"),
    [(409, "You cannot remove a running container"), (500, "driver failed")],
)
def test_other_failures_are_logged_as_errors(status: int, explanation: str) -> None:
    logs = _close(_Container(status, explanation))
    assert [(e["event"], e["log_level"]) for e in logs] == [("sandbox_remove_failed", "error")]
    assert logs[0]["error"] == explanation


class _GoneEngine:
    """A container whose engine's socket is not there: a real docker-py client of a
    missing socket raises what it raises then (requests' own ``ConnectionError``)."""

    short_id = "0123456789ab"

    def __init__(self) -> None:
        self.removed = 0

    def remove(self, **_: Any) -> None:
        self.removed += 1
        engine_gone()


def test_an_engine_that_is_gone_is_logged_not_raised() -> None:
    logs = _close(cast("Any", _GoneEngine()))
    assert [(e["event"], e["log_level"]) for e in logs] == [("sandbox_remove_failed", "error")]
    assert logs[0]["error"] == "ConnectionError"


def test_a_bug_in_closing_is_raised() -> None:
    class _Broken(_GoneEngine):
        def remove(self, **_: Any) -> None:
            raise KeyError("a bug")

    spec = SandboxSpec(image="patchbox-sandbox:test", job_id="job-1")
    box = DockerSandbox(cast("Any", None), spec, cast("Any", _Broken()))
    with pytest.raises(KeyError):
        box.close()


class _SlowRemoval:
    """A container whose removal takes a while and notes the thread it ran on."""

    short_id = "0123456789ab"

    def __init__(self, error: Exception | None = None) -> None:
        self.started = threading.Event()
        self.release = threading.Event()
        self.removed_on: list[str] = []
        self.error = error

    def remove(self, **_: Any) -> None:
        self.started.set()
        assert self.release.wait(10)
        self.removed_on.append(threading.current_thread().name)
        if self.error is not None:
            raise self.error


def _prepared(container: _SlowRemoval) -> Prepared:
    spec = SandboxSpec(image="patchbox-sandbox:test", job_id="job-1")
    box = DockerSandbox(cast("Any", None), spec, cast("Any", container))
    return Prepared(box, cast("Any", None), cast("Any", None), "spare", {})


def test_a_sandbox_closed_later_is_removed_on_its_own_thread_and_finish_waits() -> None:
    container = _SlowRemoval()
    prepared = _prepared(container)
    prepared.close_later()
    assert container.started.wait(10)  # the removal began; the caller went on
    assert container.removed_on == []
    threading.Timer(0.2, container.release.set).start()
    assert prepared.finish() is None  # returns only once the removal is done
    assert container.removed_on == ["sandbox-close"]
    assert not any(t.name == "sandbox-close" for t in threading.enumerate())


def test_a_bug_in_a_removal_closed_later_is_raised_by_finish() -> None:
    container = _SlowRemoval(KeyError("a bug"))
    container.release.set()
    prepared = _prepared(container)
    prepared.close_later()
    with pytest.raises(KeyError):
        prepared.finish()
    assert prepared.finish() is None  # raised once
