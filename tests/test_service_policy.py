"""What a tenant of ``patchbox serve`` may ask for, attacked over real HTTP: a tenant's task
is untrusted input, checked against its tenant's policy (environments, limits, checks,
modes) before anything is queued or built, and again when its job starts; ``auto`` never
applies for a tenant without ``allow_apply``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import docker
import pytest

from controller.jobs.records import JobStore
from tests.support.jobs import APP, APP_AFTER, make_repo, snapshot
from tests.support.service import CALLS, TASK, events, serving, wait_status, write_config

END = {"awaiting_review", "applied", "failed", "cancelled"}


def error_of(response: Any) -> tuple[int, str, str]:
    body = response.json()
    assert set(body) == {"error"}, body
    return response.status_code, body["error"]["code"], body["error"]["message"]


def submit(client: Any, repo: Path, task: dict[str, Any]) -> Any:
    return client.post("/v1/jobs", json={"repo": str(repo), "task": task, "calls": CALLS})


# -- auto mode and allow_apply -------------------------------------------------------------


@pytest.mark.timeout(600)
def test_auto_never_applies_for_a_tenant_without_allow_apply(
    tmp_path: Path, client: docker.DockerClient, runtime: str
) -> None:
    del client
    config = write_config(tmp_path, host=f'allow_auto = true\nruntime = "{runtime}"')
    auto = TASK | {"mode": "auto"}
    beta_repo = make_repo(tmp_path / "beta" / "greet")
    alpha_repo = make_repo(tmp_path / "alpha" / "greet")
    before = snapshot(beta_repo)
    with serving(config) as running:
        beta, alpha = running.client("beta"), running.client("alpha")
        accepted = submit(beta, beta_repo, auto)
        assert accepted.status_code == 202, accepted.text
        job_id = accepted.json()["job_id"]
        view = wait_status(beta, job_id, END)
        assert view["status"] == "awaiting_review", view["error"]
        assert [c["status"] for c in view["checks"]] == ["passed"]
        decision = view["decision"]
        assert decision["applied"] is False
        assert decision["gates"]["apply_permitted"] is False
        assert {name for name, ok in decision["gates"].items() if not ok} == {"apply_permitted"}
        assert decision["reason"] == (
            "auto fell back to review: apply_permitted "
            "(tenant 'beta' may not apply jobs (allow_apply = false))"
        )
        assert JobStore().load(job_id).state == "awaiting_review"
        states = [e["data"]["state"] for e in events(beta, job_id) if e["type"] == "state"]
        assert "applied" not in states
        assert snapshot(beta_repo) == before
        assert (beta_repo / "app.py").read_text() == APP
        # the same task for a tenant with allow_apply applies: the gate is the tenant's
        allowed = submit(alpha, alpha_repo, auto)
        assert allowed.status_code == 202, allowed.text
        applied = wait_status(alpha, allowed.json()["job_id"], END)
        assert applied["status"] == "applied", applied["error"]
        assert applied["decision"]["reason"] == "auto: every gate holds"
        assert (alpha_repo / "app.py").read_text() == APP_AFTER
