"""``patchbox run --from JOB`` on a real repository and the real daemon, as a user runs it: a
chain of three jobs, each starting from the one before's result, applied at once (the
combined change) and reverted exactly; a follow-up of an applied job applied as the
increment; and the jobs a follow-up may not start from."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import docker
import pytest

from controller.jobs.store import JobStore
from tests.support.cli import job_files, patchbox
from tests.support.git import init
from tests.support.jobs import APP, APP_AFTER, EDIT, FILES, call, containers_of

TASK = {
    "prompt": "Capitalize the greeting.",
    "checks": {"imports": {"argv": ["python3", "-c", "import app"]}},
    "limits": {"memory_mb": 512, "workspace_mb": 64, "tmp_mb": 32, "wall_seconds": 120},
}
NOTES = {
    "name": "replace_text",
    "arguments": {"path": "notes.txt", "oldText": "old notes", "newText": "new notes"},
}
COMMA = {
    "name": "replace_text",
    "arguments": {"path": "app.py", "oldText": '"Hello "', "newText": '"Hello, "'},
}


def _first(repo: Path, folder: Path) -> str:
    args = job_files(folder, TASK, {"turns": [[call("c1", EDIT)]], "final": "capitalized"})
    proc = patchbox("run", "--repo", str(repo), *args, "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out: dict[str, Any] = json.loads(proc.stdout)
    assert out["status"] == "awaiting_review", out["error"]
    return str(out["job_id"])


def _follow(parent: str, folder: Path, edit: dict[str, Any], prompt: str) -> dict[str, Any]:
    folder.mkdir(parents=True)
    calls = folder / "calls.json"
    calls.write_text(json.dumps({"turns": [[call("c1", edit)]], "final": prompt}))
    (folder / "config.toml").write_text("spare_sandboxes = 0\n")
    proc = patchbox(
        "run",
        "--from",
        parent,
        "--prompt",
        prompt,
        "--calls",
        str(calls),
        "--config",
        str(folder / "config.toml"),
        "--json",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out: dict[str, Any] = json.loads(proc.stdout)
    assert out["status"] == "awaiting_review", out["error"]
    return out


@pytest.mark.docker
def test_a_chain_of_three_is_applied_combined_and_reverted_exactly(
    docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> None:
    del sandbox_image
    repo = init(tmp_path / "repo", FILES, message="greet").path
    one = _first(repo, tmp_path / "one")
    two = _follow(one, tmp_path / "two", NOTES, "Also update the notes.")
    assert two["parent"] == {
        "job_id": one,
        "diff_sha256": JobStore().load(one).diff_sha256,
        "relation": "follow-up",
    }
    assert [f["path"] for f in two["files"]] == ["notes.txt"]  # relative to one's result
    assert "app.py" not in two["diff"]
    three = _follow(two["job_id"], tmp_path / "three", COMMA, "Add a comma.")
    assert [f["path"] for f in three["files"]] == ["app.py"]
    assert '-    return "Hello " + name' in three["diff"]  # one's change is its baseline
    assert JobStore().load(three["job_id"]).task["prompt"] == "Add a comma."
    assert not containers_of(docker_client, three["job_id"])

    shown = json.loads(patchbox("show", three["job_id"], "--diff", "--json").stdout)
    assert "notes.txt" in shown["parent_diff"]
    assert '+    return "Hello, " + name' in shown["combined_diff"]
    assert '-    return "hello " + name' in shown["combined_diff"]
    assert "notes.txt" in shown["combined_diff"]
    assert (repo / "app.py").read_text() == APP

    applied = patchbox("apply", three["job_id"], "--json")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert (repo / "app.py").read_text() == APP_AFTER.replace('"Hello "', '"Hello, "')
    assert (repo / "notes.txt").read_text() == "new notes\n"
    for earlier in (one, two["job_id"]):
        record = JobStore().load(earlier)
        assert record.stale is not None
        assert (record.stale.by, record.stale.reason) == (three["job_id"], "followed_up")
        assert record.state == "awaiting_review"  # superseded, not erased
    refused = json.loads(patchbox("apply", one, "--json").stdout)["error"]
    assert refused["code"] == "JOB_SUPERSEDED"
    assert three["job_id"] in refused["message"]

    reverted = patchbox("revert", three["job_id"], "--json")
    assert reverted.returncode == 0, reverted.stdout + reverted.stderr
    assert (repo / "app.py").read_text() == APP
    assert (repo / "notes.txt").read_text() == FILES["notes.txt"]


@pytest.mark.docker
def test_a_follow_up_of_an_applied_job_applies_its_increment(
    docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> None:
    del docker_client, sandbox_image
    repo = init(tmp_path / "repo", FILES, message="greet").path
    one = _first(repo, tmp_path / "one")
    assert patchbox("apply", one).returncode == 0
    two = _follow(one, tmp_path / "two", NOTES, "Also update the notes.")
    applied = patchbox("apply", two["job_id"], "--json")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert [f["path"] for f in json.loads(applied.stdout)["files"]] == ["notes.txt"]
    assert (repo / "notes.txt").read_text() == "new notes\n"
    assert JobStore().load(one).stale is None
    assert patchbox("revert", two["job_id"]).returncode == 0
    assert (repo / "notes.txt").read_text() == FILES["notes.txt"]
    assert (repo / "app.py").read_text() == APP_AFTER  # one stays applied


@pytest.mark.docker
def test_a_follow_up_needs_a_job_to_start_from_and_a_prompt(
    docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> None:
    del docker_client, sandbox_image
    repo = init(tmp_path / "repo", FILES, message="greet").path
    one = _first(repo, tmp_path / "one")
    no_prompt = patchbox("run", "--from", one, "--json")
    assert no_prompt.returncode == 2
    assert "needs its own prompt" in json.loads(no_prompt.stdout)["error"]["message"]
    assert patchbox("discard", one).returncode == 0
    discarded = patchbox("run", "--from", one, "--prompt", "more", "--json")
    assert discarded.returncode == 2
    error = json.loads(discarded.stdout)["error"]
    assert error["code"] == "USAGE_ERROR"
    assert (
        "is discarded; a follow-up starts from a job awaiting review or applied"
        in (error["message"])
    )
