"""The Python API (controller.api) on real repositories and the real daemon: a session the
caller drives tool by tool, its proposal decided as any job's, apply and revert through the
same calls the CLI makes, idempotent request ids, refusals, and nothing left running. The
example of docs/api.md runs as written."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import docker
import pytest

from controller import api
from controller.api.session import SESSION_PROMPT
from controller.config.host import HostConfig
from controller.config.task import TaskSpec
from controller.errors import ErrorCode, PatchboxError, UsageError
from controller.jobs.store import JobStore, write_lock
from tests.support.jobs import APP, APP_AFTER, GREET, containers_of, make_repo
from tests.support.paths import REPO_ROOT

ROOT = REPO_ROOT
TASK = TaskSpec.model_validate(
    {
        "prompt": "Capitalize the greeting.",
        "checks": {"greet": GREET},
        "limits": {"memory_mb": 512, "workspace_mb": 64, "tmp_mb": 32, "wall_seconds": 300},
    }
)
CONFIG = HostConfig(spare_sandboxes=0)
EDIT = {"path": "app.py", "oldText": '"hello "', "newText": '"Hello "'}


def test_a_session_proposes_and_the_job_is_applied_and_reverted(
    docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> None:
    del sandbox_image
    repo = make_repo(tmp_path / "repo")
    with api.open_session(repo, task=TASK, config=CONFIG, client=docker_client) as session:
        assert session.active
        assert containers_of(docker_client, session.job_id)
        read = session.call("read_file", {"path": "app.py"})
        assert read.ok
        assert read.result is not None
        assert '"hello "' in read.result["content"]
        missing = session.call("read_file", {"path": "nope.py"})
        assert (missing.ok, missing.code) == (False, "TOOL_FILE_NOT_FOUND")
        assert missing.error is not None
        assert missing.error["message"] == "nope.py: no such file"
        bad = session.call("replace_text", {"path": "app.py"})
        assert (bad.ok, bad.code) == (False, "TOOL_ARGUMENTS_INVALID")
        assert session.call("replace_text", EDIT, request_id="r1").ok
        again = session.call("replace_text", EDIT, request_id="r1")
        assert again.ok  # the first result, not a second edit (which would not match)
        assert not session.call("replace_text", EDIT, request_id="r2").ok
        check = session.call("run_check", {"checkId": "greet"})
        assert check.result is not None
        assert check.result["status"] == "passed"
        proposal = session.propose("capitalized")
    assert proposal.status == "awaiting_review"
    assert [f.path for f in proposal.view.files] == ["app.py"]
    assert [c.status for c in proposal.view.checks] == ["passed"]
    assert '+    return "Hello " + name' in proposal.diff
    ledger = [e.id for e in JobStore().load(proposal.job_id).ledger if e.tool == "replace_text"]
    assert len(ledger) == 3  # r1 once, r2 (refused) and the missing-arguments one are not effects
    assert not containers_of(docker_client, proposal.job_id)
    assert (repo / "app.py").read_text() == APP
    record, applied = api.apply_job(proposal.job_id, config=CONFIG)
    assert applied is not None
    assert (record.state, [f.path for f in applied.files]) == ("applied", ["app.py"])
    assert (repo / "app.py").read_text() == APP_AFTER
    record, unchanged = api.apply_job(proposal.job_id, config=CONFIG)  # applied: as it is
    assert (record.state, unchanged) == ("applied", None)
    assert (repo / "app.py").read_text() == APP_AFTER
    record, _ = api.revert_job(proposal.job_id)
    assert record.state == "reverted"
    assert (repo / "app.py").read_text() == APP
    with pytest.raises(UsageError, match="only an applied job is reverted"):
        api.revert_job(proposal.job_id)
    record, applied = api.apply_job(proposal.job_id, config=CONFIG)  # a reverted job, again
    assert applied is not None
    assert (record.state, [f.path for f in applied.files]) == ("applied", ["app.py"])
    assert (repo / "app.py").read_text() == APP_AFTER
    assert [s for s, _ in JobStore().load(proposal.job_id).history][-3:] == [
        "applied",
        "reverted",
        "applied",
    ]


def test_propose_before_any_call_is_refused_and_close_cancels(
    docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> None:
    del sandbox_image
    repo = make_repo(tmp_path / "repo")
    session = api.open_session(repo, task=TASK, config=CONFIG, client=docker_client)
    try:
        with pytest.raises(UsageError, match="nothing to propose"):
            session.propose()
        assert session.active
        assert session.call("list_files", {}).ok
    finally:
        session.close()
    assert not session.active
    assert session.record.state == "cancelled"
    assert not containers_of(docker_client, session.job_id)
    with pytest.raises(UsageError, match="has ended"):
        session.call("list_files", {})
    assert api.discard_job(session.job_id).state == "discarded"


def test_an_idle_session_proposes_its_change_and_releases_the_sandbox_and_the_lock(
    docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> None:
    del sandbox_image
    repo = make_repo(tmp_path / "repo")
    with api.open_session(
        repo, task=TASK, config=CONFIG, client=docker_client, idle_seconds=1
    ) as session:
        assert session.call("replace_text", EDIT).ok
        deadline = time.monotonic() + 60
        while session.active and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not session.active
        idle = session.idle_end
        assert idle is not None
        assert (idle.seconds, idle.changed) == (1, True)
        assert idle.proposal is not None
        assert idle.proposal.status == "awaiting_review"
        assert '+    return "Hello " + name' in idle.proposal.diff
        assert not containers_of(docker_client, session.job_id)
        with write_lock(str(repo.resolve())):
            pass  # released
        with pytest.raises(UsageError, match="has ended"):
            session.call("list_files", {})
        assert session.propose("late").job_id == session.job_id
    assert JobStore().load(session.job_id).state == "awaiting_review"


def test_an_idle_session_without_a_change_is_cancelled(
    docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> None:
    del sandbox_image
    repo = make_repo(tmp_path / "repo")
    with api.open_session(
        repo, task=TASK, config=CONFIG, client=docker_client, idle_seconds=1
    ) as session:
        assert session.call("read_file", {"path": "app.py"}).ok
        time.sleep(0.6)
        assert session.call("list_files", {}).ok  # a call restarts the idle time
        time.sleep(0.6)
        assert session.active
        deadline = time.monotonic() + 30
        while session.active and time.monotonic() < deadline:
            time.sleep(0.1)
        assert session.idle_end is not None
        assert session.idle_end.changed is False
        assert not containers_of(docker_client, session.job_id)
    assert JobStore().load(session.job_id).state == "cancelled"


def test_a_session_without_a_task_uses_the_configured_checks(
    docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> None:
    del sandbox_image
    repo = make_repo(tmp_path / "repo")
    config = HostConfig.model_validate({"spare_sandboxes": 0, "checks": {"greet": GREET}})
    with api.open_session(repo, config=config, client=docker_client) as session:
        assert session.record.task["prompt"] == SESSION_PROMPT
        session.call("replace_text", EDIT)
        proposal = session.propose()
    assert [(c.id, c.status) for c in proposal.view.checks] == [("greet", "passed")]


def test_opening_on_a_folder_that_is_not_a_repository_fails_with_nothing_left(
    docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> None:
    del sandbox_image
    (tmp_path / "plain").mkdir()
    before = {c.id for c in docker_client.containers.list(all=True)}
    jobs = {r.job_id for r in JobStore().all()}
    with pytest.raises(PatchboxError) as info:
        api.open_session(tmp_path / "plain", task=TASK, config=CONFIG, client=docker_client)
    assert info.value.code is ErrorCode.NOT_A_REPOSITORY
    assert {c.id for c in docker_client.containers.list(all=True)} <= before
    assert {r.job_id for r in JobStore().all()} == jobs  # a refusal leaves no job record


def test_a_second_session_on_a_locked_repository_names_the_holder_and_leaves_no_record(
    docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> None:
    del sandbox_image
    repo = make_repo(tmp_path / "repo")
    with api.open_session(repo, task=TASK, config=CONFIG, client=docker_client) as first:
        jobs = {r.job_id for r in JobStore().all()}
        with pytest.raises(PatchboxError) as info:
            api.open_session(repo, task=TASK, config=CONFIG, client=docker_client)
        assert info.value.code is ErrorCode.JOB_ALREADY_RUNNING
        assert first.job_id in info.value.message
        assert {r.job_id for r in JobStore().all()} == jobs
        assert first.call("read_file", {"path": "app.py"}).ok  # the holder goes on


def test_the_documented_example_runs(
    docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> None:
    del docker_client, sandbox_image
    doc = (ROOT / "docs" / "api.md").read_text()
    found = re.search(r"<!-- api-example -->\n```python\n(.*?)```", doc, re.DOTALL)
    assert found is not None
    script = tmp_path / "example.py"
    script.write_text(found.group(1))
    repo = make_repo(tmp_path / "repo")
    proc = subprocess.run(
        [sys.executable, str(script), str(repo)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'sandbox-image'}"},
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "awaiting_review" in proc.stdout
    assert (repo / "app.py").read_text() == APP_AFTER
