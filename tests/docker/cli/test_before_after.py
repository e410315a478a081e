"""Through the CLI, as a CI job runs it: a job that made no change (``no_change``,
``NO_CHANGE``, exit 5; exit 0 and no failing JUnit case with ``--no-change-ok``), and the
required checks run once on the baseline before the first model turn (the before/after
table in ``run --json``, ``show`` and the evidence; ``CHECK_CANNOT_RUN`` before any model
turn for a check whose command is not found; the task's ``baseline_checks`` false skips
it)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import docker
import pytest

from tests.support.cli import job_files, patchbox
from tests.support.exits import CALLS, TASK
from tests.support.jobs import GREET, call, make_repo

pytestmark = pytest.mark.docker

READ = {"name": "read_file", "arguments": {"path": "app.py"}}
NOT_FOUND = {"argv": ["sh", "-c", "patchbox-no-such-command --version"], "timeout_seconds": 30}


def _run(repo: Path, folder: Path, task: dict[str, Any], *extra: str, calls: Any = CALLS) -> Any:
    proc = patchbox("run", "--repo", str(repo), *job_files(folder, task, calls), *extra, "--json")
    return proc, json.loads(proc.stdout or "{}")


def _junit(folder: Path) -> ET.Element:
    return ET.fromstring((folder / "junit.xml").read_bytes())  # noqa: S314 - our own output


def test_a_job_with_no_change_has_its_own_outcome_and_exit_status(
    docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> None:
    del docker_client, sandbox_image
    repo = make_repo(tmp_path / "repo")
    reads = {"turns": [[call("c1", READ)]], "final": "nothing to do"}
    out_dir = tmp_path / "out"
    proc, out = _run(repo, tmp_path / "a", TASK, "--output-dir", str(out_dir), calls=reads)
    assert proc.returncode == 5, proc.stderr
    assert out["status"] == "no_change"
    assert out["error"]["code"] == "NO_CHANGE"
    assert (out["diff"], out["files"], out["checks"]) == ("", [], [])
    assert _junit(out_dir).get("failures") == "1"
    assert json.loads((out_dir / "run.json").read_text())["status"] == "no_change"
    assert not (out_dir / "diff.patch").exists()

    ok_dir = tmp_path / "out-ok"
    ok, data = _run(
        repo, tmp_path / "b", TASK, "--no-change-ok", "--output-dir", str(ok_dir), calls=reads
    )
    assert ok.returncode == 0, ok.stderr
    assert (data["status"], data["error"]["code"]) == ("no_change", "NO_CHANGE")
    report = _junit(ok_dir)
    assert (report.get("failures"), report.get("errors"), report.get("skipped")) == ("0", "0", "1")

    shown = patchbox("show", out["job_id"])
    assert shown.returncode == 0
    assert f"job {out['job_id']}: no_change" in shown.stdout
    assert "error NO_CHANGE: the job made no change" in shown.stdout
    listed = patchbox("jobs", "--status", "no_change", "--json")
    assert {j["job_id"] for j in json.loads(listed.stdout)["jobs"]} >= {
        out["job_id"],
        data["job_id"],
    }
    assert patchbox("discard", out["job_id"]).returncode == 0


def test_checks_before_and_after_the_change(
    docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> None:
    """greet fails on the baseline and passes after the edit (fixed); lint fails before and
    after (still failing): the job fails on lint, and the table says lint failed before too."""
    del docker_client, sandbox_image
    repo = make_repo(tmp_path / "repo")
    task = {**TASK, "checks": {"greet": GREET, "lint": {"argv": ["false"]}}}
    proc, out = _run(repo, tmp_path / "job", task)
    assert proc.returncode == 1, proc.stderr
    assert out["status"] == "failed"
    assert out["error"]["code"] == "CHECK_FAILED"
    assert "failing before the change too: lint" in out["error"]["message"]
    before = {c["id"]: (c["status"], c["exit_code"]) for c in out["baseline_checks"]}
    assert before == {"greet": ("failed", 1), "lint": ("failed", 1)}
    decision = out["decision"]
    assert decision["check_changes"] == [
        {"id": "greet", "before": "failed", "after": "passed", "change": "fixed"},
        {"id": "lint", "before": "failed", "after": "failed", "change": "still_failing"},
    ]
    assert decision["still_failing"] == ["lint"]
    assert decision["failed_checks"] == ["lint"]
    shown = patchbox("show", out["job_id"])
    assert "check greet before the change: failed (exit 1" in shown.stdout
    assert "  greet: fixed (failed -> passed)" in shown.stdout
    assert "  lint: still failing (failed -> failed)" in shown.stdout
    home_evidence = json.loads(patchbox("show", out["job_id"], "--json").stdout)["evidence"]
    assert home_evidence.endswith("evidence.json")
    evidence = _evidence(out["job_id"])
    assert [c["change"] for c in evidence["check_changes"]] == ["fixed", "still_failing"]
    assert [c["id"] for c in evidence["baseline_checks"]] == ["greet", "lint"]


def test_a_check_whose_command_is_not_found_stops_before_any_model_turn(
    docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> None:
    del docker_client, sandbox_image
    repo = make_repo(tmp_path / "repo")
    task = {**TASK, "checks": {"tests": NOT_FOUND}}
    proc, out = _run(repo, tmp_path / "job", task)
    assert proc.returncode == 1, proc.stderr
    assert out["status"] == "failed"
    error = out["error"]
    assert error["code"] == "CHECK_CANNOT_RUN"
    assert "tests: the command was not found (exit 127)" in error["message"]
    assert error["hint"]["action"] == "use_environment"
    assert "docs/environments.md" in error["hint"]["text"]
    assert out["baseline_checks"][0]["status"] == "cannot_run"
    assert out["baseline_checks"][0]["exit_code"] == 127
    assert (out["tool_calls"], out["files"], out["checks"], out["diff"]) == ([], [], [], "")
    shown = json.loads(patchbox("show", out["job_id"], "--transcript", "--json").stdout)
    assert shown["transcript"] == []  # no model turn was spent
    assert "running" not in [state for state, _at in shown["state_history"]]
    text = patchbox("show", out["job_id"]).stdout
    assert "check tests before the change: cannot_run (exit 127" in text
    assert "output of check tests before the change" in text


def test_the_task_can_skip_the_run_before_the_change(
    docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> None:
    """With ``baseline_checks`` false nothing runs before the model: the job runs its turns
    and the check fails after, as it always did."""
    del docker_client, sandbox_image
    repo = make_repo(tmp_path / "repo")
    task = {**TASK, "checks": {"tests": NOT_FOUND}, "baseline_checks": False}
    proc, out = _run(repo, tmp_path / "job", task)
    assert proc.returncode == 1, proc.stderr
    assert (out["status"], out["error"]["code"]) == ("failed", "CHECK_FAILED")
    assert "baseline_checks" not in out
    assert [c["id"] for c in out["tool_calls"]] == ["c1"]
    assert out["checks"][0]["exit_code"] == 127
    assert "check_changes" not in out["decision"]


def _evidence(job_id: str) -> dict[str, Any]:
    from controller.paths import patchbox_home

    data: dict[str, Any] = json.loads(
        (patchbox_home() / "jobs" / job_id / "evidence.json").read_text()
    )
    return data


def test_the_run_on_the_baseline_is_not_counted_by_the_wall_clock(
    docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> None:
    """A required check that takes 6 s on the baseline, under a 5 s wall clock: the model's
    turn still runs, and the job ends on its check after the change, not LIMIT_EXCEEDED."""
    del docker_client, sandbox_image
    repo = make_repo(tmp_path / "repo")
    slow = {"argv": ["sleep", "6"], "timeout_seconds": 30}
    limits = {"memory_mb": 512, "workspace_mb": 64, "tmp_mb": 32, "wall_seconds": 5}
    task = {**TASK, "checks": {"slow": slow}, "limits": limits}
    proc, out = _run(repo, tmp_path / "job", task)
    before = {c["id"]: c["status"] for c in out.get("baseline_checks") or []}
    assert before == {"slow": "passed"}, proc.stdout[-3000:]
    assert [c["ok"] for c in out["tool_calls"]] == [True], proc.stderr  # the model's turn ran
    assert (out.get("error") or {}).get("code") != "LIMIT_EXCEEDED", proc.stderr
    assert out["status"] == "awaiting_review", proc.stderr
