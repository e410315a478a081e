"""The command line: exit codes, JSON output, and the not-ready path."""

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

from controller.identity import CONTROLLER
from controller.sandbox.labels import HOME, KIND, OWNER_FILTER, home_id
from tests.support.cli import job_files
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
    verdicts = [c.get("verdict") for c in data["tool_calls"] if c["name"] == "run_check"]
    assert verdicts == ["tests: failed, exit 1", "tests: passed"]
    assert data["checks"][0]["id"] == "tests"
    assert data["checks"][0]["status"] == "passed"
    assert data["check_changes"] == [  # the tests fail before the fix, pass after it
        {"id": "tests", "before": "failed", "after": "passed", "change": "fixed"}
    ]
    assert "+    if not text.strip():" in data["diff"]
    assert data["diff"].startswith("diff --git a/calc/parser.py b/calc/parser.py")
    assert data["next"][1] == f"patchbox apply {data['job_id']}"
    assert sandbox_image.startswith("patchbox-sandbox:")


def _containers_made_by(client: docker.DockerClient, pid: int, since: int) -> list[str]:
    """Containers a patchbox process ``pid`` created since ``since`` (the daemon's events,
    so a container created and removed at once counts too)."""
    events = client.events(
        since=since,
        until=int(time.time()) + 1,
        decode=True,
        filters={"type": "container", "event": "create", "label": OWNER_FILTER},
    )
    made = []
    for event in events:
        attributes = event.get("Actor", {}).get("Attributes", {})
        token = attributes.get(CONTROLLER, "")
        if token.split(":")[1:2] == [str(pid)]:
            made.append(attributes.get("name", ""))
    return made


def _run_process(
    repo: Path, folder: Path, config: str, *, calls: bool
) -> tuple[subprocess.CompletedProcess[str], int]:
    args = job_files(folder, {"prompt": "p"}, {"turns": [], "final": "done"}, config)
    if not calls:
        args = args[:2] + args[4:]
    env = {
        **os.environ,
        "OPENAI_API_KEY": "",
        "OPENAI_BASE_URL": "",
        "PATCHBOX_MODEL": "",
        "RUN_KEY": "sk-run-PLANTED-51c0",
    }
    with subprocess.Popen(
        [sys.executable, "-m", "controller", "run", "--repo", str(repo), *args, "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    ) as proc:
        out, err = proc.communicate(timeout=300)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), proc.pid


@pytest.mark.docker
def test_run_without_a_usable_provider_starts_no_sandbox(
    docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> None:
    """No provider, or one whose key would cross plain http to a host that is not
    loopback: ``run`` refuses it (USAGE_ERROR) before any container exists; the same run
    with a calls file does start one (the check can see one)."""
    del sandbox_image
    repo = init(tmp_path / "r", {"a.txt": "a\n"}).path
    since = int(time.time()) - 1
    refused = {
        "none": "spare_sandboxes = 0\n",
        "plain http": (
            'spare_sandboxes = 0\n[provider]\nmodel = "m"\n'
            'base_url = "http://10.20.30.40:8080/v1"\napi_key_env = "RUN_KEY"\n'
        ),
    }
    for name, config in refused.items():
        proc, pid = _run_process(repo, tmp_path / name, config, calls=False)
        assert proc.returncode == 2, (name, proc.stdout, proc.stderr)
        error = json.loads(proc.stdout)["error"]
        assert error["code"] == "USAGE_ERROR"
        assert "sk-run-PLANTED" not in proc.stdout + proc.stderr
        assert _containers_made_by(docker_client, pid, since) == [], name
    proc, pid = _run_process(repo, tmp_path / "calls", refused["none"], calls=True)
    assert json.loads(proc.stdout)["job_id"], proc.stderr
    assert _containers_made_by(docker_client, pid, since) != []


def _spares_of(client: docker.DockerClient, home: Path) -> list[str]:
    labels = [f"{KIND}=spare", f"{HOME}={home_id(home)}"]
    return [
        c.id or "" for c in client.containers.list(all=True, filters={"label": labels}, sparse=True)
    ]


def _spares_soon(client: docker.DockerClient, home: Path) -> list[str]:
    """The home's spares once one is there (it is offered as the job ends), or none in 10 s."""
    deadline = time.monotonic() + 10
    while not (found := _spares_of(client, home)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return found


@pytest.mark.docker
def test_prune_spares_removes_this_homes_spares_only_and_they_end_within_a_minute(
    docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> None:
    """A job with the default configuration leaves a spare that ends by itself after 60 s
    unclaimed; ``prune --spares`` removes it at once, and never another state directory's."""
    del sandbox_image
    repo = init(tmp_path / "r", {"a.txt": "a\n"}).path
    homes = [tmp_path / "home-a", tmp_path / "home-b"]
    calls = {"turns": [[{"id": "c1", "name": "list_files", "arguments": {}}]], "final": "done"}
    try:
        for home in homes:
            args = job_files(home / "files", {"prompt": "p"}, calls, "")
            for _attempt in range(3):  # an earlier version's reaper may take one starting
                run = _patchbox_home("run", "--repo", str(repo), *args, "--json", home=home)
                assert json.loads(run.stdout)["job_id"], run.stderr
                if found := _spares_soon(docker_client, home):
                    break
            assert len(found) == 1, (home.name, run.stderr)
            environment = docker_client.containers.get(found[0]).attrs["Config"]["Env"]
            assert "PATCHBOX_IDLE_EXIT=60" in environment
        pruned = _patchbox_home("prune", "--spares", "--json", home=homes[0])
        assert pruned.returncode == 0, pruned.stderr
        data = json.loads(pruned.stdout)
        assert data["removed"] == []
        assert len(data["spares"]) == 1
        assert _spares_of(docker_client, homes[0]) == []
        assert len(_spares_of(docker_client, homes[1])) == 1
        text = _patchbox_home("prune", "--spares", home=homes[1])
        assert text.stdout.startswith("removed 1 spare sandbox(es): "), text.stdout
        assert _spares_of(docker_client, homes[1]) == []
        again = json.loads(_patchbox_home("prune", "--spares", "--json", home=homes[1]).stdout)
        assert again == {"removed": [], "spares": []}
        bare = _patchbox_home("prune", "--json", home=homes[1])
        assert bare.returncode == 2
        assert "--spares" in json.loads(bare.stdout)["error"]["message"]
    finally:
        for home in homes:
            for cid in _spares_of(docker_client, home):
                docker_client.api.remove_container(cid, force=True)


def _patchbox_home(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    return _patchbox(*args, env={"PATCHBOX_HOME": str(home)})


def test_doctor_is_not_ready_when_the_configured_runtime_does_not_work(
    sandbox_image: str, runsc_available: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``runtime = "runsc"`` where gVisor does not start a container: every job would fail,
    so doctor says so (exit 3); where it works, nothing is said."""
    from controller.cli import doctor

    del sandbox_image
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "PATCHBOX_MODEL", "PATCHBOX_PROVIDER_API"):
        monkeypatch.delenv(name, raising=False)
    config = tmp_path / "config.toml"
    config.write_text('runtime = "runsc"\n')
    if runsc_available:
        assert not [p for p in doctor.diagnose(config_path=config).problems if "runsc" in p]
    monkeypatch.setattr(doctor, "runsc_works", lambda *_a: (False, "probe failed"))
    report = doctor.diagnose(config_path=config)
    wanted = "is not registered" if not runsc_available else "does not start a container"
    assert f"the configuration's runtime is runsc, which {wanted} here" in report.problems
    assert (report.ready, report.exit_code) == (False, 3)
