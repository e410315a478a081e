"""``patchbox run --attempts N`` on a real repository and the real daemon, as a user runs it:
best of 3 with one failing attempt ranked last and the chosen one applied (the others then
discarded, the repository holding the chosen diff only), attempts that cannot see each
other's sandbox, and a wrong number of calls files refused before anything runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import docker
import pytest

from controller.jobs.store import JobStore
from tests.support.cli import job_files, patchbox
from tests.support.git import init
from tests.support.jobs import APP, APP_AFTER, EDIT, FILES, GREET, call, containers_of

TASK = {
    "prompt": "Capitalize the greeting.",
    "checks": {"greet": GREET},
    "mode": "auto",
    "limits": {"memory_mb": 512, "workspace_mb": 64, "tmp_mb": 32, "wall_seconds": 120},
}
WRONG = {
    "name": "replace_text",
    "arguments": {"path": "app.py", "oldText": '"hello "', "newText": '"HELLO "'},
}
NOTES = {
    "name": "replace_text",
    "arguments": {"path": "notes.txt", "oldText": "old notes", "newText": "new notes"},
}
NEW_FILE = "--- /dev/null\n+++ b/mine.txt\n@@ -0,0 +1 @@\n+attempt one was here\n"


def _calls(folder: Path, name: str, *turns: list[dict[str, Any]]) -> str:
    path = folder / f"{name}.json"
    path.write_text(json.dumps({"turns": list(turns), "final": name}))
    return str(path)


@pytest.mark.docker
def test_best_of_three_ranks_the_failing_one_last_and_applies_the_chosen_one(
    docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> None:
    del sandbox_image
    repo = init(tmp_path / "repo", FILES, message="greet").path
    folder = tmp_path / "job"
    args = job_files(folder, TASK, {"turns": []}, "spare_sandboxes = 0\nallow_auto = true\n")
    args = args[: args.index("--calls")] + args[args.index("--calls") + 2 :]
    calls = [
        _calls(folder, "small", [call("c1", EDIT)]),
        _calls(folder, "wrong", [call("c1", WRONG)]),
        _calls(folder, "larger", [call("c1", EDIT), call("c2", NOTES)]),
    ]
    proc = patchbox(
        "run",
        "--repo",
        str(repo),
        *args,
        "--attempts",
        "3",
        *(x for c in calls for x in ("--calls", c)),
        "--json",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    ranked = [(a["rank"], a["attempt"], a["status"]) for a in out["attempts"]]
    assert ranked == [(1, 1, "awaiting_review"), (2, 3, "awaiting_review"), (3, 2, "failed")]
    assert out["attempts"][2]["error"]["code"] == "CHECK_FAILED"
    ids = [a["job_id"] for a in out["attempts"]]
    assert len(set(ids)) == 3
    for a in out["attempts"]:  # auto mode, yet none applied itself: one of three
        assert a["decision"]["applied"] is False
        assert not containers_of(docker_client, a["job_id"])
    assert (repo / "app.py").read_text() == APP
    assert "attempt 1/3" in proc.stderr
    assert "attempt 3/3" in proc.stderr

    applied = patchbox("apply", ids[0], "--json")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert sorted(json.loads(applied.stdout)["discarded"]) == sorted(ids[1:])
    assert (repo / "app.py").read_text() == APP_AFTER
    assert (repo / "notes.txt").read_text() == FILES["notes.txt"]
    store = JobStore()
    assert [store.load(i).state for i in ids] == ["applied", "discarded", "discarded"]
    record = store.load(ids[0])
    assert record.attempt is not None
    assert record.attempt.index == 1
    assert sorted(record.attempt.job_ids) == sorted(ids)


@pytest.mark.docker
def test_attempts_cannot_see_each_other(
    docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> None:
    del docker_client, sandbox_image
    repo = init(tmp_path / "repo", FILES, message="greet").path
    folder = tmp_path / "job"
    task = {
        **TASK,
        "mode": "review",
        "baseline_checks": False,
        "checks": {"wait": {"argv": ["sleep", "3"]}},
    }
    args = job_files(folder, task, {"turns": []})
    args = args[: args.index("--calls")] + args[args.index("--calls") + 2 :]
    write = {"name": "apply_patch", "arguments": {"patch": NEW_FILE}}
    wait = {"name": "run_check", "arguments": {"checkId": "wait"}}
    look = {"name": "read_file", "arguments": {"path": "mine.txt"}}
    one = _calls(folder, "one", [call("c1", write)], [call("c2", wait)])
    two = _calls(folder, "two", [call("c1", wait)], [call("c2", look)])
    proc = patchbox(
        "run", "--repo", str(repo), *args, "--attempts", "2", "--calls", one, "--calls", two
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = {r.attempt.index: r for r in JobStore().all(str(repo)) if r.attempt is not None}
    assert records[1].state == "awaiting_review"
    assert [f.path for f in records[1].files] == ["mine.txt"]
    seen = [(c.name, c.error_code) for c in records[2].tool_calls]
    assert seen == [("run_check", None), ("read_file", "TOOL_FILE_NOT_FOUND")]
    assert records[2].state == "no_change"


@pytest.mark.docker
def test_a_wrong_number_of_calls_files_is_refused_before_anything_runs(tmp_path: Path) -> None:
    repo = init(tmp_path / "repo", FILES, message="greet").path
    folder = tmp_path / "job"
    args = job_files(folder, TASK, {"turns": [[call("c1", EDIT)]]})
    calls = str(folder / "calls.json")
    proc = patchbox(
        "run", "--repo", str(repo), *args, "--calls", calls, "--attempts", "3", "--json"
    )
    assert proc.returncode == 2
    error = json.loads(proc.stdout)["error"]
    assert error["code"] == "USAGE_ERROR"
    assert "once (for every attempt) or 3 times, not 2" in error["message"]
    assert not JobStore().all(str(repo))
