"""Bidirectional formatting characters (the "Trojan Source" trick) never survive into shown or
stored text: :func:`controller.text.strip_control` removes them with the C0/C1 controls, and
every path of untrusted text uses it (check output, the record, the evidence, the JUnit XML,
``run --json``, ``show``, CLI errors, logs). A real job under runc and under gVisor prints
them from a check and from the model's calls."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import docker
import pytest

from controller.jobs.evidence import junit
from controller.jobs.records import CheckResult, JobRecord, JobStore
from controller.logs import Scrubber, redact
from controller.text import BIDI_CONTROLS, strip_control
from tests.support.cli import patchbox
from tests.support.jobs import EDIT, GREET, call, check_call, make_repo

ROOT = Path(__file__).resolve().parent.parent
ALL_BIDI = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
"""Every bidi control: ALM, LRM, RLM, LRE, RLE, PDF, LRO, RLO, LRI, RLI, FSI, PDI."""


def no_bidi(text: str) -> bool:
    return not any(ch in text for ch in ALL_BIDI)


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


# --- a real job ------------------------------------------------------------------------------

PRINT_BIDI = (
    "import sys\n"
    "print('access \\u202eenimda\\u202c granted')\n"
    "print('marks \\u061c\\u200e\\u200f embeds \\u202a\\u202b\\u202d x\\u202c')\n"
    "print('isolates \\u2066\\u2067\\u2068 y\\u2069')\n"
    "sys.exit(1)\n"
)
"""A failing check (so its tail lands in the JUnit ``failure`` too) printing every bidi
control, written with escapes so the task file itself holds none."""
EXPECTED_TAIL = "access enimda granted\nmarks  embeds  x\nisolates  y\n"


def decoded(text: str) -> str:
    """``text``, and if it is JSON, its values written out unescaped: JSON's ``\\u202e``
    escape is the character itself to whoever reads the value."""
    try:
        return text + json.dumps(json.loads(text), ensure_ascii=False)
    except ValueError:
        return text


@pytest.mark.docker
def test_a_job_printing_bidi_controls_stores_and_shows_none(
    docker_client: docker.DockerClient, sandbox_image: str, runtime: str, tmp_path: Path
) -> None:
    del docker_client, sandbox_image  # the image is built once, before the job
    repo = make_repo(tmp_path / "greet")
    task = {
        "prompt": "Capitalize the greeting.",
        "checks": {"greet": GREET, "bidi": {"argv": ["python3", "-c", PRINT_BIDI]}},
        "limits": {"memory_mb": 512, "workspace_mb": 64, "tmp_mb": 32},
    }
    denied = {
        "name": "replace_text",
        "arguments": {"path": "src/\u202eexe.txt\u2066", "oldText": "a", "newText": "b"},
    }
    calls = {
        "turns": [[call("c1", EDIT), check_call("c2", "bidi"), call("c3", denied)]],
        "final": "done \u202eenod\u2069",
    }
    (tmp_path / "task.json").write_text(json.dumps(task))
    (tmp_path / "calls.json").write_text(json.dumps(calls))
    (tmp_path / "config.toml").write_text("spare_sandboxes = 0\n")
    run = patchbox(
        "run",
        "--repo",
        str(repo),
        "--task",
        str(tmp_path / "task.json"),
        "--calls",
        str(tmp_path / "calls.json"),
        "--config",
        str(tmp_path / "config.toml"),
        "--runtime",
        runtime,
        "--json",
    )
    assert run.returncode == 1, run.stderr
    data = json.loads(run.stdout)
    assert data["error"]["code"] == "CHECK_FAILED"
    bidi = next(c for c in data["checks"] if c["id"] == "bidi")
    assert (bidi["status"], bidi["output_tail"]) == ("failed", EXPECTED_TAIL)
    job_id = data["job_id"]
    shown_json = patchbox("show", job_id, "--json")
    shown = patchbox("show", job_id)
    assert shown_json.returncode == 0, shown_json.stderr
    assert shown.returncode == 0, shown.stderr
    folder = JobStore().folder(job_id)
    evidence = (folder / "evidence.json").read_text()
    xml = (folder / "checks.junit.xml").read_text()
    texts = {
        "run --json": run.stdout,
        "run stderr": run.stderr,
        "show --json": shown_json.stdout,
        "show": shown.stdout,
        "show stderr": shown.stderr + shown_json.stderr,
        "evidence.json": evidence,
        "checks.junit.xml": xml,
    }
    for name, text in texts.items():
        assert no_bidi(decoded(text)), name
    bundle = json.loads(evidence)
    tool_check = bundle["tool_calls"][1]
    assert (tool_check["name"], tool_check["ok"]) == ("run_check", True)
    assert bundle["tool_calls"][2]["error_code"] == "TOOL_PATH_DENIED"
    assert bundle["final_message"] == "done enod"
    assert next(c for c in bundle["checks"] if c["id"] == "bidi")["output_tail"] == EXPECTED_TAIL
    failure = next(c for c in ET.fromstring(xml).iter("testcase") if c.get("name") == "bidi")  # noqa: S314
    assert failure.findtext("failure") == EXPECTED_TAIL
