"""The service signs its jobs with its own key (made at its first start, mode 0600) and
serves each job's attestations to its tenant over real HTTP; they verify against its public
key (``GET /v1/provenance/key``) and the job's diff, and not against a changed diff."""

from __future__ import annotations

from pathlib import Path

import docker
import pytest

from controller.provenance.verify import Rule, verify
from tests.support.cli import patchbox
from tests.support.jobs import make_repo
from tests.support.provenance import independently_verified, public_key
from tests.support.service import CALLS, END, TOKENS, serving, wait_status, write_config
from tests.support.service_http import error_of, submit


@pytest.mark.docker
def test_the_service_signs_and_serves_each_jobs_attestations(
    docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> None:
    del docker_client, sandbox_image
    config = write_config(tmp_path)
    path = make_repo(tmp_path / "alpha" / "greet")
    with serving(config) as running:
        key = tmp_path / "service-provenance.key"
        assert key.stat().st_mode & 0o777 == 0o600
        alpha, beta = running.client("alpha"), running.client("beta")
        anyone = running.client(None)
        pem = anyone.get("/v1/provenance/key")
        assert pem.status_code == 200
        assert pem.text.startswith("-----BEGIN PUBLIC KEY-----")

        job = submit(alpha, path, calls=CALLS).json()["job_id"]
        assert wait_status(alpha, job, END)["status"] == "awaiting_review"
        served = alpha.get(f"/v1/jobs/{job}/attestations")
        assert served.status_code == 200, served.text
        assert served.headers["content-type"].startswith("application/jsonl")
        diff = alpha.get(f"/v1/jobs/{job}/diff").content
        report = verify(diff, served.text, public_key(pem.content))
        assert (report.ok, report.job_id, report.checks) == (True, job, {"greet": "PASSED"})
        assert len(independently_verified(served.text, pem.content)) == 2
        changed = verify(diff.replace(b"Hello", b"Hellp"), served.text, public_key(pem.content))
        assert {f.code for f in changed.failures} == {Rule.SUBJECT_MISMATCH}

        fetched = patchbox(
            "remote",
            "attestations",
            job,
            "--out-dir",
            str(tmp_path / "fetched"),
            "--server",
            running.url,
            env={"PATCHBOX_TOKEN": TOKENS["alpha"]},
        )
        assert fetched.returncode == 0, fetched.stderr
        folder = tmp_path / "fetched"
        assert (folder / "provenance.pub").read_bytes() == pem.content
        checked = patchbox(
            "verify",
            "--diff",
            str(folder / "diff.patch"),
            "--attestations",
            str(folder / "provenance.intoto.jsonl"),
            "--key",
            str(folder / "provenance.pub"),
        )
        assert checked.returncode == 0, checked.stdout + checked.stderr
        assert f"verified: job {job}" in checked.stdout

        other = beta.get(f"/v1/jobs/{job}/attestations")
        assert (other.status_code, error_of(other)) == (404, "NOT_FOUND")
        unauthenticated = anyone.get(f"/v1/jobs/{job}/attestations")
        assert unauthenticated.status_code == 401


@pytest.mark.docker
def test_a_job_not_decided_has_no_attestations(
    docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> None:
    del docker_client, sandbox_image
    config = write_config(tmp_path, workers=0)
    path = make_repo(tmp_path / "alpha" / "greet")
    with serving(config) as running:
        alpha = running.client("alpha")
        job = submit(alpha, path, calls=CALLS).json()["job_id"]
        queued = alpha.get(f"/v1/jobs/{job}/attestations")
        assert (queued.status_code, error_of(queued)) == (409, "JOB_NOT_FINISHED")
        remote = patchbox(
            "remote",
            "attestations",
            job,
            "--out-dir",
            str(tmp_path / "none"),
            "--server",
            running.url,
            "--json",
            env={"PATCHBOX_TOKEN": TOKENS["alpha"]},
        )
        assert remote.returncode != 0
        assert '"JOB_NOT_FINISHED"' in remote.stdout
        assert not (tmp_path / "none").exists()
