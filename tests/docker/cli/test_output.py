"""What a command writes on stderr and into the log file: progress lines with the time since
the start (none with ``--quiet``), log lines as console text or JSON (``--log-format``), debug
events with ``--verbose``, every event in ``$PATCHBOX_HOME/logs/patchbox.log``, whole lines
that never interleave, and a heartbeat while one step lasts."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.support.cli import job_files, patchbox
from tests.support.jobs import EDIT, GREET, call, make_repo

PROGRESS = re.compile(r"^patchbox: \[ *\d+\.\d+s\] \S")


def test_a_job_shows_timed_progress_and_quiet_shows_none(
    docker_client: object, sandbox_image: str, tmp_path: Path
) -> None:
    del docker_client, sandbox_image
    repo = make_repo(tmp_path / "repo")
    task = {
        "prompt": "Capitalize the greeting.",
        "checks": {"greet": GREET},
        "limits": {"memory_mb": 512, "workspace_mb": 64, "tmp_mb": 32},
    }
    args = job_files(tmp_path / "job", task, {"turns": [[call("c1", EDIT)]], "final": "done"})
    loud = patchbox("run", "--repo", str(repo), *args, "--json")
    assert loud.returncode == 0, loud.stderr
    lines = loud.stderr.splitlines()
    assert lines
    assert all(PROGRESS.match(line) for line in lines), lines
    assert [line.split("] ", 1)[1] for line in lines][:3] == [
        "preparing",
        "checks before the change",  # the required check runs once on the baseline
        "running",
    ]
    args = job_files(tmp_path / "job2", task, {"turns": [[call("c1", EDIT)]], "final": "done"})
    quiet = patchbox("run", "--repo", str(repo), *args, "--json", "--quiet")
    assert quiet.returncode == 0
    assert quiet.stderr == ""
    assert json.loads(quiet.stdout)["status"] == "awaiting_review"
