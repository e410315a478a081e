"""The checks before the change (pure parts): which runs count as "cannot run", the
before/after table, the decision with it, the summary, the JUnit report of a job that made
no change. No Docker."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Any, Literal

import pytest

from controller.config.task import CheckSpec, task_from
from controller.errorinfo import ErrorInfo
from controller.errors import ErrorCode, ExitCode, exit_code_for_error
from controller.jobs.baselinechecks import (
    baseline_result,
    cannot_run,
    cannot_run_error,
    check_changes,
    is_pytest,
)
from controller.jobs.decision import DecisionInputs, decide
from controller.jobs.records import BaselineCheck, CheckResult, FileChange, JobRecord
from controller.jobs.report import report
from controller.jobs.summary import summary_text
from controller.logs import Scrubber
from controller.sandbox.base import RunResult

PYTEST = ["python3", "-m", "pytest", "-q"]


def run(
    code: int | None = 0,
    output: str = "",
    *,
    spawn_error: str | None = None,
    timed_out: bool = False,
) -> RunResult:
    return RunResult(
        exit_code=code,
        signal=None,
        timed_out=timed_out,
        cancelled=False,
        spawn_error=spawn_error,
        output=output,
        output_bytes=len(output),
        truncated=False,
        duration_ms=7,
    )


COLLECTION = (
    "==================================== ERRORS ====================================\n"
    "_____________________ ERROR collecting tests/test_app.py ______________________\n"
    "ImportError while importing test module '/workspace/tests/test_app.py'.\n"
    "E   ModuleNotFoundError: No module named '{name}'\n"
    "=========================== short test summary info ============================\n"
    "ERROR tests/test_app.py\n"
    "!!!!!!!!!!!!!!!!!!!! Interrupted: 1 error during collection !!!!!!!!!!!!!!!!!!!!\n"
    "1 error in 0.05s\n"
)


@pytest.mark.parametrize(
    ("argv", "result", "words"),
    [
        (["nosuch"], run(None, spawn_error="No such file or directory"), "could not be started"),
        (["sh", "-c", "nosuch"], run(127, "sh: 1: nosuch: not found\n"), "not found (exit 127)"),
        (["./t.sh"], run(126), "cannot be executed (exit 126)"),
        (
            PYTEST,
            run(1, "/usr/bin/python3: No module named pytest\n"),
            "python has no module 'pytest'",
        ),
        (PYTEST, run(4, "ImportError while loading conftest '/workspace/conftest.py'."), "exit 4"),
        (["pytest", "--cov"], run(4, "error: unrecognized arguments: --cov"), "exit 4"),
        (PYTEST, run(2, COLLECTION.format(name="yaml")), "no module yaml (exit 2)"),
    ],
    ids=["spawn", "127", "126", "python-m", "conftest", "option", "collection"],
)
def test_what_cannot_run(argv: list[str], result: RunResult, words: str) -> None:
    reason = cannot_run(argv, result)
    assert reason is not None
    assert words in reason


@pytest.mark.parametrize(
    ("argv", "result"),
    [
        (PYTEST, run(0)),
        (PYTEST, run(1, "FAILED tests/test_app.py::test_x - assert 1 == 2\n1 failed\n")),
        (PYTEST, run(5, "no tests ran in 0.01s\n")),
        (PYTEST, run(2, COLLECTION.format(name="app.new"))),  # the task's to create
        (PYTEST, run(2, "!!! Interrupted: 1 error during collection !!!\nSyntaxError\n")),
        (["make", "test"], run(4, "ModuleNotFoundError: No module named 'x'")),
        (["make", "test"], run(2, COLLECTION.format(name="yaml"))),
        (["sh", "-c", "exit 127"], run(None, timed_out=True)),
    ],
    ids=["pass", "fail", "no-tests", "dotted", "syntax", "not-pytest-4", "not-pytest-2", "timeout"],
)
def test_what_runs_failing_or_not(argv: list[str], result: RunResult) -> None:
    assert cannot_run(argv, result) is None


def test_pytest_is_recognised() -> None:
    assert is_pytest(["pytest"])
    assert is_pytest(["/usr/local/bin/py.test", "-x"])
    assert is_pytest(["python3", "-m", "pytest"])
    assert not is_pytest(["python3", "-m", "unittest"])
    assert not is_pytest(["echo", "pytest"])
    assert not is_pytest([])


def test_a_baseline_result_and_the_error_for_one_that_cannot_run() -> None:
    spec = CheckSpec(argv=["sh", "-c", "nosuch"])
    broken = baseline_result("tests", spec, run(127, "sh: nosuch: \u202enot found\x1b[2K\n"))
    assert broken.status == "cannot_run"
    assert broken.output_tail == "sh: nosuch: not found\n"  # cleaned of escapes and bidi
    failing = baseline_result("lint", spec, run(1, "bad\n"))
    assert (failing.status, failing.reason) == ("failed", None)
    assert baseline_result("t", spec, run(None, timed_out=True)).status == "timed_out"
    assert baseline_result("t", spec, run(0)).status == "passed"
    assert cannot_run_error([failing]) is None
    error = cannot_run_error([failing, broken])
    assert error is not None
    assert error.code is ErrorCode.CHECK_CANNOT_RUN
    assert error.hint is not None
    assert error.hint.action == "use_environment"
    assert "tests: the command was not found (exit 127)" in error.message
    assert "lint" not in error.message


def before(check_id: str, status: Literal["passed", "failed", "timed_out", "cannot_run"]) -> Any:
    return BaselineCheck(id=check_id, status=status, exit_code=0, duration_ms=1, output_tail="")


def after(
    check_id: str,
    status: Literal["passed", "failed", "timed_out", "skipped"],
    *,
    required: bool = True,
) -> CheckResult:
    return CheckResult(
        id=check_id,
        status=status,
        exit_code=0 if status == "passed" else 1,
        duration_ms=1,
        output_tail="",
        diff_sha256="0" * 64,
        required=required,
        source="docker-exec",
    )


def test_the_before_after_table() -> None:
    rows = check_changes(
        [
            before("fixed", "failed"),
            before("still", "timed_out"),
            before("newly", "passed"),
            before("fine", "passed"),
            before("optional", "failed"),
        ],
        [
            after("fixed", "passed"),
            after("still", "failed"),
            after("newly", "failed"),
            after("fine", "passed"),
            after("optional", "passed", required=False),
            after("unseen", "failed"),  # no baseline run: no row
        ],
    )
    assert [(r.id, r.before, r.after, r.change) for r in rows] == [
        ("fixed", "failed", "passed", "fixed"),
        ("still", "timed_out", "failed", "still_failing"),
        ("newly", "passed", "failed", "newly_failing"),
        ("fine", "passed", "passed", "still_passing"),
    ]
    assert check_changes([], [after("x", "failed")]) == []
    assert check_changes([before("x", "failed")], [after("x", "skipped")]) == []


def inputs(mode: str, checks: list[CheckResult], baseline: list[BaselineCheck]) -> DecisionInputs:
    return DecisionInputs(
        mode=mode,
        allow_auto=True,
        allow_trusted_auto=False,
        consent_trusted_auto=False,
        checks=checks,
        files=[FileChange(path="app.py", kind="modify", added=1, removed=1)],
        baseline_unchanged=True,
        baseline=baseline,
    )


def test_a_check_failing_before_and_after_still_fails_the_job_and_is_named() -> None:
    decision = decide(inputs("review", [after("t", "failed")], [before("t", "failed")]))
    assert decision.failed_checks == ["t"]
    assert decision.still_failing == ["t"]
    assert decision.check_changes is not None
    assert decision.check_changes[0].change == "still_failing"


def test_a_check_newly_failing_fails_the_job() -> None:
    decision = decide(inputs("review", [after("t", "failed")], [before("t", "passed")]))
    assert decision.failed_checks == ["t"]
    assert decision.still_failing is None
    assert decision.check_changes is not None
    assert decision.check_changes[0].change == "newly_failing"


def test_without_a_baseline_run_a_failing_check_fails_the_job_as_before() -> None:
    decision = decide(inputs("review", [after("t", "failed")], []))
    assert decision.failed_checks == ["t"]
    assert decision.check_changes is None


def test_auto_never_applies_with_a_check_still_failing() -> None:
    still = decide(
        inputs("auto", [after("t", "failed"), after("u", "passed")], [before("t", "failed")])
    )
    assert not still.applied
    assert still.gates["checks_passed"] is False
    assert still.still_failing == ["t"]
    assert still.failed_checks == ["t"]
    fixed = decide(inputs("auto", [after("t", "passed")], [before("t", "failed")]))
    assert fixed.applied
    assert fixed.check_changes is not None
    assert [r.change for r in fixed.check_changes] == ["fixed"]


def test_the_summary_shows_the_runs_before_and_the_table() -> None:
    record = JobRecord(job_id="j", repo="/r")
    record.baseline_checks = [before("t", "failed")]
    record.checks = [after("t", "passed")]
    record.decision = decide(inputs("review", record.checks, record.baseline_checks))
    text = summary_text(record)
    assert "check t before the change: failed" in text
    assert "checks before -> after the change:\n  t: fixed (failed -> passed)" in text


def test_the_task_option_and_its_default() -> None:
    assert task_from({"prompt": "p"}).baseline_checks is True
    assert task_from({"prompt": "p", "baseline_checks": False}).baseline_checks is False


def no_change_record() -> JobRecord:
    record = JobRecord(job_id="j", repo="/r")
    for state in ("preparing", "running", "validating", "no_change"):
        record.move(state)
    record.error = ErrorInfo(code="NO_CHANGE", message="the job made no change")
    return record


def test_a_job_with_no_change_fails_its_report_unless_accepted() -> None:
    record = no_change_record()
    scrub = Scrubber("/r")
    failing = ET.fromstring(report(record, scrub))  # noqa: S314 - our own output
    assert failing.get("failures") == "1"
    failure = failing.find(".//failure")
    assert failure is not None
    assert "NO_CHANGE" in (failure.get("message") or "")
    accepted = ET.fromstring(report(record, scrub, no_change_ok=True))  # noqa: S314
    assert (accepted.get("failures"), accepted.get("skipped")) == ("0", "1")
    assert exit_code_for_error("NO_CHANGE") is ExitCode.NO_CHANGE
    assert int(ExitCode.NO_CHANGE) == 5
