"""A session (what the MCP server drives) ends as any job: no change is ``no_change`` with
``NO_CHANGE`` in its proposal; a required check that cannot run on the baseline ends the job
``CHECK_CANNOT_RUN`` before the caller's first call is answered, the remedy with it."""

from __future__ import annotations

from pathlib import Path

import docker
import pytest

from controller import api
from controller.config.host import HostConfig
from controller.config.task import TaskSpec
from controller.errors import ErrorCode, PatchboxError
from controller.jobs.store import JobStore
from tests.support.jobs import GREET, containers_of, make_repo

pytestmark = pytest.mark.docker

LIMITS = {"memory_mb": 512, "workspace_mb": 64, "tmp_mb": 32, "wall_seconds": 300}
CONFIG = HostConfig(spare_sandboxes=0)


def test_a_session_that_changes_nothing_proposes_no_change(
    docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> None:
    del sandbox_image
    repo = make_repo(tmp_path / "repo")
    task = TaskSpec.model_validate(
        {"prompt": "Look.", "checks": {"greet": GREET}, "limits": LIMITS}
    )
    with api.open_session(repo, task=task, config=CONFIG, client=docker_client) as session:
        assert session.call("read_file", {"path": "app.py"}).ok
        proposal = session.propose("nothing to change")
    assert proposal.status == "no_change"
    assert proposal.error is not None
    assert proposal.error.code == "NO_CHANGE"
    assert [c.status for c in proposal.view.baseline_checks] == ["failed"]
    assert not containers_of(docker_client, proposal.job_id)


def test_a_session_whose_check_cannot_run_ends_before_its_first_call(
    docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> None:
    del sandbox_image
    repo = make_repo(tmp_path / "repo")
    missing = {"argv": ["sh", "-c", "patchbox-no-such-command"], "timeout_seconds": 30}
    task = TaskSpec.model_validate(
        {"prompt": "Fix it.", "checks": {"tests": missing}, "limits": LIMITS}
    )
    with pytest.raises(PatchboxError) as info:
        _first_call(repo, task, docker_client)
    assert info.value.code is ErrorCode.CHECK_CANNOT_RUN
    assert info.value.hint is not None
    assert info.value.hint.action == "use_environment"
    [record] = JobStore().all(str(repo.resolve()))
    assert (record.state, record.error.code if record.error else None) == (
        "failed",
        "CHECK_CANNOT_RUN",
    )
    assert record.transcript == []
    assert record.tool_calls == []
    assert not containers_of(docker_client, record.job_id)


def _first_call(repo: Path, task: TaskSpec, client: docker.DockerClient) -> None:
    """Opens a session and makes its first call (either raises the job's error)."""
    with api.open_session(repo, task=task, config=CONFIG, client=client) as session:
        session.call("read_file", {"path": "app.py"})
