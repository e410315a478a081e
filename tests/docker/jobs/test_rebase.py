"""``patchbox rebase JOB`` on real repositories and the real daemon, as a user runs it: a job
awaiting review carried onto the repository after an unrelated commit (the old job is then
stale and refused at apply), after a commit to the same file in another hunk (merged, the
required checks run again on the result), after a conflicting one (refused, nothing
written), and after a commit that breaks the check (the new job fails; the old one stays)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import docker
import pytest

from controller.jobs.store import JobStore
from tests.support.cli import job_files, patchbox
from tests.support.git import Repo, init
from tests.support.jobs import APP, APP_AFTER, EDIT, FILES, GREET, call, containers_of, snapshot

HEADER = '"""Greetings."""\n\n\n'
TASK = {
    "prompt": "Capitalize the greeting.",
    "checks": {"greet": GREET},
    "limits": {"memory_mb": 512, "workspace_mb": 64, "tmp_mb": 32, "wall_seconds": 120},
}


def _repo(tmp_path: Path) -> Repo:
    return init(tmp_path / "repo", FILES, message="greet")


def _run(repo: Repo, folder: Path) -> dict[str, Any]:
    args = job_files(folder, TASK, {"turns": [[call("c1", EDIT)]], "final": "capitalized"})
    proc = patchbox("run", "--repo", str(repo.path), *args, "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out: dict[str, Any] = json.loads(proc.stdout)
    assert out["status"] == "awaiting_review", out["error"]
    return out


def _rebase(job_id: str, folder: Path) -> tuple[int, dict[str, Any], str]:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.toml").write_text("spare_sandboxes = 0\n")
    proc = patchbox("rebase", job_id, "--config", str(folder / "config.toml"), "--json")
    return proc.returncode, json.loads(proc.stdout or "{}"), proc.stderr


def _commit(repo: Repo, name: str, text: str) -> str:
    repo.write(name, text)
    return repo.commit(f"upstream: {name}")


@pytest.mark.docker
def test_an_unrelated_commit_the_old_job_is_stale_and_the_new_one_applies(
    docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> None:
    del sandbox_image
    repo = _repo(tmp_path)
    first = _run(repo, tmp_path / "one")
    _commit(repo, "notes.txt", "new notes\n")
    code, second, stderr = _rebase(first["job_id"], tmp_path / "rebase")
    assert code == 0, stderr[-3000:]
    assert second["status"] == "awaiting_review", second["error"]
    assert second["job_id"] != first["job_id"]
    assert second["parent"] == {
        "job_id": first["job_id"],
        "diff_sha256": JobStore().load(first["job_id"]).diff_sha256,
        "relation": "rebase",
    }
    assert [(c["id"], c["status"]) for c in second["checks"]] == [("greet", "passed")]
    assert [f["path"] for f in second["files"]] == ["app.py"]
    assert second["tool_calls"] == []
    assert not containers_of(docker_client, second["job_id"])
    record = JobStore().load(second["job_id"])
    assert record.checks[0].diff_sha256 == record.diff_sha256
    assert record.baseline is not None
    assert record.baseline.head == repo.head()

    refused = patchbox("apply", first["job_id"], "--json")
    assert refused.returncode == 1
    error = json.loads(refused.stdout)["error"]
    assert error["code"] == "JOB_REBASED"
    assert second["job_id"] in error["message"]
    assert f"patchbox apply {second['job_id']}" in error["hint"]["text"]
    assert (repo.path / "app.py").read_text() == APP
    shown = json.loads(patchbox("show", first["job_id"], "--json").stdout)
    assert shown["stale"]["by"] == second["job_id"]
    assert shown["status"] == "awaiting_review"
    assert shown["decision"]  # kept, marked stale
    again = patchbox("rebase", first["job_id"], "--json")
    assert json.loads(again.stdout)["error"]["code"] == "JOB_REBASED"

    applied = patchbox("apply", second["job_id"], "--json")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert (repo.path / "app.py").read_text() == APP_AFTER
    assert (repo.path / "notes.txt").read_text() == "new notes\n"
    reverted = patchbox("revert", second["job_id"], "--json")
    assert reverted.returncode == 0, reverted.stdout + reverted.stderr
    assert (repo.path / "app.py").read_text() == APP


@pytest.mark.docker
def test_another_hunk_of_the_same_file_is_merged_and_checked_again(
    docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> None:
    del docker_client, sandbox_image
    repo = _repo(tmp_path)
    first = _run(repo, tmp_path / "one")
    _commit(repo, "app.py", HEADER + APP)  # above the line the job changed
    code, second, stderr = _rebase(first["job_id"], tmp_path / "rebase")
    assert code == 0, (second.get("error"), stderr[-3000:])
    assert second["status"] == "awaiting_review", second["error"]
    assert second["checks"][0]["status"] == "passed"
    assert JobStore().load(second["job_id"]).diagnostics["merged"] == ["app.py"]
    assert "Greetings" not in "".join(
        line for line in second["diff"].splitlines(keepends=True) if line.startswith(("+", "-"))
    )
    applied = patchbox("apply", second["job_id"], "--json")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert (repo.path / "app.py").read_text() == HEADER + APP_AFTER


@pytest.mark.docker
def test_a_conflicting_commit_is_refused_naming_the_file_and_nothing_is_written(
    docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> None:
    del sandbox_image
    repo = _repo(tmp_path)
    first = _run(repo, tmp_path / "one")
    _commit(repo, "app.py", APP.replace('"hello "', '"hi "'))
    before = snapshot(repo.path)
    code, second, _stderr = _rebase(first["job_id"], tmp_path / "rebase")
    assert code == 1
    assert second["status"] == "failed"
    assert second["error"]["code"] == "REBASE_CONFLICT"
    assert "app.py (1 overlapping change(s) at line 2)" in second["error"]["message"]
    assert second["conflicts"] == [
        {"code": "merge_conflict", "path": "app.py", "message": "1 overlapping change(s) at line 2"}
    ]
    assert second["diff"] == ""
    assert snapshot(repo.path) == before
    assert not containers_of(docker_client, second["job_id"])
    old = json.loads(patchbox("show", first["job_id"], "--json").stdout)
    assert "stale" not in old
    assert old["status"] == "awaiting_review"


@pytest.mark.docker
def test_a_commit_that_breaks_the_check_fails_the_new_job_and_keeps_the_old(
    docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> None:
    del docker_client, sandbox_image
    repo = _repo(tmp_path)
    first = _run(repo, tmp_path / "one")
    strict = FILES["check.py"].replace("'Hello x'", "'Hello x!'")
    _commit(repo, "check.py", strict)
    code, second, _stderr = _rebase(first["job_id"], tmp_path / "rebase")
    assert code == 1
    assert second["status"] == "failed"
    assert second["error"]["code"] == "CHECK_FAILED"
    assert second["checks"][0]["status"] == "failed"
    old = json.loads(patchbox("show", first["job_id"], "--json").stdout)
    assert "stale" not in old


@pytest.mark.docker
def test_a_job_on_local_changes_is_carried_onto_the_work_tree_as_it_is_now(
    docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> None:
    """A job run with ``--include-local-changes``: the work tree changed since (no commit),
    and the rebase's baseline is the work tree as it is now, with its consent."""
    del docker_client, sandbox_image
    repo = _repo(tmp_path)
    repo.write("notes.txt", "uncommitted notes\n")
    folder = tmp_path / "one"
    args = job_files(folder, TASK, {"turns": [[call("c1", EDIT)]], "final": "capitalized"})
    proc = patchbox("run", "--repo", str(repo.path), *args, "--include-local-changes", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    first = json.loads(proc.stdout)
    repo.write("README.md", "# changed in the work tree since\n")
    code, second, stderr = _rebase(first["job_id"], tmp_path / "rebase")
    assert code == 0, stderr[-3000:]
    assert second["status"] == "awaiting_review", second["error"]
    record = JobStore().load(second["job_id"])
    assert record.baseline is not None
    assert record.baseline.mode == "include-local-changes"
    assert record.consent["include_local_changes"] is True
    assert [f["path"] for f in second["files"]] == ["app.py"]
    applied = patchbox("apply", second["job_id"], "--json")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert (repo.path / "app.py").read_text() == APP_AFTER
    assert (repo.path / "README.md").read_text() == "# changed in the work tree since\n"
    assert (repo.path / "notes.txt").read_text() == "uncommitted notes\n"
