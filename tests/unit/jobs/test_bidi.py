"""Bidirectional formatting characters (the "Trojan Source" trick) never survive into shown or
stored text: :func:`controller.text.strip_control` removes them with the C0/C1 controls, and
every path of untrusted text uses it (check output, the record, the evidence, the JUnit XML,
``run --json``, ``show``, CLI errors, logs). A real job under runc and under gVisor prints
them from a check and from the model's calls."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from controller.jobs.evidence import junit
from controller.jobs.records import CheckResult, JobRecord
from controller.logs import Scrubber, redact
from controller.text import BIDI_CONTROLS, strip_control
from tests.support.bidi import ALL_BIDI, no_bidi

# --- the rule --------------------------------------------------------------------------------


def test_the_rule_names_every_bidi_control() -> None:
    assert sorted(BIDI_CONTROLS) == sorted(ALL_BIDI)


@pytest.mark.parametrize("ch", list(ALL_BIDI), ids=[f"U+{ord(c):04X}" for c in ALL_BIDI])
def test_each_bidi_control_is_removed(ch: str) -> None:
    assert strip_control(f"if admin{ch} then") == "if admin then"


def test_text_around_them_is_kept() -> None:
    """Right-to-left letters are text, not controls; newline and tab stay."""
    text = "\u05e9\u05dc\u05d5\u05dd\t\u0645\u0631\u062d\u0628\u0627\nplain \u2018quoted\u2019 \u2013 ok\n"
    assert strip_control(text) == text
    dirty = "\u202e\x1b[31mred\x1b[0m\u2066 x\u2069\r\n\x9b2Jy\u200f\n"
    assert strip_control(dirty) == "red x\ny\n"
    assert strip_control(strip_control(dirty)) == strip_control(dirty)


def test_the_scrubber_removes_them_from_keys_and_values() -> None:
    scrub = Scrubber("")
    data = {"k\u202ey": ["a\u2067b", {"c": "d\u200ee"}], "n": 3}
    assert scrub.value(data) == {"ky": ["ab", {"c": "de"}], "n": 3}


def test_a_bidi_control_cannot_hide_a_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEMO_API_TOKEN", "tok-5f1e9c2b7a")
    shown = Scrubber("").text("key tok-5f1e\u202e9c2b7a")
    assert shown == "key [redacted]"
    event: dict[str, Any] = {"event": "said tok-5f1e\u2066\u2069 9c2b7a \u202eok", "n": 1}
    assert redact(None, "info", event) == {"event": "said tok-5f1e 9c2b7a ok", "n": 1}


def test_junit_xml_holds_none(tmp_path: Path) -> None:
    record = JobRecord(job_id="j1", repo=str(tmp_path), state="failed")
    record.checks = [
        CheckResult(
            id="c\u202e1",
            status="failed",
            exit_code=1,
            duration_ms=5,
            output_tail=f"out{ALL_BIDI}put\n",
            diff_sha256="",
            required=True,
            source="docker-exec",
        ),
        CheckResult(
            id="c2",
            status="skipped",
            exit_code=None,
            duration_ms=0,
            output_tail="",
            reason="not \u2067run",
            diff_sha256="",
            required=True,
            source="none",
        ),
    ]
    data = junit(record, Scrubber(str(tmp_path))).decode()
    assert no_bidi(data)
    suite = ET.fromstring(data)  # noqa: S314 - our own output
    names = [c.get("name") for c in suite.iter("testcase")]
    assert names == ["c1", "c2"]
    texts = [e.text for e in suite.iter("system-out")]
    assert texts[0] == "output\n"
