"""No traceback ever reaches a user: a fault injected at each stage of a job (and in the CLI
around it) gives the error contract (``INTERNAL_ERROR``, exit 70), a crash report under
``$PATCHBOX_HOME`` with the traceback and no secret, the job ``failed``, and no container."""

from __future__ import annotations

import json

import pytest

from controller.cli import main as cli
from controller.errors import ErrorCode
from controller.paths import patchbox_home
from tests.support.faults import (
    SECRET,
    BoomError,
    boom,
    crash_report,
    crash_reports,
    engine_gone,
)


def test_a_fault_in_any_command_gives_internal_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Outside a job (here ``jobs``, with no daemon needed): the error object, exit 70."""
    monkeypatch.setenv("PATCHBOX_TEST_API_KEY", SECRET)
    monkeypatch.setattr("controller.cli.main.settle_leftovers", lambda: None)
    monkeypatch.setattr("controller.cli.commands.JobStore.all", boom)
    code = cli.main(["jobs", "--json"])
    out, err = capsys.readouterr()
    assert code == 70
    error = json.loads(out)["error"]
    assert error["code"] == "INTERNAL_ERROR"
    assert "Traceback" not in out + err
    assert SECRET not in out + err
    report = crash_report(error["message"])
    assert "BoomError" in report
    assert SECRET not in report
    # and without --json: one line on stderr, nothing else
    assert cli.main(["jobs"]) == 70
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("patchbox: error INTERNAL_ERROR: an unexpected error (BoomError)")


def test_crash_reports_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    from controller import crash

    monkeypatch.setattr(crash, "MAX_REPORTS", 3)
    names = []
    for _ in range(5):
        try:
            boom()
        except BoomError as exc:
            names.append(crash.write_report(exc, context="test", repo=""))
    kept = sorted(p.name for p in (patchbox_home() / "crash").iterdir())
    assert [n.removeprefix("crash/") for n in names[-3:]] == kept[-3:]
    assert len(kept) <= 3


def test_an_engine_error_nobody_translated_is_the_engines_failure_not_a_crash() -> None:
    from controller import crash

    try:
        engine_gone()
    except Exception as exc:  # what docker-py raises for it
        gone = exc
    before = crash_reports()
    error = crash.failure_of(gone, context="job x, state running")
    assert error.code == ErrorCode.SANDBOX_FAILED
    assert error.message == "job x, state running: ConnectionError"
    assert crash_reports() == before  # no report for it
    try:
        boom()
    except BoomError as exc:
        internal = crash.failure_of(exc, context="job x, state running")
    assert internal.code == ErrorCode.INTERNAL_ERROR
    assert "BoomError" in crash_report(internal.message)
