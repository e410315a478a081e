"""The service's client over real HTTP: :class:`controller.client.ServiceClient` and
``patchbox remote`` (as subprocesses) against ``patchbox serve`` on loopback; git bundle
uploads, their tenancy and size cap; bundle jobs applied to a local repository; events
resumed after a dropped connection; a bad token and an unreachable service."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

import docker
import pytest

from controller.errors import (
    ErrorCode,
    ExitCode,
    ServiceError,
)
from controller.jobs.store import repo_key
from controller.paths import patchbox_home
from tests.support.cli import patchbox
from tests.support.git import Repo, git_env, init
from tests.support.jobs import (
    APP,
    APP_AFTER,
    FILES,
    containers_of,
    make_repo,
)
from tests.support.remote import data_dir, error_of, files_for, remote, service_client
from tests.support.service import TOKENS, serving, write_config

RUNNING = {"queued", "preparing", "running", "validating", "checking"}

# -- with Docker: whole jobs (two) ---------------------------------------------------------------


@pytest.fixture
def live(tmp_path: Path, client: docker.DockerClient) -> Any:
    del client
    with serving(write_config(tmp_path, workers=2)) as running:
        yield running


def test_remote_submit_wait_show_events_apply_and_revert(
    live: Any, tmp_path: Path, client: docker.DockerClient
) -> None:
    repo = make_repo(tmp_path / "alpha" / "greet")
    args = files_for(tmp_path / "files")
    submitted = remote(live, "submit", "--repo", str(repo), *args, "--wait", "--json")
    assert submitted.returncode == 0, submitted.stderr
    view = json.loads(submitted.stdout)
    job_id = view["job_id"]
    assert view["status"] == "awaiting_review"
    assert "state running" in submitted.stderr  # progress: the events as they came
    assert containers_of(client, job_id) == []
    shown = remote(live, "show", job_id, "--json")
    assert shown.returncode == 0
    with service_client(live) as alpha:
        assert json.loads(shown.stdout) == alpha.job(job_id) == view
    assert set(view) >= {"job_id", "status", "error", "diff", "files", "checks", "tool_calls"}
    assert '+    return "Hello " + name' in view["diff"]
    text = remote(live, "show", job_id)
    assert f"job {job_id}: awaiting_review" in text.stdout
    assert "check greet: passed" in text.stdout
    listed = remote(live, "jobs")
    assert job_id in listed.stdout
    streamed = remote(live, "events", job_id, "--json")
    assert streamed.returncode == 0, streamed.stderr
    events = [json.loads(line) for line in streamed.stdout.splitlines()]
    assert [e["id"] for e in events] == list(range(1, len(events) + 1))
    assert [e["data"].get("state") for e in events if e["type"] == "state"] == [
        "queued",
        "preparing",
        "running",
        "validating",
        "checking",
        "awaiting_review",
    ]
    resumed = remote(live, "events", job_id, "--json", "--last-event-id", "4")
    assert [json.loads(line) for line in resumed.stdout.splitlines()] == events[4:]
    plain = remote(live, "events", job_id)
    assert plain.stdout.splitlines()[0] == "1 state queued"
    applied = remote(live, "apply", job_id, "--json")
    assert applied.returncode == 0, applied.stderr
    assert json.loads(applied.stdout)["status"] == "applied"
    assert (repo / "app.py").read_text() == APP_AFTER
    again = remote(live, "apply", job_id, "--json")  # applied already: said so, exit 0
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["already_applied"] is True
    assert (repo / "app.py").read_text() == APP_AFTER
    assert "already applied" in remote(live, "apply", job_id).stdout
    reverted = remote(live, "revert", job_id)
    assert reverted.returncode == 0, reverted.stderr
    assert (repo / "app.py").read_text() == APP


def test_a_bundle_job_end_to_end_applied_to_a_local_repository(
    live: Any, tmp_path: Path, client: docker.DockerClient
) -> None:
    laptop = init(tmp_path / "laptop" / "greet", FILES, message="greet")
    args = files_for(tmp_path / "files")
    submitted = remote(
        live, "submit", "--repo", str(laptop.path), "--bundle", *args, "--wait", "--json"
    )
    assert submitted.returncode == 0, submitted.stderr
    view = json.loads(submitted.stdout)
    job_id = view["job_id"]
    assert view["status"] == "awaiting_review", view["error"]
    assert view["bundle"]["head"] == laptop.head()
    assert '+    return "Hello " + name' in view["diff"]
    assert containers_of(client, job_id) == []
    clone = data_dir(live) / "alpha" / "clones" / job_id
    assert not clone.exists()  # gone with the job, and the engine's private git dir for it
    key = hashlib.sha256(str(clone.resolve() / ".git").encode()).hexdigest()[:24]
    assert (patchbox_home() / "repos").is_dir()
    assert not (patchbox_home() / "repos" / key).exists()
    assert not (patchbox_home() / "locks" / f"{repo_key(str(clone.resolve()))}.lock").exists()
    with service_client(live) as alpha:
        assert alpha.evidence(job_id)
        with pytest.raises(ServiceError) as no_tree:
            alpha.apply(job_id)
        assert no_tree.value.code is ErrorCode.NO_WORK_TREE
    # a clone where the touched file changed since the bundle: refused, nothing written
    changed = init(tmp_path / "changed", None)
    changed.git("pull", "-q", str(laptop.path), "HEAD")
    changed.write("app.py", APP + "# mine\n")
    changed.commit("mine")
    refused = remote(live, "apply", job_id, "--repo", str(changed.path), "--json")
    assert refused.returncode == ExitCode.FAILED, refused.stderr
    assert error_of(refused)["code"] == "APPLY_CONFLICT"
    assert "app.py" in error_of(refused)["message"]
    assert (changed.path / "app.py").read_text() == APP + "# mine\n"
    # a clone that moved on elsewhere: the touched paths are unchanged, so it applies
    moved = init(tmp_path / "moved", None)
    moved.git("pull", "-q", str(laptop.path), "HEAD")
    moved.write("other.txt", "x\n")
    moved.commit("other")
    applied = remote(live, "apply", job_id, "--repo", str(moved.path), "--json")
    assert applied.returncode == 0, applied.stderr
    assert json.loads(applied.stdout)["files"][0]["path"] == "app.py"
    assert (moved.path / "app.py").read_text() == APP_AFTER
    # the repository itself (same HEAD), from its own folder
    env = {"PATCHBOX_TOKEN": TOKENS["alpha"], "PATCHBOX_SERVER": live.url}
    here = patchbox("remote", "apply", job_id, "--repo", str(laptop.path), env=env)
    assert here.returncode == 0, here.stderr
    assert (laptop.path / "app.py").read_text() == APP_AFTER
    assert laptop.git("status", "--porcelain") == "M app.py"
    twice = patchbox("remote", "apply", job_id, "--repo", str(laptop.path), env=env)
    assert twice.returncode == 0, twice.stderr
    assert f"job {job_id} already applied to {laptop.path}" in twice.stdout
    assert (laptop.path / "app.py").read_text() == APP_AFTER
    _show_diff_and_revert_the_local_applies(job_id, view, laptop, moved, env)
    discarded = patchbox("remote", "discard", job_id, "--json", env=env)
    assert json.loads(discarded.stdout)["status"] == "discarded"


def _show_diff_and_revert_the_local_applies(
    job_id: str, view: dict[str, Any], laptop: Any, moved: Any, env: dict[str, str]
) -> None:
    """``remote show --diff``; ``remote revert`` of a bundle job applied in two local
    repositories (``laptop`` and ``moved``): each local apply undone, then applied again."""
    # its diff, as the service has it
    shown = patchbox("remote", "show", job_id, "--diff", env=env)
    assert shown.returncode == 0, shown.stderr
    assert f"job {job_id}: awaiting_review" in shown.stdout
    assert '+    return "Hello " + name' in shown.stdout
    shown_json = json.loads(patchbox("remote", "show", job_id, "--diff", "--json", env=env).stdout)
    assert shown_json["diff"] == view["diff"]
    # remote revert undoes the local applies: the one in --repo, then every other one
    reverted = patchbox("remote", "revert", job_id, "--repo", str(laptop.path), "--json", env=env)
    assert reverted.returncode == 0, reverted.stderr
    [undone] = json.loads(reverted.stdout)["reverted"]
    assert (undone["status"], undone["repo"]) == ("reverted", str(laptop.path))
    assert (laptop.path / "app.py").read_text() == APP
    assert laptop.git("status", "--porcelain") == ""
    assert (moved.path / "app.py").read_text() == APP_AFTER
    local = patchbox("show", undone["local_job_id"], "--json")
    assert json.loads(local.stdout)["status"] == "reverted"
    nothing = patchbox("remote", "revert", job_id, "--repo", str(laptop.path), env=env)
    assert nothing.returncode == ExitCode.USAGE
    assert "nothing to revert" in nothing.stderr
    outside = patchbox("remote", "revert", job_id, env=env, cwd=laptop.path.parent)
    assert outside.returncode == ExitCode.USAGE  # not in a repository, and no --repo
    assert "no --repo given" in outside.stderr
    assert (moved.path / "app.py").read_text() == APP_AFTER
    (moved.path / "sub").mkdir()
    rest = patchbox("remote", "revert", job_id, env=env, cwd=moved.path / "sub")
    assert rest.returncode == 0, rest.stderr  # the repository the current folder is in
    assert f"reverted in {moved.path}" in rest.stdout
    assert (moved.path / "app.py").read_text() == APP
    # applied again after the revert
    reapplied = patchbox("remote", "apply", job_id, "--repo", str(laptop.path), env=env)
    assert reapplied.returncode == 0, reapplied.stderr
    assert (laptop.path / "app.py").read_text() == APP_AFTER


def test_remote_rebase_queues_a_job_that_carries_the_old_one(live: Any, tmp_path: Path) -> None:
    """``remote rebase JOB`` after a commit: a new service job, its parent the old one,
    awaiting review with the old diff on the new commit; the old job is then refused at
    ``remote apply`` with ``JOB_REBASED``."""
    path = make_repo(tmp_path / "alpha" / "greet")
    repo = Repo(path, git_env())  # to commit in it
    args = files_for(tmp_path / "files")
    first = json.loads(
        remote(live, "submit", "--repo", str(path), *args, "--wait", "--json").stdout
    )
    assert first["status"] == "awaiting_review"
    repo.write("notes.txt", "moved on\n")
    repo.commit("upstream")
    rebased = remote(live, "rebase", first["job_id"], "--json")
    assert rebased.returncode == 0, rebased.stdout + rebased.stderr
    answer = json.loads(rebased.stdout)
    assert answer["parent"] == first["job_id"]
    with service_client(live) as alpha:
        started = time.monotonic()
        while alpha.status(answer["job_id"]) in RUNNING:
            assert time.monotonic() - started < 120, "the rebased job did not end"
            time.sleep(0.2)
        view = alpha.job(answer["job_id"])
    assert view["status"] == "awaiting_review"
    refused = remote(live, "apply", first["job_id"], "--json")
    assert refused.returncode != 0
    assert error_of(refused)["code"] == "JOB_REBASED"
    assert (path / "app.py").read_text() == APP
