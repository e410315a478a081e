"""What reaches a terminal: no file the model wrote and no string a service sent may act on it.

:func:`controller.text.visible` writes every control, format and bidirectional
character as an escape (never as itself, never dropped); every text the CLI prints passes
it, local and remote; ``--json`` is ASCII JSON. Validation flags the added lines that hold
such characters (the change set, the record, ``show``, the evidence, a failed job's text).
Attacked with a real job under runc and gVisor that writes erase-line, cursor-up, carriage
return, OSC title and clipboard writes, clear-screen, U+202E and the C1 CSI, and with a
hostile service on loopback that puts them in every string it serves."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import docker
import pytest

from controller.jobs.store import JobStore
from tests.support.jobs import FILES, README, call, make_repo
from tests.support.terminal import (
    ATTACKS,
    raw_patchbox,
    terminal_safe,
)

# --- a real job ------------------------------------------------------------------------------


WRITTEN_ATTACKS = [
    "erase line",
    "cursor up",
    "carriage return",
    "OSC 0 title",
    "OSC 52 clipboard",
    "clear screen",
    "right-to-left override",
    "C1 CSI",
]
WRITTEN = [f"line {name}: {ATTACKS[name][0]}text" for name in WRITTEN_ATTACKS]
"""What the model writes into README.md, one attack a line (lines 2 to 9), then a line with
a CR LF ending (line 10, not flagged)."""
HIDE: dict[str, Any] = {
    "name": "replace_text",
    "arguments": {
        "path": "README.md",
        "oldText": README,
        "newText": README + "".join(f"{line}\n" for line in WRITTEN) + "crlf ending\r\n",
    },
}
FLAGGED_LINES = list(range(2, 2 + len(WRITTEN)))


def run_hiding_job(
    repo: Path, tmp_path: Path, runtime: str, checks: dict[str, Any]
) -> tuple[Any, str]:
    task = {
        "prompt": "Document the greeting.",
        "checks": checks,
        "baseline_checks": False,  # a failing check fails the job (not failing before too)
        "limits": {"memory_mb": 512, "workspace_mb": 64, "tmp_mb": 32},
    }
    (tmp_path / "task.json").write_text(json.dumps(task))
    (tmp_path / "calls.json").write_text(json.dumps({"turns": [[call("c1", HIDE)]]}))
    (tmp_path / "config.toml").write_text("spare_sandboxes = 0\n")
    args = ["--task", str(tmp_path / "task.json"), "--calls", str(tmp_path / "calls.json")]
    args += ["--config", str(tmp_path / "config.toml"), "--runtime", runtime]
    run = raw_patchbox("run", "--repo", str(repo), *args)
    listed = raw_patchbox("jobs", "--repo", str(repo), "--json")
    job_id = json.loads(listed.stdout)["jobs"][-1]["job_id"]
    return run, job_id


def assert_flagged(flags: list[dict[str, Any]]) -> None:
    assert [(f["path"], f["line"]) for f in flags] == [("README.md", n) for n in FLAGGED_LINES]
    assert flags[0]["characters"] == ["\\x1b"]
    assert flags[2]["characters"] == ["\\x0d"]
    assert flags[3]["characters"] == ["\\x1b", "\\x07"]
    assert flags[6]["characters"] == ["\\u202e"]
    assert flags[7]["characters"] == ["\\x9b"]


@pytest.mark.docker
def test_show_diff_shows_what_the_model_hid_and_flags_it(
    docker_client: docker.DockerClient, sandbox_image: str, runtime: str, tmp_path: Path
) -> None:
    del docker_client, sandbox_image  # the image is built once, before the job
    repo = make_repo(tmp_path / "greet", FILES)
    run, job_id = run_hiding_job(repo, tmp_path, runtime, {})
    assert run.returncode == 0, run.stderr.decode(errors="replace")
    assert "warning: 8 added line(s) hold control" in terminal_safe(run.stdout)
    terminal_safe(run.stderr)
    shown = raw_patchbox("show", job_id, "--diff")
    assert shown.returncode == 0, shown.stderr
    text = terminal_safe(shown.stdout)
    terminal_safe(shown.stderr)
    assert f"job {job_id}: awaiting_review" in text
    for name in WRITTEN_ATTACKS:
        assert f"+line {name}: {ATTACKS[name][1]}text\n" in text, name
    assert "+crlf ending\\x0d\n" in text
    assert "warning: 8 added line(s) hold control, format or bidi characters" in text
    assert "  README.md:2: \\x1b\n" in text
    assert "  README.md:5: \\x1b \\x07\n" in text
    as_json = raw_patchbox("show", job_id, "--diff", "--json")
    assert as_json.returncode == 0
    assert as_json.stdout.isascii()
    data = json.loads(as_json.stdout)
    assert_flagged(data["control_characters"])
    assert "".join(f"{line}\n" for line in WRITTEN) in data["diff"].replace("\n+", "\n")
    folder = JobStore().folder(job_id)
    evidence = json.loads((folder / "evidence.json").read_text())
    assert_flagged(evidence["diff"]["control_characters"])
    stored = JobStore().load(job_id).model_dump(mode="json")  # the record, its log replayed
    assert_flagged(stored["control_characters"])
    patch = (folder / "diff.patch").read_bytes()
    assert b"\x1b]52;c;cm0gLXJmIH4=\x07" in patch  # the diff itself is kept byte for byte
    applied = raw_patchbox("apply", job_id)  # flagged, not refused: the reviewer decides
    assert applied.returncode == 0, applied.stderr
    assert (repo / "README.md").read_bytes() == HIDE["arguments"]["newText"].encode()


@pytest.mark.docker
def test_a_failed_job_says_so_in_its_failure_text(
    docker_client: docker.DockerClient, sandbox_image: str, runtime: str, tmp_path: Path
) -> None:
    del docker_client, sandbox_image
    fail = {"argv": ["python3", "-c", "import sys; print('no'); sys.exit(1)"]}
    repo = make_repo(tmp_path / "greet", FILES)
    run, job_id = run_hiding_job(repo, tmp_path, runtime, {"fails": fail})
    assert run.returncode == 1, run.stderr
    text = terminal_safe(run.stdout)
    assert f"job {job_id}: failed" in text
    assert "error CHECK_FAILED" in text
    assert "warning: 8 added line(s) hold control, format or bidi characters" in text
    assert "  README.md:9: \\x9b\n" in text
    shown = raw_patchbox("show", job_id, "--diff")
    assert "+line C1 CSI: \\x9b31mtext\n" in terminal_safe(shown.stdout)
