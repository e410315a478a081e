"""A service job ends as any job, over real HTTP: a model that changes nothing ends the job
``no_change`` with ``NO_CHANGE``; a required check that cannot run on the baseline fails
it ``CHECK_CANNOT_RUN`` with its remedy, before the model's first turn."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import docker
import pytest

from tests.support.jobs import containers_of, make_repo
from tests.support.service import TASK, serving, wait_status, write_config

pytestmark = pytest.mark.docker

ENDED = {"failed", "awaiting_review", "cancelled", "no_change"}
NOTHING: dict[str, Any] = {
    "turns": [[{"id": "c1", "name": "read_file", "arguments": {"path": "app.py"}}]],
    "final": "nothing to change",
}
"""A model that reads and changes nothing."""


def _submit(client: Any, repo: Path, task: dict[str, Any]) -> str:
    answer = client.post("/v1/jobs", json={"repo": str(repo), "task": task, "calls": NOTHING})
    assert answer.status_code == 202, answer.text
    return str(answer.json()["job_id"])


@pytest.mark.usefixtures("sandbox_image")
def test_no_change_and_a_check_that_cannot_run_end_a_service_job_with_their_codes(
    tmp_path: Path, docker_client: docker.DockerClient
) -> None:
    missing = {"argv": ["sh", "-c", "patchbox-no-such-command"], "timeout_seconds": 30}
    unchanged = make_repo(tmp_path / "alpha" / "unchanged")
    cannot = make_repo(tmp_path / "alpha" / "cannot")
    with serving(write_config(tmp_path, workers=2)) as running:
        alpha = running.client("alpha")
        first = _submit(alpha, unchanged, TASK)
        second = _submit(alpha, cannot, TASK | {"checks": {"tests": missing}})
        nothing = wait_status(alpha, first, ENDED, 300)
        failed = wait_status(alpha, second, ENDED, 300)
    assert nothing["status"] == "no_change", nothing["error"]
    assert nothing["error"]["code"] == "NO_CHANGE"
    assert nothing["files"] == []
    assert failed["status"] == "failed"
    assert failed["error"]["code"] == "CHECK_CANNOT_RUN"
    assert failed["error"]["hint"]["action"] == "use_environment"
    assert failed["tool_calls"] == []
    for job_id in (first, second):
        assert containers_of(docker_client, job_id) == []
