"""``patchbox apply`` killed with SIGKILL at any moment, its job then read FIRST (``jobs``,
``show``, the API), before any other apply: real processes on real repositories.

The rule checked after every kill: the state shown is ``applied`` exactly when every file of
the apply holds its content after the change, and ``awaiting_review`` exactly when every one
holds its content before (bytes and modes: the whole work tree byte for byte, no temp file,
no folder left over), never anything else; ``show`` says what ``jobs`` says, and so does the
record (``decision.applied_by`` too, for an apply the killed process had not recorded).

- At each of the apply's steps (the journal's fault points, ``PATCHBOX_FAULT_POINT``).
- After a random delay inside the apply's writing window, over a large apply (100 paths:
  changed, made executable, created in new folders, deleted).
- With readers waiting: the apply stopped mid-write with its locks held while ``jobs`` and
  ``show`` start, then killed: the readers settle what it left.
- ``revert`` killed at each step likewise (``applied`` with the change, ``reverted``
  without); ``discard`` first settles an apply the killed process did not record (an
  applied job is not discarded); the API's ``job`` and, after ``patchbox serve`` was
  killed in an apply, the restarted service's list and view say ``applied``.
- ``run`` in the gated auto mode killed in its apply: ``applied`` when the apply was done,
  else ``failed`` with ``INTERRUPTED`` and nothing written.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import docker
import httpx
import pytest

from controller.changes.journal import FAULT_ENV
from controller.jobs.store import JobStore
from tests.support.cli import ROOT, job_files, patchbox
from tests.support.jobs import APP, APP_AFTER, EDIT, GREET, call, make_repo
from tests.support.service import CALLS, TASK, TOKENS, serving, wait_status, write_config


def test_a_restarted_service_settles_an_apply_its_killed_process_did_not_record(
    tmp_path: Path, client: docker.DockerClient
) -> None:
    del client
    config = write_config(tmp_path)
    repo = make_repo(tmp_path / "alpha" / "greet")
    with serving(config) as running:
        alpha = running.client("alpha")
        job = alpha.post("/v1/jobs", json={"repo": str(repo), "task": TASK, "calls": CALLS})
        job_id = job.json()["job_id"]
        view = wait_status(alpha, job_id, {"awaiting_review", "failed", "cancelled"})
        assert view["status"] == "awaiting_review", view["error"]
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    argv = [sys.executable, "-m", "controller", "serve", "--config", str(config)]
    server = subprocess.Popen(
        [*argv, "--port", str(port)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, FAULT_ENV: "apply.done"},  # it dies in its apply
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(f"{url}/healthz", timeout=2)
                break
            except httpx.TransportError:
                assert server.poll() is None, "patchbox serve ended"
                assert time.monotonic() < deadline, "patchbox serve did not start"
                time.sleep(0.1)
        headers = {"Authorization": f"Bearer {TOKENS['alpha']}"}
        with pytest.raises(httpx.TransportError):
            httpx.post(f"{url}/v1/jobs/{job_id}/apply", headers=headers, timeout=60)
        assert server.wait(timeout=60) == -signal.SIGKILL
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    assert (repo / "app.py").read_text() == APP_AFTER
    assert JobStore().load(job_id).state == "awaiting_review"  # nobody has looked yet
    with serving(config) as running:
        alpha = running.client("alpha")
        listed = alpha.get("/v1/jobs").json()["jobs"]
        assert [j["status"] for j in listed if j["job_id"] == job_id] == ["applied"]
        assert alpha.get(f"/v1/jobs/{job_id}").json()["status"] == "applied"
    assert (repo / "app.py").read_text() == APP_AFTER


@pytest.mark.parametrize(
    ("step", "expected"),
    [("apply.write.1", ("failed", APP)), ("apply.done", ("applied", APP_AFTER))],
    ids=["mid-write", "done"],
)
def test_an_auto_run_killed_in_its_apply_is_all_or_nothing_when_first_read(
    tmp_path: Path, client: docker.DockerClient, step: str, expected: tuple[str, str]
) -> None:
    del client
    repo = make_repo(tmp_path / "greet")
    task = {**TASK, "mode": "auto", "checks": {"greet": GREET}}
    calls = {"turns": [[call("c1", EDIT)]], "final": "done"}
    args = job_files(tmp_path / "in", task, calls, "spare_sandboxes = 0\nallow_auto = true\n")
    env = {**os.environ, FAULT_ENV: step}
    run = subprocess.run(
        [sys.executable, "-m", "controller", "run", "--repo", str(repo), *args, "--json"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        check=False,
        timeout=300,
    )
    assert run.returncode == -signal.SIGKILL, run.stderr
    [record] = [r for r in JobStore().all() if r.repo == str(repo.resolve())]
    assert record.state == "checking"  # nobody has looked yet
    listed = patchbox("jobs", "--json")
    assert listed.returncode == 0, listed.stderr
    [entry] = [j for j in json.loads(listed.stdout)["jobs"] if j["job_id"] == record.job_id]
    state, content = expected
    assert entry["status"] == state
    assert (repo / "app.py").read_text() == content
    assert sorted(p.name for p in repo.iterdir()) == sorted(
        p.name for p in make_repo(tmp_path / "fresh").iterdir()
    )
    if state == "failed":
        assert entry["error_code"] == "INTERRUPTED"
    shown = json.loads(patchbox("show", record.job_id, "--json").stdout)
    assert shown["status"] == state
