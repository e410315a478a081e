"""The exit statuses a CI job keys on, each through the CLI: 0 success, 1 a job or check
failed, 2 bad usage (also a path that is not a repository, or a sub-folder of one), 3 the
environment is not ready, 4 the model provider failed; an auto mode that fell back to review
says so on stderr and in the JSON. (130, 143 and 129 after a signal: tests/test_lifecycle.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import docker
import pytest

from tests.support.cli import job_files, patchbox
from tests.support.jobs import EDIT, GREET, call, make_repo
from tests.support.loopback import LoopbackServer, json_reply

TASK = {
    "prompt": "Capitalize the greeting.",
    "checks": {"greet": GREET},
    "limits": {"memory_mb": 512, "workspace_mb": 64, "tmp_mb": 32, "wall_seconds": 120},
}
CALLS = {"turns": [[call("c1", EDIT)]], "final": "done"}


def _error(proc: object) -> str:
    out = json.loads(getattr(proc, "stdout", "") or "{}")
    return str(out["error"]["code"])


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


def test_a_provider_that_refuses_the_key_is_four(
    docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> None:
    del docker_client, sandbox_image
    repo = make_repo(tmp_path / "repo")
    (tmp_path / "task.json").write_text(json.dumps(TASK))
    (tmp_path / "config.toml").write_text("spare_sandboxes = 0\n")
    with LoopbackServer() as server:
        server.play(json_reply({"error": {"message": "bad key"}}, status=401))
        proc = patchbox(
            "run",
            "--repo",
            str(repo),
            "--task",
            str(tmp_path / "task.json"),
            "--config",
            str(tmp_path / "config.toml"),
            "--json",
            env={
                "OPENAI_BASE_URL": server.url,
                "OPENAI_API_KEY": "sk-test-not-a-real-key",
                "PATCHBOX_MODEL": "m",
            },
        )
    assert proc.returncode == 4, proc.stderr
    out = json.loads(proc.stdout)
    assert (out["status"], out["error"]["code"]) == ("failed", "PROVIDER_ERROR")
    assert "sk-test-not-a-real-key" not in proc.stdout + proc.stderr


def test_success_failure_and_an_auto_fallback(
    docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> None:
    del docker_client, sandbox_image
    repo = make_repo(tmp_path / "repo")
    ok = patchbox("run", "--repo", str(repo), *job_files(tmp_path / "ok", TASK, CALLS), "--json")
    assert ok.returncode == 0, ok.stderr
    assert "review_fallback" not in json.loads(ok.stdout)
    failing = {**TASK, "checks": {"no": {"argv": ["false"]}}}
    bad = patchbox(
        "run", "--repo", str(repo), *job_files(tmp_path / "bad", failing, CALLS), "--json"
    )
    assert (bad.returncode, _error(bad)) == (1, "CHECK_FAILED")
    auto = {**TASK, "mode": "auto"}
    fell = patchbox(
        "run", "--repo", str(repo), *job_files(tmp_path / "auto", auto, CALLS), "--json"
    )
    assert fell.returncode == 0, fell.stderr
    out = json.loads(fell.stdout)
    assert out["status"] == "awaiting_review"
    assert "allow_auto = false" in out["review_fallback"]
    assert f"auto mode fell back to review: {out['review_fallback']}" in fell.stderr
