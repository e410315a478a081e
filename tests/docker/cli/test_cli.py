"""The command line: exit codes, JSON output, and the not-ready path."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.support.entry import _patchbox
from tests.support.git import init


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
    assert data["check_changes"] == [  # the tests fail before the fix, pass after it
        {"id": "tests", "before": "failed", "after": "passed", "change": "fixed"}
    ]
    assert "+    if not text.strip():" in data["diff"]
    assert data["diff"].startswith("diff --git a/calc/parser.py b/calc/parser.py")
    assert data["next"][1] == f"patchbox apply {data['job_id']}"
    assert sandbox_image.startswith("patchbox-sandbox:")
