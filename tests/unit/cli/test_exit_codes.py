"""The exit statuses a CI job keys on, each through the CLI: 0 success, 1 a job or check
failed, 2 bad usage (also a path that is not a repository, or a sub-folder of one), 3 the
environment is not ready, 4 the model provider failed; an auto mode that fell back to review
says so on stderr and in the JSON. (130, 143 and 129 after a signal: tests/docker/sandbox/test_lifecycle.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.cli import job_files, patchbox
from tests.support.exits import CALLS, TASK, _error
from tests.support.jobs import make_repo


@pytest.mark.parametrize("where", ["not-a-repo", "sub-folder", "missing"])
def test_a_path_that_is_not_a_repository_top_is_usage(where: str, tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    (repo / "pkg").mkdir()
    (tmp_path / "plain").mkdir()
    path = {
        "not-a-repo": tmp_path / "plain",
        "sub-folder": repo / "pkg",
        "missing": tmp_path / "nowhere",
    }[where]
    args = job_files(tmp_path / "job", TASK, CALLS)
    proc = patchbox("run", "--repo", str(path), *args, "--json", env={"DOCKER_HOST": ""})
    assert proc.returncode == 2, proc.stderr
    assert _error(proc) == "NOT_A_REPOSITORY"


def test_a_bad_task_file_is_usage(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    args = job_files(tmp_path / "job", {"prompt": "p", "nope": 1}, CALLS)
    proc = patchbox("run", "--repo", str(repo), *args, "--json")
    assert (proc.returncode, _error(proc)) == (2, "USAGE_ERROR")


def test_no_docker_daemon_is_not_ready(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    args = job_files(tmp_path / "job", TASK, CALLS)
    socket = f"unix://{tmp_path}/no-docker.sock"
    proc = patchbox("run", "--repo", str(repo), *args, "--json", env={"DOCKER_HOST": socket})
    assert (proc.returncode, _error(proc)) == (3, "ENVIRONMENT_NOT_READY")


def test_a_wrong_repo_is_named_before_the_model_or_docker(tmp_path: Path) -> None:
    """No model configured and no Docker daemon to reach: a ``--repo`` that is not a
    repository is still what ``run`` reports, first."""
    task = tmp_path / "task.json"
    task.write_text('{"prompt": "p"}')
    env = {
        "DOCKER_HOST": f"unix://{tmp_path / 'no-daemon.sock'}",
        "PATCHBOX_MODEL": "",
        "OPENAI_API_KEY": "",
        "OPENAI_BASE_URL": "",
    }
    proc = patchbox(
        "run", "--repo", str(tmp_path / "nowhere"), "--task", str(task), "--json", env=env
    )
    assert proc.returncode == 2, proc.stderr
    assert _error(proc) == "NOT_A_REPOSITORY"
