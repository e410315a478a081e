"""The exit statuses a CI job keys on, each through the CLI: 0 success, 1 a job or check
failed, 2 bad usage (also a path that is not a repository, or a sub-folder of one), 3 the
environment is not ready, 4 the model provider failed; an auto mode that fell back to review
says so on stderr and in the JSON. (130, 143 and 129 after a signal: tests/docker/sandbox/test_lifecycle.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import docker

from tests.support.cli import job_files, patchbox
from tests.support.exits import CALLS, TASK, _error
from tests.support.jobs import make_repo
from tests.support.loopback import LoopbackServer, json_reply


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
    tried = f"chat completions at {server.url}/chat/completions: HTTP 401"
    assert out["error"]["message"] == tried  # the URL it tried, never the key
    assert "sk-test-not-a-real-key" not in proc.stdout + proc.stderr


def test_success_failure_and_an_auto_fallback(
    docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> None:
    del docker_client, sandbox_image
    repo = make_repo(tmp_path / "repo")
    ok = patchbox("run", "--repo", str(repo), *job_files(tmp_path / "ok", TASK, CALLS), "--json")
    assert ok.returncode == 0, ok.stderr
    assert "review_fallback" not in json.loads(ok.stdout)
    failing = {**TASK, "checks": {"no": {"argv": ["false"]}}, "baseline_checks": False}
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
