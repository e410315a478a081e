"""No traceback ever reaches a user: a fault injected at each stage of a job (and in the CLI
around it) gives the error contract (``INTERNAL_ERROR``, exit 70), a crash report under
``$PATCHBOX_HOME`` with the traceback and no secret, the job ``failed``, and no container."""

from __future__ import annotations

import json
from pathlib import Path

import docker
import pytest

from controller.cli import main as cli
from controller.jobs.store import JobStore
from controller.sandbox.labels import JOB
from tests.support.cli import job_files
from tests.support.faults import SECRET, boom, crash_report, crash_reports, engine_gone
from tests.support.jobs import EDIT, GREET, call, check_call, make_repo

STAGES = {
    "preparing": "controller.jobs.engine.prepare",
    "running": "controller.jobs.engine.ToolExecutor.execute",
    "collecting": "controller.jobs.engine.collect",
    "validating": "controller.jobs.diffstage.validate_changeset",
    "checking": "controller.jobs.engine.run_required_checks",
    "deciding": "controller.jobs.engine.Job._decide",
}


@pytest.fixture
def job_args(tmp_path: Path) -> list[str]:
    repo = make_repo(tmp_path / "greet")
    task = {
        "prompt": "Capitalize the greeting.",
        "checks": {"greet": GREET},
        "limits": {"memory_mb": 512, "workspace_mb": 64, "tmp_mb": 32, "wall_seconds": 120},
    }
    calls = {"turns": [[call("c1", EDIT)], [check_call("c2", "greet")]], "final": "done"}
    return ["run", "--repo", str(repo), *job_files(tmp_path, task, calls), "--json"]


@pytest.mark.docker
@pytest.mark.usefixtures("sandbox_image")
@pytest.mark.parametrize("stage", list(STAGES))
def test_a_fault_at_each_stage_gives_internal_error(
    stage: str,
    job_args: list[str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    docker_client: docker.DockerClient,
) -> None:
    monkeypatch.setenv("PATCHBOX_TEST_API_KEY", SECRET)
    monkeypatch.setattr(STAGES[stage], boom)
    code = cli.main(job_args)
    out, err = capsys.readouterr()
    assert code == 70, err
    data = json.loads(out)
    assert data["status"] == "failed"
    assert data["error"]["code"] == "INTERNAL_ERROR"
    assert "BoomError" in data["error"]["message"]
    assert "Traceback" not in out + err
    assert SECRET not in out + err
    report = crash_report(data["error"]["message"])
    assert "Traceback" in report
    assert "BoomError: injected fault" in report
    assert SECRET not in report
    record = JobStore().load(data["job_id"])
    assert record.state == "failed"
    assert record.error is not None
    assert record.error.code == "INTERNAL_ERROR"
    found = docker_client.containers.list(all=True, filters={"label": f"{JOB}={data['job_id']}"})
    assert found == []


@pytest.mark.docker
@pytest.mark.usefixtures("sandbox_image")
def test_an_engine_error_nobody_translated_fails_the_job_with_sandbox_failed(
    job_args: list[str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    docker_client: docker.DockerClient,
) -> None:
    """The Docker engine gone under a running job: the job ``failed`` with
    ``SANDBOX_FAILED`` (exit 1), no crash report (it is not a bug), no container."""
    monkeypatch.setattr(STAGES["running"], engine_gone)
    before = crash_reports()
    code = cli.main(job_args)
    out, err = capsys.readouterr()
    assert code == 1, err
    data = json.loads(out)
    assert (data["status"], data["error"]["code"]) == ("failed", "SANDBOX_FAILED")
    assert data["error"]["message"].endswith(": ConnectionError")
    assert "Traceback" not in out + err
    assert crash_reports() == before
    assert JobStore().load(data["job_id"]).state == "failed"
    found = docker_client.containers.list(all=True, filters={"label": f"{JOB}={data['job_id']}"})
    assert found == []


@pytest.mark.docker
@pytest.mark.usefixtures("sandbox_image")
def test_a_fault_while_writing_the_evidence_gives_internal_error(
    job_args: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("controller.jobs.engine.write_evidence", boom)
    assert cli.main(job_args) == 70
    data = json.loads(capsys.readouterr().out)
    assert data["error"]["code"] == "INTERNAL_ERROR"
    assert "BoomError" in crash_report(data["error"]["message"])
