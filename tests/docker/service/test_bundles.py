"""Attacks on ``patchbox serve``'s bundles, over real HTTP with real git bundles: concurrent
submits against the queue quota, bundles that unpack to far more than they weigh (a huge
file, many files, folders nested without end, ``.gitattributes`` that would grow a file at
checkout), checkouts when a job starts rather than in the request, clones counted against
the tenant, and the service's own paths kept out of every answer."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import docker

from tests.support.git import init
from tests.support.jobs import APP, FILES, containers_of
from tests.support.service import (
    CALLS,
    SLOW_CALLS,
    events,
    serving,
    slow_task,
    wait_status,
    write_config,
)
from tests.support.service_bundles import bundle_of, data_dir, submit_bundle, upload

# -- with Docker -------------------------------------------------------------------------------


def test_bundle_jobs_check_out_at_start_one_clone_at_a_time_and_leak_no_path(
    tmp_path: Path, client: docker.DockerClient, runtime: str
) -> None:
    """``max_clones = 1``: the second bundle job stays queued, holding no clone, while the
    first runs; once the first is cancelled the second runs to review. No answer about
    either names the service's folder."""
    laptop = init(tmp_path / "laptop" / "greet", FILES, message="greet")
    config = write_config(tmp_path, workers=2, tenant={"max_clones": 1}, runtime=runtime)
    with serving(config) as running:
        alpha = running.client("alpha")
        bundle_id = upload(alpha, bundle_of(laptop)).json()["bundle_id"]
        slow = alpha.post(
            "/v1/jobs", json={"bundle": bundle_id, "task": slow_task(60), "calls": SLOW_CALLS}
        ).json()["job_id"]
        assert wait_status(alpha, slow, {"running"}, timeout=120)["status"] == "running"
        quick = submit_bundle(alpha, bundle_id, calls=CALLS).json()["job_id"]
        time.sleep(2)
        clones = data_dir(running) / "alpha" / "clones"
        assert alpha.get(f"/v1/jobs/{quick}").json()["status"] == "queued"
        assert [p.name for p in clones.iterdir()] == [slow]
        assert (clones / slow / "app.py").read_text() == APP
        assert alpha.post(f"/v1/jobs/{slow}/cancel").status_code == 202
        # each stream ends once its worker is done with the job: clone and containers gone
        assert events(alpha, quick)[-1]["data"] == {"state": "awaiting_review"}
        assert events(alpha, slow)[-1]["data"] == {"state": "cancelled"}
        view = alpha.get(f"/v1/jobs/{quick}").json()
        assert view["status"] == "awaiting_review", view["error"]
        assert '+    return "Hello " + name' in view["diff"]
        assert containers_of(client, slow) == []
        assert containers_of(client, quick) == []
        assert not clones.exists() or list(clones.iterdir()) == []
        root = data_dir(running)
        texts = [alpha.get("/v1/jobs").text]
        for job_id in (slow, quick):
            texts += [alpha.get(f"/v1/jobs/{job_id}{p}").text for p in ("", "/evidence", "/diff")]
            texts.append(json.dumps(events(alpha, job_id)))
        for text in texts:
            assert str(root) not in text
            assert os.path.realpath(root) not in text
            assert "/clones/" not in text
        listed = alpha.get("/v1/jobs").json()["jobs"]
        assert {j["repo"] for j in listed} == {f"bundle:{bundle_id}"}
