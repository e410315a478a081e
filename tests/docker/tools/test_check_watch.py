"""A check the caller waits on a bounded time and polls (``waitSeconds``, the handle form), on
the real daemon under runc and runsc, through the Python API's session: a 10-minute check that
prints in a loop answers ``running`` within ``waitSeconds`` + 0.5 s with its first lines; a
poll answers only the lines since the last answer; reads work while it runs, writes and a
second check are refused; an unknown or answered handle is refused; a timed-out check
answers its last output; the job's end kills a check still running; the output reaches the
call's ``on_output`` and the stream form (``Session.stream``) as it comes; ``max_tool_calls``
and ``wall_seconds`` end the job; cancel leaves no container."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import docker
import pytest

from controller import api
from controller.api.session import CallResult, Session
from controller.config.host import HostConfig
from controller.config.task import TaskSpec
from controller.errors import PatchboxError
from controller.sandbox.base import Runtime
from controller.tools.watch import CheckLine
from tests.support.jobs import APP, containers_of, make_repo

pytestmark = pytest.mark.docker

LOOP = {
    "argv": ["sh", "-c", 'i=0; while :; do echo "line $i"; i=$((i+1)); sleep 0.2; done'],
    "timeout_seconds": 600,
}
"""A check that prints a numbered line five times a second for 10 minutes."""
SHORT = {
    "argv": ["sh", "-c", 'i=0; while :; do echo "tick $i"; i=$((i+1)); sleep 0.1; done'],
    "timeout_seconds": 2,
}
"""A check that prints until its 2-second time limit kills it."""
CONFIG = HostConfig(spare_sandboxes=0)
EDIT = {"path": "app.py", "oldText": '"hello "', "newText": '"Hello "'}


def _task(limits: dict[str, int] | None = None) -> TaskSpec:
    return TaskSpec.model_validate(
        {
            "prompt": "watch checks",
            "checks": {"loop": LOOP, "short": SHORT},
            "baseline_checks": False,
            "limits": {"memory_mb": 512, "workspace_mb": 64, "tmp_mb": 32, "wall_seconds": 300}
            | (limits or {}),
        }
    )


def _numbers(output: str) -> list[int]:
    return [int(n) for n in re.findall(r"^line (\d+)$", output, re.MULTILINE)]


def _open(client: docker.DockerClient, repo: Path, runtime: Runtime, **limits: int) -> Session:
    return api.open_session(repo, task=_task(limits), config=CONFIG, client=client, runtime=runtime)


def _refused_while_running(session: Session, handle: str) -> None:
    """Reads go on while the check runs; writes and a second check are refused, with the
    handle named; an unknown handle is refused."""
    read = session.call("read_file", {"path": "app.py"})
    assert read.ok
    assert (read.result or {})["content"] == APP
    assert session.call("list_files", {}).ok
    assert session.call("search_text", {"query": "greet"}).ok
    edit = session.call("replace_text", EDIT)
    assert (edit.ok, edit.code) == (False, "TOOL_CHECK_RUNNING")
    assert edit.error is not None
    assert handle in edit.error["message"]
    patch = "--- a/app.py\n+++ b/app.py\n@@ -1 +1 @@\n-def greet(name):\n+def greet(who):\n"
    assert session.call("apply_patch", {"patch": patch}).code == "TOOL_CHECK_RUNNING"
    second = session.call("run_check", {"checkId": "short"})
    assert (second.ok, second.code) == (False, "TOOL_CHECK_RUNNING")
    unknown = session.call("run_check", {"handle": "chk_000000000000", "waitSeconds": 1})
    assert (unknown.ok, unknown.code) == (False, "TOOL_HANDLE_UNKNOWN")
    odd = session.call("run_check", {"handle": "chk_\u00e9\u202e\x00"})
    assert odd.code == "TOOL_HANDLE_UNKNOWN"
    assert odd.error is not None
    assert "\u202e" not in odd.error["message"]
    both = session.call("run_check", {"checkId": "loop", "handle": handle})
    assert both.code == "TOOL_ARGUMENTS_INVALID"


@pytest.mark.usefixtures("sandbox_image")
def test_a_long_check_yields_is_polled_and_guards_the_tree(
    docker_client: docker.DockerClient, tmp_path: Path, runtime: Runtime
) -> None:
    repo = make_repo(tmp_path / "repo")
    told: list[Any] = []
    with _open(docker_client, repo, runtime) as session:
        started = time.monotonic()
        first = session.call(
            "run_check", {"checkId": "loop", "waitSeconds": 2}, on_output=told.append
        )
        took = time.monotonic() - started
        assert took < 2.5, took
        assert first.ok, first.error
        result = first.result or {}
        assert (result["status"], result["checkId"]) == ("running", "loop")
        assert result["verdict"] == "loop: running"
        assert result["elapsedSeconds"] >= 1.5
        seen = _numbers(result["output"])
        assert seen[:2] == [0, 1], result["output"]
        handle = result["handle"]
        # the callback had the lines as they came, the same ones
        assert [t.line for t in told][: len(seen)] == [f"line {n}" for n in seen]
        assert {(t.check_id, t.handle) for t in told} == {("loop", handle)}

        _refused_while_running(session, handle)

        # each poll answers only the lines since the last answer, within its wait
        last = seen[-1]
        for _ in range(2):
            told.clear()
            started = time.monotonic()
            poll = session.call(
                "run_check", {"handle": handle, "waitSeconds": 1}, on_output=told.append
            )
            assert time.monotonic() - started < 1.5
            assert poll.ok, poll.error
            body = poll.result or {}
            assert (body["status"], body["handle"]) == ("running", handle)
            numbers = _numbers(body["output"])
            assert numbers, body
            assert numbers[0] == last + 1, (last, numbers)
            assert numbers == list(range(numbers[0], numbers[0] + len(numbers)))
            assert told
            last = numbers[-1]
        job_id = session.job_id
        assert containers_of(docker_client, job_id)
    # closing the session cancels the job: the check dies with its container
    assert session.record.state == "cancelled"
    assert containers_of(docker_client, job_id) == []


@pytest.mark.usefixtures("sandbox_image")
def test_a_timed_out_check_answers_its_last_output(
    docker_client: docker.DockerClient, tmp_path: Path, runtime: Runtime
) -> None:
    repo = make_repo(tmp_path / "repo")
    with _open(docker_client, repo, runtime) as session:
        first = session.call("run_check", {"checkId": "short", "waitSeconds": 0.5})
        assert (first.result or {})["status"] == "running"
        handle = (first.result or {})["handle"]
        done = session.call("run_check", {"handle": handle})
        body = done.result or {}
        assert (body["status"], body["signal"], body["verdict"]) == (
            "timed_out",
            9,
            "short: timed out",
        )
        ticks = [int(n) for n in re.findall(r"^tick (\d+)$", body["output"], re.MULTILINE)]
        assert ticks[0] == 0
        assert ticks[-1] >= 10, body["output"]  # the lines up to the kill, none lost
        assert ticks == list(range(len(ticks)))
        answered = session.call("run_check", {"handle": handle})
        assert answered.code == "TOOL_HANDLE_UNKNOWN"
        assert answered.error is not None
        assert "has ended" in answered.error["message"]
        # once the check ended, writes work again
        assert session.call("replace_text", EDIT).ok
        # without waitSeconds a call waits for the end, as before
        whole = session.call("run_check", {"checkId": "short"})
        assert (whole.result or {})["status"] == "timed_out"


@pytest.mark.usefixtures("sandbox_image")
def test_polls_count_as_calls_and_the_limit_ends_the_job(
    docker_client: docker.DockerClient, tmp_path: Path, runtime: Runtime
) -> None:
    repo = make_repo(tmp_path / "repo")
    with _open(docker_client, repo, runtime, max_tool_calls=3) as session:
        first = session.call("run_check", {"checkId": "loop", "waitSeconds": 0.5})
        handle = (first.result or {})["handle"]
        assert session.call("run_check", {"handle": handle, "waitSeconds": 0.5}).ok
        assert session.call("run_check", {"handle": handle, "waitSeconds": 0.5}).ok
        with pytest.raises(PatchboxError) as raised:
            session.call("run_check", {"handle": handle, "waitSeconds": 0.5})
        assert raised.value.code == "LIMIT_EXCEEDED"
        job_id = session.job_id
    assert containers_of(docker_client, job_id) == []


@pytest.mark.usefixtures("sandbox_image")
def test_the_wall_clock_ends_a_job_that_waits_on_a_check(
    docker_client: docker.DockerClient, tmp_path: Path, runtime: Runtime
) -> None:
    repo = make_repo(tmp_path / "repo")
    with _open(docker_client, repo, runtime, wall_seconds=6) as session:
        started = time.monotonic()
        with pytest.raises(PatchboxError) as raised:
            session.call("run_check", {"checkId": "loop"})
        assert raised.value.code == "LIMIT_EXCEEDED"
        assert time.monotonic() - started < 20
        job_id = session.job_id
    assert session.record.state == "failed"
    assert containers_of(docker_client, job_id) == []


@pytest.mark.usefixtures("sandbox_image")
def test_the_jobs_end_kills_a_check_still_running(
    docker_client: docker.DockerClient, tmp_path: Path, runtime: Runtime
) -> None:
    repo = make_repo(tmp_path / "repo")
    with _open(docker_client, repo, runtime) as session:
        first = session.call("run_check", {"checkId": "loop", "waitSeconds": 0.5})
        assert (first.result or {})["status"] == "running"
        started = time.monotonic()
        proposal = session.propose("nothing to change")
        assert time.monotonic() - started < 30
        assert proposal.status == "no_change"
        job_id = session.job_id
    assert containers_of(docker_client, job_id) == []


@pytest.mark.usefixtures("sandbox_image")
def test_the_stream_form_gives_the_lines_as_they_come_then_the_result(
    docker_client: docker.DockerClient, tmp_path: Path, runtime: Runtime
) -> None:
    repo = make_repo(tmp_path / "repo")
    with _open(docker_client, repo, runtime) as session:
        started = time.monotonic()
        items = [
            (time.monotonic() - started, item)
            for item in session.stream("run_check", {"checkId": "loop", "waitSeconds": 2})
        ]
        *lines, (ended, last) = items
        assert isinstance(last, CallResult)
        assert last.ok, last.error
        body = last.result or {}
        assert body["status"] == "running"
        assert all(isinstance(line, CheckLine) for _, line in lines)
        told = [line.line for _, line in lines if isinstance(line, CheckLine)]
        seen = _numbers(body["output"])
        assert told[: len(seen)] == [f"line {n}" for n in seen]
        # the first line came as it was printed, well before the call's answer
        assert lines[0][0] < ended - 1.0, (lines[0][0], ended)
        # a tool without output: the result alone; a poll streams only the new lines
        only = list(session.stream("read_file", {"path": "app.py"}))
        assert len(only) == 1
        assert isinstance(only[0], CallResult)
        assert only[0].ok
        polled = list(session.stream("run_check", {"handle": body["handle"], "waitSeconds": 1}))
        numbers = [int(x.line.split()[1]) for x in polled if isinstance(x, CheckLine)]
        assert numbers
        assert numbers[0] > seen[-1]
        # leaving a stream early waits for its call: the next call works at once
        for _ in session.stream("run_check", {"handle": body["handle"], "waitSeconds": 1}):
            break
        assert session.call("list_files", {}).ok
    # once the session ended, the stream raises the call's error
    with pytest.raises(PatchboxError) as raised:
        list(session.stream("list_files", {}))
    assert raised.value.code == "USAGE_ERROR"
