"""Bidirectional formatting characters (the "Trojan Source" trick) never survive into shown or
stored text: :func:`controller.text.strip_control` removes them with the C0/C1 controls, and
every path of untrusted text uses it (check output, the record, the evidence, the JUnit XML,
``run --json``, ``show``, CLI errors, logs). A real job under runc and under gVisor prints
them from a check and from the model's calls."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import docker
import pytest

from controller.jobs.store import JobStore
from tests.support.bidi import no_bidi
from tests.support.cli import patchbox
from tests.support.jobs import EDIT, GREET, call, check_call, make_repo
from tests.support.paths import REPO_ROOT

ROOT = REPO_ROOT


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
        "baseline_checks": False,  # bidi fails before too: the after alone fails the job
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
    assert bundle["tool_calls"][2]["error_code"] == "TOOL_FILE_NOT_FOUND"
    assert bundle["tool_calls"][2]["error_message"] == ("'src/\\u202eexe.txt\\u2066': no such file")
    assert tool_check["verdict"] == "bidi: failed, exit 1"
    assert bundle["final_message"] == "done enod"
    assert next(c for c in bundle["checks"] if c["id"] == "bidi")["output_tail"] == EXPECTED_TAIL
    failure = next(c for c in ET.fromstring(xml).iter("testcase") if c.get("name") == "bidi")  # noqa: S314
    assert failure.findtext("failure") == EXPECTED_TAIL
