"""Iterating on a service job over real HTTP. ``POST /v1/jobs/{job_id}/rebase``: a tenant's
job awaiting review carried onto its repository after a commit, as a new queued job with its
``parent``; the old job is then stale and its apply refused (``JOB_REBASED``, the remedy in
the API's words); another tenant cannot rebase it; a job that is not awaiting review is
refused. ``POST /v1/jobs`` with ``from``: a follow-up on the earlier job's result, applied
with it in one apply."""

from __future__ import annotations

from pathlib import Path

import docker
import pytest

from tests.support.git import Repo, git_env
from tests.support.jobs import APP_AFTER, FILES, make_repo
from tests.support.service import CALLS, END, serving, wait_status, write_config
from tests.support.service_http import submit


@pytest.mark.docker
def test_a_tenant_rebases_its_job_and_the_old_one_is_refused_at_apply(
    docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> None:
    del docker_client, sandbox_image
    config = write_config(tmp_path)
    path = make_repo(tmp_path / "alpha" / "greet")
    repo = Repo(path, git_env())
    with serving(config) as running:
        alpha, beta = running.client("alpha"), running.client("beta")
        first = submit(alpha, path, calls=CALLS).json()["job_id"]
        assert wait_status(alpha, first, END)["status"] == "awaiting_review"
        repo.write("notes.txt", "moved on\n")
        repo.commit("upstream")

        other = beta.post(f"/v1/jobs/{first}/rebase")
        assert other.status_code == 404
        assert other.json()["error"]["code"] == "NOT_FOUND"

        accepted = alpha.post(f"/v1/jobs/{first}/rebase")
        assert accepted.status_code == 202, accepted.text
        body = accepted.json()
        second = body["job_id"]
        assert (body["parent"], second != first) == (first, True)
        view = wait_status(alpha, second, END)
        assert view["status"] == "awaiting_review", view["error"]
        assert view["parent"]["job_id"] == first
        assert view["tool_calls"] == []
        assert [c["status"] for c in view["checks"]] == ["passed"]
        old = alpha.get(f"/v1/jobs/{first}").json()
        assert old["stale"]["by"] == second

        refused = alpha.post(f"/v1/jobs/{first}/apply")
        assert refused.status_code == 409
        error = refused.json()["error"]
        assert error["code"] == "JOB_REBASED"
        assert f"POST /v1/jobs/{second}/apply" in error["hint"]["text"]
        again = alpha.post(f"/v1/jobs/{first}/rebase")
        assert (again.status_code, again.json()["error"]["code"]) == (409, "JOB_REBASED")

        applied = alpha.post(f"/v1/jobs/{second}/apply")
        assert applied.status_code == 200, applied.text
        assert (path / "app.py").read_text() == APP_AFTER
        assert (path / "notes.txt").read_text() == "moved on\n"
        done = alpha.post(f"/v1/jobs/{second}/rebase")  # applied: not awaiting review
        assert (done.status_code, done.json()["error"]["code"]) == (409, "USAGE_ERROR")


NOTES = {
    "id": "c1",
    "name": "replace_text",
    "arguments": {"path": "notes.txt", "oldText": "old notes", "newText": "new notes"},
}


@pytest.mark.docker
def test_a_tenant_follows_up_its_job_and_applies_the_two_at_once(
    docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> None:
    del docker_client, sandbox_image
    config = write_config(tmp_path)
    path = make_repo(tmp_path / "alpha" / "greet")
    with serving(config) as running:
        alpha, beta = running.client("alpha"), running.client("beta")
        first = submit(alpha, path, calls=CALLS).json()["job_id"]
        assert wait_status(alpha, first, END)["status"] == "awaiting_review"
        follow = {"from": first, "task": {"prompt": "Also the notes."}}
        calls = {"turns": [[NOTES]], "final": "notes"}

        other = beta.post("/v1/jobs", json={**follow, "calls": calls})
        assert (other.status_code, other.json()["error"]["code"]) == (404, "NOT_FOUND")
        both = alpha.post("/v1/jobs", json={**follow, "repo": str(path)})
        assert (both.status_code, both.json()["error"]["code"]) == (400, "BAD_REQUEST")

        accepted = alpha.post("/v1/jobs", json={**follow, "calls": calls})
        assert accepted.status_code == 202, accepted.text
        second = accepted.json()["job_id"]
        assert accepted.json()["parent"] == first
        view = wait_status(alpha, second, END)
        assert view["status"] == "awaiting_review", view["error"]
        assert view["parent"]["relation"] == "follow-up"
        assert [f["path"] for f in view["files"]] == ["notes.txt"]
        assert "app.py" not in view["diff"]

        applied = alpha.post(f"/v1/jobs/{second}/apply")
        assert applied.status_code == 200, applied.text
        assert (path / "app.py").read_text() == APP_AFTER
        assert (path / "notes.txt").read_text() == "new notes\n"
        old = alpha.get(f"/v1/jobs/{first}").json()
        assert (old["stale"]["by"], old["stale"]["reason"]) == (second, "followed_up")
        refused = alpha.post(f"/v1/jobs/{first}/apply")
        assert (refused.status_code, refused.json()["error"]["code"]) == (409, "JOB_SUPERSEDED")
        reverted = alpha.post(f"/v1/jobs/{second}/revert")
        assert reverted.status_code == 200, reverted.text
        assert (path / "notes.txt").read_text() == FILES["notes.txt"]
