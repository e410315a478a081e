"""Many jobs at once, as a CI runner or a shared dev box starts them: ``patchbox run`` in
parallel processes on one state directory (different repositories, and several on the same
one) and on a second state directory beside it, all on one daemon, spares on.

Every job ends in a clean terminal state with its JSON and no traceback; on the shared
repository exactly one job runs and the others get ``JOB_ALREADY_RUNNING``; no container of
any of them is left.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import docker
import docker.errors
import pytest

from controller.jobs.store import JobStore
from controller.sandbox.labels import HOME, JOB, KIND, home_id
from tests.support.cli import job_files
from tests.support.jobs import EDIT, GREET, call, check_call, make_repo
from tests.support.paths import REPO_ROOT

pytestmark = pytest.mark.docker

ROOT = REPO_ROOT
DISTINCT_A = 6
DISTINCT_B = 3
SHARED = 3
HOLD = {"argv": ["sh", "-c", "sleep 25; python3 check.py"], "timeout_seconds": 120}
"""Long enough that every job on the shared repository asks for its lock while the first
one holds it (the processes start at once, but on two cores)."""
READ = {"name": "read_file", "arguments": {"path": "app.py"}}


def inputs(folder: Path, check: dict[str, Any]) -> list[str]:
    task = {
        "prompt": "Capitalize the greeting.",
        "checks": {"greet": check},
        "baseline_checks": False,  # HOLD holds as a tool call only
        "limits": {"memory_mb": 256, "workspace_mb": 32, "tmp_mb": 16, "wall_seconds": 300},
    }
    calls = {
        "turns": [[call("c1", READ)], [call("c2", EDIT)], [check_call("c3", "greet")]],
        "final": "done",
    }
    return job_files(folder, task, calls, "spare_sandboxes = 1\nspare_idle_seconds = 30\n")


def start(repo: Path, args: list[str], home: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "controller", "run", "--repo", str(repo), *args, "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PATCHBOX_HOME": str(home)},
    )


def remove_spares(client: docker.DockerClient, homes: list[Path]) -> None:
    ids = {home_id(h) for h in homes}
    for c in client.containers.list(all=True, filters={"label": f"{KIND}=spare"}, sparse=True):
        if c.attrs["Labels"].get(HOME) in ids:
            try:
                client.api.remove_container(c.id or "", force=True)
            except docker.errors.NotFound:
                pass


@pytest.mark.usefixtures("sandbox_image")
@pytest.mark.timeout(900)
def test_many_jobs_at_once_on_two_homes(docker_client: docker.DockerClient, tmp_path: Path) -> None:
    home_a, home_b = tmp_path / "home-a", tmp_path / "home-b"
    quick_a = inputs(tmp_path / "in-a", GREET)
    quick_b = inputs(tmp_path / "in-b", GREET)
    hold = inputs(tmp_path / "in-hold", HOLD)
    shared = make_repo(tmp_path / "shared")
    plan: list[tuple[str, Path, list[str], Path]] = [
        ("a", make_repo(tmp_path / f"a{i}"), quick_a, home_a) for i in range(DISTINCT_A)
    ]
    plan += [("b", make_repo(tmp_path / f"b{i}"), quick_b, home_b) for i in range(DISTINCT_B)]
    plan += [("shared", shared, hold, home_a) for _ in range(SHARED)]
    started = time.monotonic()
    procs = [(kind, start(repo, args, home)) for kind, repo, args, home in plan]
    results: list[tuple[str, int, dict[str, Any], str]] = []
    try:
        for kind, proc in procs:
            out, err = proc.communicate(timeout=max(30.0, 420 - (time.monotonic() - started)))
            assert "Traceback" not in err, err
            results.append((kind, proc.returncode, json.loads(out), err))
    finally:
        for _, proc in procs:
            if proc.poll() is None:
                proc.kill()
        remove_spares(docker_client, [home_a, home_b])
    for kind, code, data, err in results:
        if kind != "shared":
            assert (code, data["status"], data["error"]) == (0, "awaiting_review", None), err
    on_shared = [(code, data) for kind, code, data, _ in results if kind == "shared"]
    [ran] = [data for _, data in on_shared if "job_id" in data]
    assert (ran["status"], ran["error"]) == ("awaiting_review", None)
    refused = [(code, data["error"]) for code, data in on_shared if "job_id" not in data]
    assert [(code, e["code"]) for code, e in refused] == [(1, "JOB_ALREADY_RUNNING")] * (SHARED - 1)
    for _, error in refused:  # named the job that held the repository
        assert error["message"].endswith(f"job {ran['job_id']} holds it"), error
    # A refused job leaves no record: the shared repository has one job.
    assert [r.job_id for r in JobStore(home_a / "jobs").all(str(shared.resolve()))] == [
        ran["job_id"]
    ]
    for _, _, data, _ in results:
        if "job_id" not in data:
            continue
        left = docker_client.containers.list(
            all=True, filters={"label": f"{JOB}={data['job_id']}"}, sparse=True
        )
        assert left == [], data["job_id"]
