"""``patchbox serve``: the HTTP service over real HTTP (uvicorn in a thread, httpx):
authentication, tenant isolation, repository roots, quotas, the fair queue, restarts, a
whole job with its event stream, apply and revert, cancel, shutdown, metrics, OpenAPI."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import docker
import pytest

from controller.jobs.store import JobStore
from tests.support.jobs import APP, APP_AFTER, containers_of, make_repo
from tests.support.service import (
    CALLS,
    SLOW_CALLS,
    events,
    serving,
    slow_task,
    wait_status,
    write_config,
)
from tests.support.service_http import JOB_ACTIONS, JOB_PATHS, error_of, submit

SLOW_TASK = slow_task(30)


# -- with Docker: whole jobs ---------------------------------------------------------------


@pytest.fixture
def live(tmp_path: Path, client: docker.DockerClient) -> Any:
    del client
    with serving(write_config(tmp_path, workers=2)) as running:
        yield running


def test_a_whole_job_streams_its_events_and_applies_and_reverts(live: Any, tmp_path: Path) -> None:
    alpha = live.client("alpha")
    repo = make_repo(tmp_path / "alpha" / "greet")
    check = {"id": "c2", "name": "run_check", "arguments": {"checkId": "greet"}}
    accepted = submit(alpha, repo, calls={**CALLS, "turns": [*CALLS["turns"], [check]]})
    assert accepted.status_code == 202, accepted.text
    job_id = accepted.json()["job_id"]
    stream = events(alpha, job_id)
    ids = [e["id"] for e in stream]
    assert ids == list(range(1, len(ids) + 1))
    seen = [
        (e["type"], e["data"].get("state") or e["data"].get("name") or e["data"]["id"])
        for e in stream
    ]
    assert seen == [
        ("state", "queued"),
        ("state", "preparing"),
        ("state", "running"),
        ("tool_call", "replace_text"),
        ("tool_call", "run_check"),
        ("state", "validating"),
        ("state", "checking"),
        ("check", "greet"),
        ("state", "awaiting_review"),
    ]
    assert stream[3]["data"] == {
        "turn": 1,
        "id": "c1",
        "name": "replace_text",
        "ok": True,
        "error_code": None,
    }
    assert "verdict" not in stream[3]["data"]
    assert stream[4]["data"]["verdict"] == "greet: passed"  # the check's own outcome
    assert stream[7]["data"]["status"] == "passed"
    assert events(alpha, job_id, last=4) == stream[4:]
    view = alpha.get(f"/v1/jobs/{job_id}").json()
    assert view["status"] == "awaiting_review"
    beta = live.client("beta")
    for path in JOB_PATHS:
        assert error_of(beta.get(f"/v1/jobs/{job_id}{path}")) == "NOT_FOUND", path
    for path in JOB_ACTIONS:
        assert error_of(beta.post(f"/v1/jobs/{job_id}{path}")) == "NOT_FOUND", path
    assert view["job_id"] == job_id
    assert set(view) >= {"diff", "files", "checks", "tool_calls", "evidence", "decision"}
    assert JobStore().load(job_id).state == "awaiting_review"  # the engine's own record
    diff = alpha.get(f"/v1/jobs/{job_id}/diff")
    assert diff.headers["content-type"].startswith("text/x-diff")
    assert '+    return "Hello " + name' in diff.text
    assert diff.text == view["diff"]
    evidence = alpha.get(f"/v1/jobs/{job_id}/evidence").json()
    assert str(repo) not in json.dumps(evidence)
    assert evidence
    (repo / "app.py").write_text("# the user's own line\n" + APP)
    refused = alpha.post(f"/v1/jobs/{job_id}/apply")
    assert refused.status_code == 409, refused.text
    error = refused.json()["error"]
    assert error["code"] == "APPLY_CONFLICT"
    assert "--merge" not in error["message"]
    assert error["hint"] == {  # the remedy in the API's words: this service does not merge
        "option": "merge",
        "job_id": job_id,
        "text": f"POST /v1/jobs/{job_id}/apply does not merge: take the diff "
        f"(GET /v1/jobs/{job_id}/diff) and merge it where the work tree is",
    }
    (repo / "app.py").write_text(APP)
    applied = alpha.post(f"/v1/jobs/{job_id}/apply")
    assert applied.status_code == 200, applied.text
    assert applied.json()["status"] == "applied"
    assert (repo / "app.py").read_text() == APP_AFTER
    _apply_twice_revert_and_apply_again(alpha, job_id, repo)
    assert (repo / "app.py").read_text() == APP
    later = events(alpha, job_id, last=len(stream))
    assert [e["data"]["state"] for e in later] == ["applied", "reverted", "applied", "reverted"]
    metrics = live.client(None).get("/metrics").text
    assert 'patchbox_service_jobs{state="reverted"} 1' in metrics


def _apply_twice_revert_and_apply_again(alpha: Any, job_id: str, repo: Path) -> None:
    """An applied job applied again (said so, no change), reverted, applied again, reverted."""
    again = alpha.post(f"/v1/jobs/{job_id}/apply")  # applied already: said so, no change
    assert again.status_code == 200, again.text
    assert (again.json()["status"], again.json()["already_applied"]) == ("applied", True)
    assert again.json()["files"] == []
    assert (repo / "app.py").read_text() == APP_AFTER
    reverted = alpha.post(f"/v1/jobs/{job_id}/revert")
    assert reverted.json()["status"] == "reverted"
    assert (repo / "app.py").read_text() == APP
    reapplied = alpha.post(f"/v1/jobs/{job_id}/apply")  # a reverted job, applied again
    assert reapplied.status_code == 200, reapplied.text
    assert (reapplied.json()["status"], reapplied.json()["already_applied"]) == ("applied", False)
    assert (repo / "app.py").read_text() == APP_AFTER
    assert alpha.post(f"/v1/jobs/{job_id}/revert").json()["status"] == "reverted"


def test_cancel_ends_a_job_holding_a_long_check(
    live: Any, tmp_path: Path, client: docker.DockerClient
) -> None:
    alpha = live.client("alpha")
    repo = make_repo(tmp_path / "alpha" / "slow")
    job_id = submit(alpha, repo, task=SLOW_TASK, calls=SLOW_CALLS).json()["job_id"]
    assert wait_status(alpha, job_id, {"running"}, timeout=120)["status"] == "running"
    time.sleep(1.5)
    started = time.monotonic()
    response = alpha.post(f"/v1/jobs/{job_id}/cancel")
    assert response.status_code == 202
    assert response.json()["status"] == "cancelling"
    stream = events(alpha, job_id)  # ends once the worker is done with the job
    assert stream[-1]["data"] == {"state": "cancelled"}
    assert time.monotonic() - started < 25
    assert containers_of(client, job_id) == []
    view = alpha.get(f"/v1/jobs/{job_id}").json()
    assert view["status"] == "cancelled"
    assert view["error"]["code"] == "CANCELLED"
    # the tenant's cancel, not what the stopped check's channel said when it closed
    assert view["error"]["message"] == "cancelled by the user (a cancel request)"
    listed = alpha.get("/v1/jobs").json()["jobs"]
    assert [j["status"] for j in listed if j["job_id"] == job_id] == ["cancelled"]


def test_shutdown_cancels_running_jobs_and_leaves_no_container(
    tmp_path: Path, client: docker.DockerClient
) -> None:
    with serving(write_config(tmp_path, workers=1)) as running:
        alpha = running.client("alpha")
        repo = make_repo(tmp_path / "alpha" / "slow")
        job_id = submit(alpha, repo, task=SLOW_TASK, calls=SLOW_CALLS).json()["job_id"]
        assert wait_status(alpha, job_id, {"running"}, timeout=120)["status"] == "running"
        time.sleep(1.5)
        started = time.monotonic()
    assert time.monotonic() - started < 25
    record = JobStore().load(job_id)
    assert record.state == "cancelled"
    assert record.error is not None
    assert record.error.message == "cancelled: the service is stopping"
    assert containers_of(client, job_id) == []


def test_jobs_queued_before_a_restart_run_after_it(
    tmp_path: Path, client: docker.DockerClient
) -> None:
    del client
    repo = make_repo(tmp_path / "alpha" / "greet")
    with serving(write_config(tmp_path, workers=0)) as running:
        job_id = submit(running.client("alpha"), repo, calls=CALLS).json()["job_id"]
    with serving(write_config(tmp_path, workers=2)) as running:
        alpha = running.client("alpha")
        view = wait_status(alpha, job_id, {"awaiting_review", "failed", "cancelled"})
        assert view["status"] == "awaiting_review", view["error"]
        states = [e["data"]["state"] for e in events(alpha, job_id) if e["type"] == "state"]
        assert states[0] == "queued"
        assert states[-1] == "awaiting_review"
