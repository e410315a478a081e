"""``patchbox run`` shows a running check's output as it comes, in a subprocess on the real
daemon: with ``--log-format json`` every line is a ``check_output`` log event; on the console
the progress shows its latest line; SIGTERM while the check runs cancels the job and leaves
no container."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import docker
import pytest

from controller.jobs.store import JobStore
from controller.sandbox.base import Runtime
from tests.support.cli import job_files
from tests.support.jobs import check_call, containers_of, make_repo
from tests.support.paths import REPO_ROOT

pytestmark = pytest.mark.docker

LOOP = {
    "argv": ["sh", "-c", 'i=0; while :; do echo "line $i"; i=$((i+1)); sleep 0.2; done'],
    "timeout_seconds": 600,
}
BRIEF = {
    "argv": ["sh", "-c", 'for i in 0 1 2 3 4 5 6 7 8 9; do echo "out $i"; sleep 0.3; done'],
    "timeout_seconds": 60,
}
LIMITS = {"memory_mb": 512, "workspace_mb": 64, "tmp_mb": 32, "wall_seconds": 240}


def _start(
    repo: Path, folder: Path, home: Path, check: dict[str, Any], runtime: Runtime, *flags: str
) -> subprocess.Popen[str]:
    task = {
        "prompt": "watch",
        "checks": {"watched": check},
        "baseline_checks": False,
        "limits": LIMITS,
    }
    calls = {"turns": [[check_call("c1", "watched")]], "final": "done"}
    args = job_files(folder, task, calls)
    command = [sys.executable, "-m", "controller", "run", "--repo", str(repo), *args]
    return subprocess.Popen(
        [*command, "--runtime", runtime, "--json", *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO_ROOT,
        env={**os.environ, "PATCHBOX_HOME": str(home), "PYTHONPATH": str(REPO_ROOT)},
    )


def _events(err: str) -> list[dict[str, Any]]:
    out = []
    for line in err.splitlines():
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


@pytest.mark.usefixtures("sandbox_image")
def test_json_log_lines_carry_every_output_line_and_sigterm_leaves_nothing(
    docker_client: docker.DockerClient, tmp_path: Path, runtime: Runtime
) -> None:
    repo = make_repo(tmp_path / "repo")
    home = tmp_path / "home"
    proc = _start(repo, tmp_path / "in", home, LOOP, runtime, "--log-format", "json")
    seen: list[dict[str, Any]] = []
    assert proc.stderr is not None
    deadline = time.monotonic() + 180
    try:
        while time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                break
            seen += [e for e in _events(line) if e.get("event") == "check_output"]
            if len(seen) >= 5:
                break
        assert len(seen) >= 5, seen
        job_id = JobStore(home / "jobs").all()[-1].job_id
        assert containers_of(docker_client, job_id)
        proc.send_signal(signal.SIGTERM)
        out, _err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert [e["line"] for e in seen[:5]] == [f"line {n}" for n in range(5)]
    assert {(e["check_id"], e["handle"][:4]) for e in seen} == {("watched", "chk_")}
    assert proc.returncode == 143
    assert json.loads(out)["status"] == "cancelled"
    assert containers_of(docker_client, job_id) == []


@pytest.mark.usefixtures("sandbox_image")
def test_the_console_progress_shows_the_latest_output_line(
    tmp_path: Path, runtime: Runtime
) -> None:
    repo = make_repo(tmp_path / "repo")
    proc = _start(repo, tmp_path / "in", tmp_path / "home", BRIEF, runtime)
    out, err = proc.communicate(timeout=240)
    shown = [line for line in err.splitlines() if "check watched: out " in line]
    assert shown, err
    assert len(shown) < 10  # the latest line, not every line
    assert "turn 1 run_check watched: passed (exit 0)" in err
    assert json.loads(out)["status"] == "no_change"
