"""JUnit XML a check wrote itself (``junit`` in the check), read back safely: its test
cases (the job's report is :mod:`controller.jobs.report`).

A check's file is written by the repository's code: it is bounded, refused when it holds a
DOCTYPE or an entity (no expansion can blow up), and only test cases are taken from it.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Literal

from pydantic import BaseModel, ConfigDict

MAX_JUNIT_BYTES = 4 * 1024 * 1024
MAX_CASES = 5000
CASE_TEXT = 4096


class JunitError(ValueError):
    """The check's JUnit file cannot be used (the message says why)."""


class TestCase(BaseModel):
    """One test case from a check's JUnit XML."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    __test__ = False  # not a pytest class

    classname: str = ""
    name: str
    time: float = 0.0
    status: Literal["passed", "failed", "error", "skipped"]
    message: str = ""
    text: str = ""


def parse_cases(data: bytes) -> list[TestCase]:
    """The test cases of a JUnit XML document (``testsuites``, ``testsuite`` or a bare
    ``testcase``). Raises :class:`JunitError` for a file too large, with a DOCTYPE or an
    entity, not well-formed, or with more than :data:`MAX_CASES` cases."""
    if len(data) > MAX_JUNIT_BYTES:
        msg = f"larger than {MAX_JUNIT_BYTES} bytes"
        raise JunitError(msg)
    head = data.upper()
    if b"<!DOCTYPE" in head or b"<!ENTITY" in head:
        msg = "it has a DOCTYPE or an entity declaration"
        raise JunitError(msg)
    try:
        root = ET.fromstring(data)  # noqa: S314 - bounded, no DOCTYPE, no entity
    except ET.ParseError as exc:
        msg = f"not well-formed XML ({exc})"
        raise JunitError(msg) from None
    found = [root] if root.tag == "testcase" else list(root.iter("testcase"))
    if len(found) > MAX_CASES:
        msg = f"more than {MAX_CASES} test cases"
        raise JunitError(msg)
    return [_case(element) for element in found]


def _case(element: ET.Element) -> TestCase:
    status: Literal["passed", "failed", "error", "skipped"] = "passed"
    message, text = "", ""
    for tag, kind in (("failure", "failed"), ("error", "error"), ("skipped", "skipped")):
        child = element.find(tag)
        if child is not None:
            status = kind  # type: ignore[assignment]
            message = (child.get("message") or "")[:CASE_TEXT]
            text = (child.text or "")[-CASE_TEXT:]
            break
    try:
        seconds = float(element.get("time") or 0)
    except ValueError:
        seconds = 0.0
    return TestCase(
        classname=(element.get("classname") or "")[:512],
        name=(element.get("name") or "unnamed")[:512],
        time=seconds if seconds >= 0 else 0.0,
        status=status,
        message=message,
        text=text,
    )
