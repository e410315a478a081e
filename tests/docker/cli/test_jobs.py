"""The job commands of the CLI in a subprocess: run, jobs, show, apply,
revert, discard; their JSON, exit codes and refusals."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import docker
import pytest

from controller.jobs.store import JobStore
from controller.paths import patchbox_home
from tests.support.cli import patchbox
from tests.support.git import git
from tests.support.jobs import (
    APP,
    APP_AFTER,
    EDIT,
    GREET,
    blob,
    call,
    containers_of,
    make_repo,
    snapshot,
)
from tests.support.paths import REPO_ROOT

pytestmark = pytest.mark.docker

ROOT = REPO_ROOT
RUN_KEYS = {
    "job_id",
    "status",
    "error",
    "diff",
    "files",
    "control_characters",
    "checks",
    "tool_calls",
    "evidence",
}
"""The keys of ``run --json``; ``decision`` is shown beside them."""
DIFF = (
    "diff --git a/app.py b/app.py\n"
    f"index {blob(APP)}..{blob(APP_AFTER)} 100644\n"
    "--- a/app.py\n+++ b/app.py\n"
    "@@ -1,2 +1,2 @@\n def greet(name):\n"
    '-    return "hello " + name\n+    return "Hello " + name\n'
)


def as_json(done: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(done.stdout)


@pytest.fixture
def inputs(tmp_path: Path) -> dict[str, Path]:
    task = {
        "prompt": "Capitalize the greeting.",
        "checks": {"greet": GREET},
        "limits": {"memory_mb": 512, "workspace_mb": 64, "tmp_mb": 32},
    }
    calls = {"turns": [[call("c1", EDIT)]], "final": "done"}
    paths = {
        "task": tmp_path / "task.json",
        "calls": tmp_path / "calls.json",
        "config": tmp_path / "config.toml",
    }
    paths["task"].write_text(json.dumps(task))
    paths["calls"].write_text(json.dumps(calls))
    paths["config"].write_text("spare_sandboxes = 0\n")
    return paths


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "greet")


def jobs_on_disk() -> set[str]:
    root = JobStore().root
    return {p.name for p in root.iterdir()} if root.is_dir() else set()


def run_args(repo: Path, inputs: dict[str, Path]) -> list[str]:
    return [
        "run",
        "--repo",
        str(repo),
        "--task",
        str(inputs["task"]),
        "--calls",
        str(inputs["calls"]),
        "--config",
        str(inputs["config"]),
        "--json",
    ]


@pytest.mark.usefixtures("sandbox_image")
def test_run_apply_revert_through_the_cli(
    docker_client: docker.DockerClient, repo: Path, inputs: dict[str, Path]
) -> None:
    before = snapshot(repo)
    done = patchbox(*run_args(repo, inputs))
    assert done.returncode == 0, done.stderr
    data = as_json(done)
    assert set(data) == RUN_KEYS | {"decision", "baseline_checks"}
    job_id = data["job_id"]
    assert (data["status"], data["error"], data["diff"]) == ("awaiting_review", None, DIFF)
    assert data["files"] == [{"path": "app.py", "change": "modify", "added": 1, "removed": 1}]
    [check] = data["checks"]
    assert set(check) == {"id", "status", "exit_code", "duration_ms", "output_tail"}
    assert (check["id"], check["status"], check["exit_code"]) == ("greet", "passed", 0)
    assert data["tool_calls"] == [
        {"turn": 1, "id": "c1", "name": "replace_text", "ok": True, "error_code": None}
    ]
    assert data["evidence"] == f"jobs/{job_id}/evidence.json"
    assert (patchbox_home() / data["evidence"]).is_file()
    assert "s] running\n" in done.stderr
    assert containers_of(docker_client, job_id) == []
    assert snapshot(repo) == before

    listed = patchbox("jobs", "--repo", str(repo), "--json")
    assert listed.returncode == 0
    assert [(j["job_id"], j["status"], j["repository"]) for j in as_json(listed)["jobs"]] == [
        (job_id, "awaiting_review", "greet")
    ]
    assert job_id in [j["job_id"] for j in as_json(patchbox("jobs", "--json"))["jobs"]]

    shown = patchbox("show", job_id, "--diff")
    assert shown.returncode == 0
    assert shown.stdout.startswith(f"job {job_id}: awaiting_review\n")
    assert "modify  app.py (+1 -1) by call(s) c1" in shown.stdout
    assert shown.stdout.endswith(DIFF + "\n")
    shown_json = as_json(patchbox("show", job_id, "--json"))
    assert shown_json["diff"] == ""
    assert [e["id"] for e in shown_json["ledger"]] == ["c1"]

    applied = patchbox("apply", job_id, "--json")
    assert applied.returncode == 0, applied.stderr
    assert as_json(applied)["status"] == "applied"
    assert (repo / "app.py").read_text() == APP_AFTER
    assert git(repo, "diff", "--full-index") == DIFF
    assert JobStore().load(job_id).state == "applied"

    _applied_twice(job_id)
    refused = patchbox("discard", job_id, "--json")
    assert refused.returncode == 2
    assert as_json(refused)["error"]["code"] == "USAGE_ERROR"
    assert "is applied" in as_json(refused)["error"]["message"]
    assert (repo / "app.py").read_text() == APP_AFTER

    reverted = patchbox("revert", job_id, "--json")
    assert reverted.returncode == 0, reverted.stderr
    assert as_json(reverted)["status"] == "reverted"
    assert snapshot(repo) == before
    again = patchbox("revert", job_id, "--json")
    assert again.returncode == 2
    assert as_json(again)["error"]["code"] == "USAGE_ERROR"
    assert JobStore().load(job_id).state == "reverted"

    _applied_again_after_the_revert(repo, job_id, before)


def _applied_twice(job_id: str) -> None:
    """An applied job applied again: said so, nothing written, exit 0."""
    twice = patchbox("apply", job_id)
    assert twice.returncode == 0, twice.stderr
    assert twice.stdout == f"job {job_id} already applied; nothing was written\n"
    twice_json = as_json(patchbox("apply", job_id, "--json"))
    assert (twice_json["already_applied"], twice_json["files"]) == (True, [])


def _applied_again_after_the_revert(repo: Path, job_id: str, before: dict[str, str]) -> None:
    """A reverted job is applied again, with the checks of a first apply: a touched file
    changed since is a conflict (nothing written); as it was, it applies."""
    (repo / "app.py").write_text(APP + "# mine\n")
    conflict = patchbox("apply", job_id, "--json")
    assert conflict.returncode == 1, conflict.stderr
    assert as_json(conflict)["error"]["code"] == "APPLY_CONFLICT"
    assert (repo / "app.py").read_text() == APP + "# mine\n"
    assert JobStore().load(job_id).state == "reverted"
    (repo / "app.py").write_text(APP)
    reapplied = patchbox("apply", job_id, "--json")
    assert reapplied.returncode == 0, reapplied.stderr
    assert as_json(reapplied)["status"] == "applied"
    assert (repo / "app.py").read_text() == APP_AFTER
    assert [s for s, _ in JobStore().load(job_id).history][-3:] == [
        "applied",
        "reverted",
        "applied",
    ]
    assert as_json(patchbox("revert", job_id, "--json"))["status"] == "reverted"
    assert snapshot(repo) == before


@pytest.mark.usefixtures("sandbox_image")
def test_discard_through_the_cli(repo: Path, inputs: dict[str, Path]) -> None:
    before = snapshot(repo)
    job_id = as_json(patchbox(*run_args(repo, inputs)))["job_id"]
    discarded = patchbox("discard", job_id, "--json")
    assert discarded.returncode == 0, discarded.stderr
    assert as_json(discarded) == {"job_id": job_id, "status": "discarded"}
    for command in ("apply", "revert", "discard"):
        refused = patchbox(command, job_id, "--json")
        assert refused.returncode == 2
        assert as_json(refused)["error"]["code"] == "USAGE_ERROR"
    assert snapshot(repo) == before
    assert JobStore().load(job_id).state == "discarded"


@pytest.mark.usefixtures("sandbox_image")
def test_failed_job_exits_1(repo: Path, inputs: dict[str, Path]) -> None:
    task = json.loads(inputs["task"].read_text())
    task["checks"] = {"bad": {"argv": ["false"]}}
    task["baseline_checks"] = False  # failing before too would only wait for review
    inputs["task"].write_text(json.dumps(task))
    done = patchbox(*run_args(repo, inputs))
    assert done.returncode == 1, done.stderr
    data = as_json(done)
    assert (data["status"], data["error"]["code"]) == ("failed", "CHECK_FAILED")
    assert [(c["id"], c["status"], c["exit_code"]) for c in data["checks"]] == [
        ("bad", "failed", 1)
    ]
    refused = patchbox("apply", data["job_id"], "--json")
    assert refused.returncode == 2


@pytest.mark.parametrize(
    "change",
    ["unknown_task_field", "missing_config", "bad_calls", "unknown_job"],
)
def test_usage_errors_exit_2(repo: Path, inputs: dict[str, Path], change: str) -> None:
    args = run_args(repo, inputs)
    if change == "unknown_task_field":
        task = json.loads(inputs["task"].read_text())
        inputs["task"].write_text(json.dumps(task | {"timeout": 5}))
    elif change == "missing_config":
        args[args.index("--config") + 1] = str(inputs["config"].with_name("absent.toml"))
    elif change == "bad_calls":
        inputs["calls"].write_text(json.dumps({"turns": [[{"id": "c1", "name": "x"}]]}))
    else:
        args = ["show", "no-such-job", "--json"]
    before = jobs_on_disk()
    done = patchbox(*args)
    assert done.returncode == 2, done.stderr
    assert as_json(done)["error"]["code"] == "USAGE_ERROR"
    assert "patchbox: error USAGE_ERROR" in done.stderr
    assert jobs_on_disk() == before
