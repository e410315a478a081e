"""The service on PostgreSQL (``state = "postgres"``), over real HTTP: a tenant's job runs to
its end with its events streamed from the database, and a service started again on the same
database (a new process's store) serves the same job, its events resumed after a
``Last-Event-ID``, and counts the tenant's quota from what the database holds."""

from __future__ import annotations

from pathlib import Path

import docker
import pytest

from tests.support.jobs import make_repo
from tests.support.postgres import Cluster
from tests.support.service import CALLS, END, events, serving, wait_status, write_config
from tests.support.service_http import error_of, submit


@pytest.mark.docker
def test_a_service_on_postgres_runs_jobs_and_a_new_process_serves_them(
    docker_client: docker.DockerClient,
    sandbox_image: str,
    tmp_path: Path,
    postgres_cluster: Cluster,
) -> None:
    del docker_client, sandbox_image
    dsn = postgres_cluster.database()
    config = write_config(tmp_path, postgres=dsn, max_queued_jobs=2)
    path = make_repo(tmp_path / "alpha" / "greet")
    with serving(config) as running:
        alpha = running.client("alpha")
        job = submit(alpha, path, calls=CALLS).json()["job_id"]
        assert wait_status(alpha, job, END)["status"] == "awaiting_review"
        streamed = events(alpha, job)
    states = [e["data"]["state"] for e in streamed if e["type"] == "state"]
    assert states[0] == "queued"
    assert states[-1] == "awaiting_review"
    assert not (tmp_path / "service.db").exists()  # nothing went to a SQLite file

    idle = write_config(tmp_path / "again", postgres=dsn, workers=0, max_queued_jobs=2)
    with serving(idle) as again:
        alpha = again.client("alpha")
        view = alpha.get(f"/v1/jobs/{job}").json()
        assert (view["status"], view["job_id"]) == ("awaiting_review", job)
        resumed = events(alpha, job, last=1)
        assert [e["id"] for e in resumed] == [e["id"] for e in streamed[1:]]
        assert alpha.get("/v1/jobs").json()["jobs"][0]["job_id"] == job
        # the quota counts the database's jobs: two queued fill it, the third is refused
        repo_b = make_repo(tmp_path / "again" / "alpha" / "b")
        assert submit(alpha, repo_b, calls=CALLS).status_code == 202
        assert submit(alpha, repo_b, calls=CALLS).status_code == 202
        third = submit(alpha, repo_b, calls=CALLS)
        assert (third.status_code, error_of(third)) == (429, "QUOTA_EXCEEDED")
