"""Why a job failed, in plain text, and the whole conversation: ``run`` and ``show`` name the
error, the failing check's last output lines and every refused tool call with its code and
message (never a decision for a failed job); ``show --transcript`` prints each turn's
message, calls, arguments and results, which the evidence keeps too. Through the CLI, on a
real repository and the real daemon."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import docker

from tests.support.cli import job_files, patchbox
from tests.support.jobs import EDIT, GREET, call, check_call, make_repo

LIMITS = {"memory_mb": 512, "workspace_mb": 64, "tmp_mb": 32, "wall_seconds": 120}
MISSING = {"name": "read_file", "arguments": {"path": "nope.py"}}
NO_MATCH = {
    "name": "replace_text",
    "arguments": {"path": "app.py", "oldText": "not in the file", "newText": "x"},
}
PROTECTED = {
    "name": "replace_text",
    "arguments": {"path": ".git/config", "oldText": "a", "newText": "b"},
}


def _run(
    client: docker.DockerClient, repo: Path, folder: Path, turns: list[Any], checks: dict[str, Any]
) -> tuple[Any, str]:
    del client
    task = {
        "prompt": "Capitalize the greeting.",
        "checks": checks,
        "baseline_checks": False,  # a check failing before too would only wait for review
        "limits": LIMITS,
    }
    args = job_files(folder, task, {"turns": turns, "final": "I could not do it."})
    text = patchbox("run", "--repo", str(repo), *args)
    data = patchbox("run", "--repo", str(repo), *args, "--json")
    return data, text.stdout + text.stderr


def test_refused_calls_are_named_with_their_codes_and_messages(
    docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> None:
    del sandbox_image
    repo = make_repo(tmp_path / "repo")
    turns = [[call("c1", MISSING)], [call("c2", NO_MATCH), call("c3", PROTECTED)]]
    data, text = _run(docker_client, repo, tmp_path / "job", turns, {"greet": GREET})
    assert data.returncode == 5
    out = json.loads(data.stdout)
    assert out["status"] == "no_change"
    assert "error NO_CHANGE: the job made no change" in text
    assert "failed tool calls:" in text
    lines = text.splitlines()
    refused = {line.split()[2]: line for line in lines if line.startswith("  turn ")}
    assert set(refused) == {"c1", "c2", "c3"}
    assert refused["c1"].endswith("read_file: TOOL_FILE_NOT_FOUND: nope.py: no such file")
    assert refused["c2"].split(" replace_text: ")[1].count(": ") >= 1
    assert "TOOL_PATH_DENIED" in refused["c3"]
    assert not any(line.startswith("decision:") for line in lines)
    shown = patchbox("show", out["job_id"])
    assert shown.returncode == 0
    assert "failed tool calls:" in shown.stdout
    assert "decision:" not in shown.stdout
    assert all(c["error_message"] for c in out["tool_calls"] if not c["ok"])


def test_a_failing_check_shows_its_last_output_lines(
    docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> None:
    del sandbox_image
    repo = make_repo(tmp_path / "repo")
    loud = {"argv": ["sh", "-c", "for i in $(seq 1 30); do echo line-$i; done; exit 4"]}
    data, text = _run(docker_client, repo, tmp_path / "job", [[call("c1", EDIT)]], {"loud": loud})
    assert data.returncode == 1
    assert "error CHECK_FAILED: required check(s) did not pass: loud" in text
    assert "output of check loud (last 20 lines):" in text
    assert "  | line-30" in text
    assert "  | line-11" in text
    assert "  | line-10" not in text
    assert "decision:" not in text


def test_the_transcript_holds_the_conversation(
    docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> None:
    del sandbox_image
    repo = make_repo(tmp_path / "repo")
    turns = [[call("c1", MISSING)], [call("c2", EDIT)], [check_call("c3", "greet")]]
    data, _text = _run(docker_client, repo, tmp_path / "job", turns, {"greet": GREET})
    assert data.returncode == 0, data.stderr
    job_id = json.loads(data.stdout)["job_id"]
    shown = patchbox("show", job_id, "--transcript")
    assert shown.returncode == 0
    text = shown.stdout
    assert "transcript:" in text
    assert 'call c1 read_file {"path": "nope.py"}' in text
    assert "call c2 replace_text" in text
    assert '"oldText": "\\"hello \\""' in text
    assert "-> ok" in text
    assert "-> error" in text
    assert "-> greet: passed (" in text  # a check's call reads as the check's verdict
    assert "model: I could not do it." in text
    as_json = json.loads(patchbox("show", job_id, "--transcript", "--json").stdout)
    turns_seen = as_json["transcript"]
    assert [t["turn"] for t in turns_seen] == [1, 2, 3, 4]
    assert [c["name"] for t in turns_seen for c in t["calls"]] == [
        "read_file",
        "replace_text",
        "run_check",
    ]
    check = turns_seen[2]["calls"][0]
    assert json.loads(check["result"])["result"]["status"] == "passed"
    assert check["verdict"] == "greet: passed"
    assert turns_seen[3]["text"] == "I could not do it."
    evidence = Path(as_json["evidence"])
    home = Path(__import__("os").environ["PATCHBOX_HOME"])
    stored = json.loads((home / evidence).read_text())
    assert stored["transcript"] == turns_seen
