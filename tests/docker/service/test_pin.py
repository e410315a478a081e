"""``patchbox serve`` with two tenants, attacked over real HTTP: tenant alpha puts a symbolic
link to tenant beta's repository where its own was (while its job is queued, while the job
reads it, between the decision and an apply, revert or discard), or points its git data
(``.git`` file, ``commondir``, alternates) into beta's root. Each attack ends with
``REPO_NOT_ALLOWED``; beta's work tree is byte for byte as it was, and nothing of beta's
(its files, its HEAD id) reaches anything alpha can read."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import docker
import httpx
import pytest

import controller.sandbox.prepare as prepare_module
from controller.repo.baseline import build_baseline as real_build
from tests.support.jobs import APP, APP_AFTER, containers_of, make_repo, snapshot
from tests.support.service import events, serving, wait_status, write_config
from tests.support.service_pin import BETA_FILES, beta_marks, error_of, submit

ENDED = {"awaiting_review", "failed", "cancelled"}


def swap(folder: Path, target: Path) -> Path:
    """Moves ``folder`` aside and puts a symbolic link to ``target`` in its place."""
    aside = folder.with_name(folder.name + ".orig")
    folder.rename(aside)
    folder.symlink_to(target, target_is_directory=True)
    return aside


def restore(folder: Path, aside: Path) -> None:
    folder.unlink()
    aside.rename(folder)


def seen_by(client: httpx.Client, job_id: str) -> str:
    """Everything the tenant can read of a job: its view, diff, evidence, events and the
    job list."""
    parts = [
        client.get(f"/v1/jobs/{job_id}").text,
        client.get(f"/v1/jobs/{job_id}/diff").text,
        client.get(f"/v1/jobs/{job_id}/evidence").text,
        json.dumps(events(client, job_id)),
        client.get("/v1/jobs").text,
    ]
    return "\n".join(parts)


def assert_refused_job(
    client: httpx.Client, job_id: str, beta: Path, words: str, docker_client: Any
) -> None:
    """The job failed ``REPO_NOT_ALLOWED`` (``words`` in its message) before any tool call,
    left no container, and nothing of beta's is in anything alpha can read of it."""
    view = wait_status(client, job_id, ENDED)
    assert view["status"] == "failed", view
    assert view["error"]["code"] == "REPO_NOT_ALLOWED", view["error"]
    assert words in view["error"]["message"], view["error"]
    assert view["tool_calls"] == []
    assert view["diff"] == ""
    stream = events(client, job_id)
    assert [e["type"] for e in stream] == ["state"] * len(stream)
    assert stream[-1]["data"] == {"state": "failed"}
    text = seen_by(client, job_id)
    for mark in beta_marks(beta):
        assert mark not in text, mark
    assert containers_of(docker_client, job_id) == []


# -- at the job's start and while it reads: Docker, both runtimes -------------------------


def test_a_folder_swapped_while_its_job_is_queued_fails_the_job_unread(
    tmp_path: Path, client: docker.DockerClient, runtime: str
) -> None:
    beta = make_repo(tmp_path / "beta" / "repo", BETA_FILES)
    beta_before = snapshot(beta)
    swapped = make_repo(tmp_path / "alpha" / "swapped")
    gitfile = make_repo(tmp_path / "alpha" / "gitfile")
    with serving(write_config(tmp_path, workers=0, runtime=runtime)) as running:
        alpha = running.client("alpha")
        first = submit(alpha, swapped).json()["job_id"]
        second = submit(alpha, gitfile).json()["job_id"]
        assert [j["status"] for j in alpha.get("/v1/jobs").json()["jobs"]] == ["queued"] * 2
    # while both are queued: one folder becomes a link to beta's repository, the other's
    # .git a file naming beta's git dir
    aside = swap(swapped, beta)
    git_folder = gitfile / ".git"
    git_folder.rename(gitfile / "old-git")
    git_folder.write_text(f"gitdir: {beta / '.git'}\n")
    with serving(write_config(tmp_path, workers=2, runtime=runtime)) as running:
        alpha = running.client("alpha")
        assert_refused_job(
            alpha, first, beta, "goes through a symbolic link below its repository root", client
        )
        assert_refused_job(alpha, second, beta, "(the git dir its .git file names)", client)
    assert snapshot(beta) == beta_before
    assert (aside / "app.py").read_text() == APP


def test_a_swap_while_the_job_reads_its_repository_fails_it_before_the_model(
    tmp_path: Path, client: docker.DockerClient, runtime: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    beta = make_repo(tmp_path / "beta" / "repo", BETA_FILES)
    dirty_beta = make_repo(tmp_path / "beta" / "dirty", BETA_FILES)
    (dirty_beta / "untracked-beta-file.txt").write_text("beta's secret\n")
    before = {beta: snapshot(beta), dirty_beta: snapshot(dirty_beta)}
    kept = make_repo(tmp_path / "alpha" / "kept")  # the link stays
    undone = make_repo(tmp_path / "alpha" / "undone")  # the link is undone after the read
    failing = make_repo(tmp_path / "alpha" / "failing")  # the read of beta's tree fails

    def build_swapped(repo: Path, *args: Any, **kwargs: Any) -> Any:
        """The real build, with alpha's attack at the moment the job reads its repository."""
        target = {kept: beta, undone: beta, failing: dirty_beta}.get(repo)
        if target is None:
            return real_build(repo, *args, **kwargs)
        aside = swap(repo, target)
        try:
            return real_build(repo, *args, **kwargs)
        finally:
            if repo == undone:
                restore(repo, aside)

    monkeypatch.setattr(prepare_module, "build_baseline", build_swapped)
    with serving(write_config(tmp_path, workers=2, runtime=runtime)) as running:
        alpha = running.client("alpha")
        jobs: dict[Path, str] = {}
        for repo in (kept, undone, failing):
            accepted = submit(alpha, repo)
            assert accepted.status_code == 202, accepted.text
            jobs[repo] = accepted.json()["job_id"]
        assert_refused_job(
            alpha,
            jobs[kept],
            beta,
            "goes through a symbolic link below its repository root",
            client,
        )
        assert_refused_job(alpha, jobs[undone], beta, "was replaced while the job read it", client)
        assert_refused_job(
            alpha, jobs[failing], dirty_beta, "goes through a symbolic link below its", client
        )
        # the read's own error (beta's local changes, counted) never reaches alpha
        text = seen_by(alpha, jobs[failing])
        assert "CONSENT_REQUIRED" not in text
        assert "untracked" not in text
    for repo, taken in before.items():
        assert snapshot(repo) == taken
    assert (undone / "app.py").read_text() == APP


# -- between the decision and apply, revert, discard: Docker ------------------------------


def test_apply_revert_and_discard_refuse_a_swapped_folder_and_write_nothing(
    tmp_path: Path, client: docker.DockerClient, runtime: str
) -> None:
    del client
    beta = make_repo(tmp_path / "beta" / "repo", BETA_FILES)
    beta_before = snapshot(beta)
    applied = make_repo(tmp_path / "alpha" / "applied")
    dropped = make_repo(tmp_path / "alpha" / "dropped")
    with serving(write_config(tmp_path, workers=2, runtime=runtime)) as running:
        alpha = running.client("alpha")
        first = submit(alpha, applied).json()["job_id"]
        second = submit(alpha, dropped).json()["job_id"]
        for job_id in (first, second):
            view = wait_status(alpha, job_id, ENDED)
            assert view["status"] == "awaiting_review", view["error"]

        def refused(
            path: str, repo: Path, words: str, attack: Callable[[], Callable[[], None]]
        ) -> None:
            """``attack`` (which returns its undo) makes ``path`` answer 403; nothing of
            beta's or of alpha's own changed, the job's state neither."""
            job_id = path.split("/")[3]
            status = alpha.get(f"/v1/jobs/{job_id}").json()["status"]
            own_before = snapshot(repo)
            undo = attack()
            response = alpha.post(path)
            undo()
            code = error_of(response)
            assert code[:2] == (403, "REPO_NOT_ALLOWED"), response.text
            assert words in code[2], code
            for mark in beta_marks(beta):
                assert mark not in response.text
            assert snapshot(beta) == beta_before
            assert snapshot(repo) == own_before
            assert alpha.get(f"/v1/jobs/{job_id}").json()["status"] == status

        def link_to_beta(repo: Path) -> Callable[[], Callable[[], None]]:
            def attack() -> Callable[[], None]:
                aside = swap(repo, beta)
                return lambda: restore(repo, aside)

            return attack

        def borrow_from_beta(repo: Path) -> Callable[[], Callable[[], None]]:
            alternates = repo / ".git" / "objects" / "info" / "alternates"

            def attack() -> Callable[[], None]:
                alternates.write_text(f"{beta / '.git' / 'objects'}\n")
                return alternates.unlink

            return attack

        link_words = "goes through a symbolic link below its repository root"
        apply_path, revert_path = f"/v1/jobs/{first}/apply", f"/v1/jobs/{first}/revert"
        refused(apply_path, applied, link_words, link_to_beta(applied))
        refused(apply_path, applied, "(objects/info/alternates)", borrow_from_beta(applied))
        assert alpha.post(apply_path).json()["status"] == "applied"
        assert (applied / "app.py").read_text() == APP_AFTER
        refused(revert_path, applied, link_words, link_to_beta(applied))
        refused(revert_path, applied, "(objects/info/alternates)", borrow_from_beta(applied))
        assert alpha.post(revert_path).json()["status"] == "reverted"
        assert (applied / "app.py").read_text() == APP
        discard_path = f"/v1/jobs/{second}/discard"
        refused(discard_path, dropped, link_words, link_to_beta(dropped))
        assert alpha.post(discard_path).json()["status"] == "discarded"
        states = [e["data"]["state"] for e in events(alpha, first) if e["type"] == "state"]
        assert states[-2:] == ["applied", "reverted"]
    assert snapshot(beta) == beta_before
