"""What a command writes on stderr and into the log file: progress lines with the time since
the start (none with ``--quiet``), log lines as console text or JSON (``--log-format``), debug
events with ``--verbose``, every event in ``$PATCHBOX_HOME/logs/patchbox.log``, whole lines
that never interleave, and a heartbeat while one step lasts."""

from __future__ import annotations

import io
import json
import sys
import threading
import time
from pathlib import Path

import pytest
import structlog

from controller.config.task import TaskSpec
from controller.jobs.engine import Job
from controller.jobs.request import JobRequest
from controller.logs import configure, write_line
from controller.providers import ScriptedProvider, parse_calls
from tests.support.cli import patchbox


@pytest.fixture
def home(tmp_path: Path) -> Path:
    folder = tmp_path / "home"
    folder.mkdir()
    return folder


def test_verbose_json_logs_and_the_log_file(home: Path) -> None:
    proc = patchbox("jobs", "--verbose", "--log-format", "json", home=home)
    assert proc.returncode == 0, proc.stderr
    events = [json.loads(line) for line in proc.stderr.splitlines()]
    assert [(e["event"], e["level"], e["command"]) for e in events] == [
        ("command", "debug", "jobs")
    ]
    quiet = patchbox("--quiet", "jobs", home=home)
    assert (quiet.returncode, quiet.stderr) == (0, "")
    logged = (home / "logs" / "patchbox.log").read_text().splitlines()
    assert [json.loads(line)["command"] for line in logged] == ["jobs", "jobs"]
    both = patchbox("jobs", "--quiet", "--verbose", "--json", home=home)
    assert (both.returncode, json.loads(both.stdout)["error"]["code"]) == (2, "USAGE_ERROR")


def test_the_heartbeat_names_the_step_that_lasts(tmp_path: Path) -> None:
    said: list[str] = []
    request = JobRequest(
        repo=tmp_path,
        task=TaskSpec(prompt="p"),
        provider=ScriptedProvider(parse_calls('{"turns": []}')),
    )
    job = Job(None, request, progress=said.append)  # type: ignore[arg-type]  # no daemon used
    with job._heartbeat(every=0.05):
        job._doing("running check slow")
        time.sleep(0.4)
    assert said
    assert all(s.startswith("still running check slow (") for s in said)
    count = len(said)
    time.sleep(0.2)
    assert len(said) == count  # it stopped with the block


def test_progress_and_log_lines_never_interleave(monkeypatch: pytest.MonkeyPatch) -> None:
    captured = io.StringIO()
    monkeypatch.setattr(sys, "stderr", captured)
    configure(json_output=True)
    log = structlog.get_logger("test")

    def progress() -> None:
        for i in range(300):
            write_line(f"patchbox: [   0.0s] step {i} " + "p" * 200)

    def logs() -> None:
        for i in range(300):
            log.info("event", n=i, text="l" * 200)

    threads = [threading.Thread(target=progress), threading.Thread(target=logs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    lines = captured.getvalue().splitlines()
    assert len(lines) == 600
    for line in lines:
        if not line.startswith("patchbox: "):
            assert json.loads(line)["event"] == "event"
    configure()


def _fail() -> None:
    raise ValueError("the cause")


def test_console_lines_show_a_failure_as_a_plain_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    """The console lines' traceback is Python's own text whatever is installed beside
    patchbox (rich is, here: the development tools bring it)."""
    captured = io.StringIO()
    monkeypatch.setattr(sys, "stderr", captured)
    configure()
    try:
        _fail()
    except ValueError:
        structlog.get_logger("test").exception("it_failed")
    text = captured.getvalue()
    assert "it_failed" in text
    assert "Traceback (most recent call last):" in text
    assert "ValueError: the cause" in text
    assert "╭" not in text  # rich's framed traceback
