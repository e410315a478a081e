"""The job commands as a user types them, in subprocesses: ``--repo`` defaults to the
repository of the current folder (a sub-folder included); a job is named by a unique
prefix of its id or ``last``; ``patchbox cancel JOB`` ends a job another ``patchbox run``
process runs (``cancelled``, its sandboxes removed, the repository's lock released); a
second job on a locked repository is refused naming the job that holds it; a refusal that
is the user's to fix leaves no job record; ``jobs`` has a header row."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import docker
import pytest

from controller.jobs.records import JobRecord
from controller.jobs.store import JobStore
from tests.support.cli import job_files
from tests.support.jobs import EDIT, GREET, call, check_call, containers_of, make_repo
from tests.support.paths import REPO_ROOT

pytestmark = pytest.mark.docker

HOLD = {"argv": ["sh", "-c", "echo holding; sleep 120"], "timeout_seconds": 300}
LIMITS = {"memory_mb": 512, "workspace_mb": 64, "tmp_mb": 32, "wall_seconds": 240}


def environ(home: Path) -> dict[str, str]:
    return {
        **os.environ,
        "PATCHBOX_HOME": str(home),
        "PYTHONPATH": f"{REPO_ROOT}{os.pathsep}{REPO_ROOT / 'sandbox-image'}",
    }


def patchbox_in(
    cwd: Path, home: Path, *args: str, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """``patchbox ARGS`` run from the folder ``cwd``, with the state folder ``home``."""
    return subprocess.run(
        [sys.executable, "-m", "controller", *args],
        capture_output=True,
        text=True,
        env=environ(home),
        cwd=cwd,
        timeout=timeout,
        check=False,
    )


def quick_job(folder: Path) -> list[str]:
    """A job that edits app.py and passes its check: awaiting review."""
    task = {"prompt": "Capitalize the greeting.", "checks": {"greet": GREET}, "limits": LIMITS}
    calls = {"turns": [[call("c1", EDIT)]], "final": "done"}
    return job_files(folder, task, calls)


def holding_job(folder: Path) -> list[str]:
    """A job whose second call runs a check that sleeps for two minutes."""
    task = {
        "prompt": "Capitalize the greeting.",
        "checks": {"hold": HOLD},
        "limits": LIMITS,
        "baseline_checks": False,
    }
    calls = {"turns": [[call("c1", EDIT)], [check_call("c2", "hold")]], "final": "done"}
    return job_files(folder, task, calls)


def records(home: Path) -> list[JobRecord]:
    return JobStore(home / "jobs").all()


def listed(home: Path) -> list[dict[str, Any]]:
    done = patchbox_in(REPO_ROOT, home, "jobs", "--json")
    assert done.returncode == 0, done.stderr
    jobs: list[dict[str, Any]] = json.loads(done.stdout)["jobs"]
    return jobs


def wait_for_hold(client: docker.DockerClient, home: Path, proc: subprocess.Popen[str]) -> str:
    """Waits until the holding job ran its first call and its sandbox runs; its id."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        found = records(home)
        if found and found[-1].state == "running" and found[-1].tool_calls:
            job_id = found[-1].job_id
            if containers_of(client, job_id):
                time.sleep(2.0)
                return job_id
        time.sleep(0.2)
    proc.kill()
    pytest.fail(f"the job never reached its check: {proc.communicate()}")


@pytest.mark.usefixtures("sandbox_image")
def test_repo_defaults_to_the_current_folders_repository_and_ids_take_prefixes(
    tmp_path: Path,
) -> None:
    repo = make_repo(tmp_path / "greet")
    (repo / "pkg" / "deep").mkdir(parents=True)
    home = tmp_path / "home"
    args = quick_job(tmp_path / "inputs")
    ran = patchbox_in(repo / "pkg" / "deep", home, "run", *args, "--json")
    assert ran.returncode == 0, ran.stderr
    data = json.loads(ran.stdout)
    job_id = data["job_id"]
    assert data["status"] == "awaiting_review"
    [record] = records(home)
    assert (record.job_id, record.repo) == (job_id, str(repo.resolve()))

    # ``last`` and a unique prefix name the job; show, apply and revert take them.
    for ref in ("last", job_id[:-3], job_id):
        shown = patchbox_in(tmp_path, home, "show", ref, "--json")
        assert shown.returncode == 0, shown.stderr
        assert json.loads(shown.stdout)["job_id"] == job_id
    applied = patchbox_in(tmp_path, home, "apply", job_id[:-4], "--json")
    assert applied.returncode == 0, applied.stderr
    assert json.loads(applied.stdout)["job_id"] == job_id
    assert '"Hello "' in (repo / "app.py").read_text()
    reverted = patchbox_in(tmp_path, home, "revert", "last", "--json")
    assert reverted.returncode == 0, reverted.stderr
    assert json.loads(reverted.stdout)["status"] == "reverted"

    # A second job: the prefix they share is ambiguous, and says which ids it could be.
    again = patchbox_in(repo, home, "run", *args, "--json")
    assert again.returncode == 0, again.stderr
    second = json.loads(again.stdout)["job_id"]
    newest = patchbox_in(tmp_path, home, "show", "last", "--json")
    assert json.loads(newest.stdout)["job_id"] == second
    common = job_id[
        : next(i for i, (a, b) in enumerate(zip(job_id, second, strict=True)) if a != b)
    ]
    ambiguous = patchbox_in(tmp_path, home, "show", common, "--json")
    assert ambiguous.returncode == 2
    error = json.loads(ambiguous.stdout)["error"]
    assert error["code"] == "USAGE_ERROR"
    assert job_id in error["message"]
    assert second in error["message"]
    missing = patchbox_in(tmp_path, home, "discard", "zzz", "--json")
    assert missing.returncode == 2
    assert str(home / "jobs") in json.loads(missing.stdout)["error"]["message"]

    # ``jobs`` has a header row, then one line per job.
    text = patchbox_in(tmp_path, home, "jobs").stdout.splitlines()
    assert text[0].split() == ["JOB", "STATUS", "CREATED", "DURATION", "ERROR", "REPO"]
    assert [line.split()[0] for line in text[1:]] == [job_id, second]


def test_outside_any_repository_without_repo_is_usage(tmp_path: Path) -> None:
    home = tmp_path / "home"
    plain = tmp_path / "plain"
    plain.mkdir()
    args = quick_job(tmp_path / "inputs")
    done = patchbox_in(plain, home, "run", *args, "--json")
    assert done.returncode == 2, done.stderr
    error = json.loads(done.stdout)["error"]
    assert error["code"] == "NOT_A_REPOSITORY"
    assert error["message"].startswith("no --repo given, and ")
    assert str(plain) in error["message"]
    assert listed(home) == []


@pytest.mark.usefixtures("sandbox_image")
@pytest.mark.parametrize("where", ["not-a-repo", "sub-folder", "missing", "dirty"])
def test_a_refusal_that_is_the_users_to_fix_leaves_no_job(tmp_path: Path, where: str) -> None:
    repo = make_repo(tmp_path / "greet")
    (repo / "pkg").mkdir()
    (repo / "pkg" / "x.py").write_text("x = 1\n")  # an untracked file: a dirty work tree
    (tmp_path / "plain").mkdir()
    path = {
        "not-a-repo": tmp_path / "plain",
        "sub-folder": repo / "pkg",
        "missing": tmp_path / "nowhere",
        "dirty": repo,
    }[where]
    home = tmp_path / "home"
    args = quick_job(tmp_path / "inputs")
    done = patchbox_in(tmp_path, home, "run", "--repo", str(path), *args, "--json")
    error = json.loads(done.stdout)["error"]
    if where == "dirty":
        assert (done.returncode, error["code"]) == (1, "CONSENT_REQUIRED")
        assert "untracked: pkg/x.py)" in error["message"]
        assert error["hint"]["text"] == "pass --include-local-changes to include them"
    else:
        assert (done.returncode, error["code"]) == (2, "NOT_A_REPOSITORY")
    assert f"patchbox: error {error['code']}: " in done.stderr
    assert listed(home) == []
    assert records(home) == []


@pytest.mark.usefixtures("sandbox_image")
def test_cancel_ends_a_job_another_process_runs(
    docker_client: docker.DockerClient, tmp_path: Path
) -> None:
    repo = make_repo(tmp_path / "greet")
    home = tmp_path / "home"
    proc = subprocess.Popen(
        [sys.executable, "-m", "controller", "run", *holding_job(tmp_path / "hold"), "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=repo,
        env=environ(home),
    )
    try:
        job_id = wait_for_hold(docker_client, home, proc)

        # A second job on the repository is refused, naming the one that holds it, and
        # leaves no record.
        second = patchbox_in(repo, home, "run", *quick_job(tmp_path / "quick"), "--json")
        assert second.returncode == 1, second.stderr
        error = json.loads(second.stdout)["error"]
        assert error["code"] == "JOB_ALREADY_RUNNING"
        assert f"job {job_id} holds it" in error["message"]
        assert [j["job_id"] for j in listed(home)] == [job_id]

        # Cancelled from another process, by a prefix of its id.
        started = time.monotonic()
        cancelled = patchbox_in(tmp_path, home, "cancel", job_id[:-2], "--json")
        assert cancelled.returncode == 0, cancelled.stderr
        assert json.loads(cancelled.stdout) == {"job_id": job_id, "status": "cancelled"}
        assert time.monotonic() - started < 60
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 1, err
    data = json.loads(out)
    assert (data["job_id"], data["status"], data["error"]["code"]) == (
        job_id,
        "cancelled",
        "CANCELLED",
    )
    assert "cancelling (requested from another process)" in err
    assert "Traceback" not in err
    assert JobStore(home / "jobs").load(job_id).state == "cancelled"
    assert containers_of(docker_client, job_id) == []

    # The lock went with it: the next job runs, and a job that ended is not cancelled.
    after = patchbox_in(repo, home, "run", *quick_job(tmp_path / "quick"), "--json")
    assert after.returncode == 0, after.stderr
    again = patchbox_in(tmp_path, home, "cancel", job_id, "--json")
    assert again.returncode == 2
    message = json.loads(again.stdout)["error"]["message"]
    assert message == f"job {job_id} is cancelled; only a running job is cancelled"
