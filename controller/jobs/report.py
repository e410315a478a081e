"""The JUnit XML report of a job: each check's own cases where it wrote them (``junit`` in
the check), one case per check otherwise, and a failing case for a job that failed outside
its checks, so a CI that reads the report never shows a failed job as green. A job that
made no change (``no_change``) is a failing case too, unless the caller accepts it
(``no_change_ok``): then a skipped one."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Literal

from controller.errorinfo import ErrorInfo
from controller.jobs.junit import CASE_TEXT, TestCase
from controller.jobs.records import JobRecord
from controller.logs import Scrubber


def report(record: JobRecord, scrub: Scrubber, *, no_change_ok: bool = False) -> bytes:
    """The job's JUnit XML (see the module docstring)."""
    suites = ET.Element("testsuites", name=f"patchbox {record.job_id}")
    for check in record.checks:
        suite = ET.SubElement(suites, "testsuite", name=scrub.text(check.id))
        if check.tests:
            for case in check.tests:
                _add_case(suite, scrub, case)
            if check.status in {"failed", "timed_out"} and not any(
                c.status in {"failed", "error"} for c in check.tests
            ):  # the command failed although its own cases passed: say so
                _add_case(suite, scrub, _check_case(record, check.id, check.status, check))
        else:
            _add_case(suite, scrub, _check_case(record, check.id, check.status, check))
        _count(suite)
    failed_check = any(c.status in {"failed", "timed_out"} for c in record.checks)
    if record.state in {"failed", "cancelled"} and not failed_check:
        suite = ET.SubElement(suites, "testsuite", name="patchbox")
        error = record.error or ErrorInfo(code=record.state.upper(), message=record.state)
        ET.SubElement(
            ET.SubElement(suite, "testcase", classname="patchbox", name="job"),
            "failure",
            message=scrub.text(f"{error.code}: {error.message}")[:CASE_TEXT],
        ).text = scrub.text(error.message)
        _count(suite)
    if record.state == "no_change":
        suite = ET.SubElement(suites, "testsuite", name="patchbox")
        error = record.error or ErrorInfo(code="NO_CHANGE", message="the job made no change")
        job_case = ET.SubElement(suite, "testcase", classname="patchbox", name="job")
        words = scrub.text(f"{error.code}: {error.message}")[:CASE_TEXT]
        tag = "skipped" if no_change_ok else "failure"
        ET.SubElement(job_case, tag, message=words).text = scrub.text(error.message)
        _count(suite)
    _count(suites)
    data: bytes = ET.tostring(suites, encoding="utf-8", xml_declaration=True)
    return data


def failed_command_report(code: str, message: str) -> bytes:
    """The JUnit XML of a command that ended before any job: one failing case."""
    suites = ET.Element("testsuites", name="patchbox")
    suite = ET.SubElement(suites, "testsuite", name="patchbox")
    case = ET.SubElement(suite, "testcase", classname="patchbox", name="run")
    ET.SubElement(case, "failure", message=f"{code}: {message}"[:CASE_TEXT]).text = message
    _count(suite)
    _count(suites)
    data: bytes = ET.tostring(suites, encoding="utf-8", xml_declaration=True)
    return data


def _check_case(record: JobRecord, check_id: str, status: str, check: object) -> TestCase:
    exit_code = getattr(check, "exit_code", None)
    tail = str(getattr(check, "output_tail", ""))
    kind: Literal["passed", "failed", "error", "skipped"] = (
        "failed"
        if status in {"failed", "timed_out"}
        else "skipped"
        if status == "skipped"
        else "passed"
    )
    reason = getattr(check, "reason", None) or ""
    message = f"{status} (exit {exit_code})" if kind == "failed" else reason
    return TestCase(
        classname=f"patchbox.{record.job_id}",
        name=check_id,
        time=float(getattr(check, "duration_ms", 0)) / 1000,
        status=kind,
        message=message,
        text=tail,
    )


def _add_case(suite: ET.Element, scrub: Scrubber, case: TestCase) -> None:
    element = ET.SubElement(
        suite,
        "testcase",
        classname=scrub.text(case.classname),
        name=scrub.text(case.name),
        time=f"{case.time:.3f}",
    )
    if case.status in {"failed", "error"}:
        tag = "failure" if case.status == "failed" else "error"
        ET.SubElement(element, tag, message=scrub.text(case.message)).text = scrub.text(case.text)
    elif case.status == "skipped":
        ET.SubElement(element, "skipped", message=scrub.text(case.message or "skipped"))
    ET.SubElement(element, "system-out").text = scrub.text(case.text)


def _count(element: ET.Element) -> None:
    cases = list(element.iter("testcase"))
    element.set("tests", str(len(cases)))
    element.set("failures", str(sum(c.find("failure") is not None for c in cases)))
    element.set("errors", str(sum(c.find("error") is not None for c in cases)))
    element.set("skipped", str(sum(c.find("skipped") is not None for c in cases)))
