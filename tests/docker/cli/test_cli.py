"""The command line: exit codes, JSON output, and the not-ready path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from controller.logs import REDACTED, redact
from tests.support.git import init


def _patchbox(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "controller", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=600,
        check=False,
    )


def test_bad_usage_exits_2() -> None:
    res = _patchbox("no-such-command", "--json")
    assert res.returncode == 2
    assert json.loads(res.stdout)["error"]["code"] == "USAGE_ERROR"


def test_unreachable_daemon_exits_3_with_an_instruction(tmp_path: Any) -> None:
    res = _patchbox("doctor", "--json", env={"DOCKER_HOST": f"unix://{tmp_path}/no.sock"})
    assert res.returncode == 3
    report = json.loads(res.stdout)
    assert report["ready"] is False
    assert "docker daemon unreachable" in report["problems"]
    assert any("start Docker" in a for a in report["advice"])
    res = _patchbox("image", "build", "--json", env={"DOCKER_HOST": f"unix://{tmp_path}/no.sock"})
    assert res.returncode == 3
    assert json.loads(res.stdout)["error"]["code"] == "ENVIRONMENT_NOT_READY"


@pytest.mark.docker
def test_doctor_repo_reports_health_with_reasons_and_counts(
    sandbox_image: str, tmp_path: Any
) -> None:
    repo = init(tmp_path / "r", {"a.txt": "a\n"}, message="one").path
    (repo / "a.txt").write_text("changed\n")
    (repo / "b.txt").write_text("new\n")
    res = _patchbox("doctor", "--json", "--repo", str(repo))
    assert res.returncode == 0, res.stderr
    health = json.loads(res.stdout)["repository"]
    assert health["ok"] is True
    assert health["counts"] == {
        "staged_files": 0,
        "unstaged_files": 1,
        "untracked_files": 1,
        "changed_files": 2,
        "local_bytes": 12,
    }
    res = _patchbox("doctor", "--json", "--repo", str(repo), "--max-local-files", "1")
    assert res.returncode == 1
    codes = [r["code"] for r in json.loads(res.stdout)["repository"]["reasons"]]
    assert codes == ["LOCAL_CHANGES_TOO_MANY_FILES"]
    res = _patchbox("doctor", "--repo", str(tmp_path))
    assert res.returncode == 1
    assert "blocked: NOT_A_REPOSITORY" in res.stdout
    res = _patchbox("doctor", "--repo", str(repo), "--max-local-files", "-1")
    assert res.returncode == 2


@pytest.mark.docker
def test_doctor_reports_daemon_runtimes_and_image(
    sandbox_image: str, runsc_available: bool
) -> None:
    res = _patchbox("doctor", "--json")
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)
    assert report["ready"] is True
    assert report["docker"]["api_version"]
    assert "runc" in report["docker"]["runtimes"]
    assert report["image"] == {"base": report["image"]["base"], "tag": sandbox_image, "ready": True}
    assert report["runsc"]["registered"] is runsc_available
    if runsc_available:
        assert report["runsc"]["works"] is True
    assert report["git"]
    assert isinstance(report["spares"], list)


def test_doctor_names_the_state_the_config_and_the_provider(
    sandbox_image: str, tmp_path: Path
) -> None:
    del sandbox_image
    config = tmp_path / "config.toml"
    config.write_text(
        'spare_sandboxes = 3\n[provider]\nmodel = "m1"\nbase_url = "http://127.0.0.1:9/v1"\n'
        'api_key_env = "DOCTOR_TEST_KEY"\n'
    )
    res = _patchbox("doctor", "--config", str(config), "--json")
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)
    assert report["home"] == os.environ["PATCHBOX_HOME"]
    assert report["config"] == str(config)
    assert report["spare_sandboxes"] == 3
    assert report["provider"] == {
        "configured": True,
        "model": "m1",
        "base_url": "http://127.0.0.1:9/v1",
        "key_variable": "DOCTOR_TEST_KEY",
        "key_set": False,
    }
    text = _patchbox("doctor", "--config", str(config)).stdout
    assert f"config: {config}" in text
    assert "provider: m1 at http://127.0.0.1:9/v1 (key DOCTOR_TEST_KEY not set)" in text
    bad = tmp_path / "bad.toml"
    bad.write_text("spare_sandboxes = [")
    broken = json.loads(_patchbox("doctor", "--config", str(bad), "--json").stdout)
    assert str(bad) in broken["config_error"]
    assert broken["config_error"] in broken["problems"]


@pytest.mark.docker
def test_image_build_is_cached(sandbox_image: str) -> None:
    res = _patchbox("image", "build", "--json")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["tag"] == sandbox_image
    assert data["built"] is False


@pytest.mark.docker
def test_demo_runs_a_full_job_to_review(sandbox_image: str) -> None:
    res = _patchbox("demo", "--json")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["status"] == "awaiting_review"
    assert data["error"] is None
    names = [c["name"] for c in data["tool_calls"]]
    assert names == ["search_text", "read_file", "run_check", "replace_text", "run_check"]
    assert all(c["ok"] for c in data["tool_calls"])
    assert data["checks"][0]["id"] == "tests"
    assert data["checks"][0]["status"] == "passed"
    assert "+    if not text.strip():" in data["diff"]
    assert data["diff"].startswith("diff --git a/calc/parser.py b/calc/parser.py")
    assert data["next"][1] == f"patchbox apply {data['job_id']}"
    assert sandbox_image.startswith("patchbox-sandbox:")


def test_redaction_masks_secrets_and_private_paths(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-1234567890")
    monkeypatch.setenv("PATCHBOX_HOME", str(tmp_path))
    event = {
        "event": "x",
        "api_key": "anything",
        "detail": f"failed at {tmp_path}/jobs/1 with sk-test-1234567890",
        "count": 3,
    }
    out = redact(None, "info", event)
    assert out["api_key"] == REDACTED
    assert "sk-test" not in out["detail"]
    assert str(tmp_path) not in out["detail"]
    assert out["count"] == 3
