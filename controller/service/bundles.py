"""Uploaded git bundles: where the service keeps them and their clones, verifying and
checking one out through the hardened git runner, removing clones and expired uploads."""

from __future__ import annotations

import contextlib
import re
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING

from controller.errors import GitError
from controller.jobs.records import repo_key
from controller.repo.git import GitContext, run_git
from controller.service.store import PENDING_STATES, ServiceStore

if TYPE_CHECKING:
    from controller.service.config import ServiceConfig

BUNDLE_ID = re.compile(r"^b[0-9a-f]{32}$")
"""An uploaded bundle's id: ``b`` and 32 random hex digits."""
HEAD_LINE = re.compile(rb"^([0-9a-f]{40}|[0-9a-f]{64}) HEAD$", re.MULTILINE)


def tenant_folder(config: ServiceConfig, tenant: str) -> Path:
    """The tenant's folder of the service's ``data_dir``: ``bundles/`` and ``clones/``."""
    return config.data_path() / tenant


def bundle_path(config: ServiceConfig, tenant: str, bundle_id: str) -> Path:
    return tenant_folder(config, tenant) / "bundles" / f"{bundle_id}.bundle"


def clone_path(config: ServiceConfig, tenant: str, job_id: str) -> Path:
    return tenant_folder(config, tenant) / "clones" / job_id


def _git_ctx(folder: Path) -> GitContext:
    return GitContext(cwd=folder, git_dir=folder, home=folder)


def verify_bundle(path: Path, scratch: Path) -> str:
    """HEAD's commit id in the git bundle at ``path``, through the hardened git runner in an
    empty private repository ``scratch`` (removed after): the bundle must be one git reads,
    hold its whole history (no prerequisite commits) and have ``HEAD``, as ``git bundle
    create - HEAD`` writes. :class:`GitError` otherwise."""
    scratch.mkdir(mode=0o700, parents=True)
    try:
        run_git(GitContext(cwd=scratch, home=scratch), "init", "-q", "--bare", str(scratch))
        ctx = _git_ctx(scratch)
        checked = run_git(ctx, "bundle", "verify", "-q", str(path), check=False, spool=True)
        if checked.returncode != 0:
            lines = checked.stderr.decode("utf-8", "replace").strip().splitlines()
            detail = lines[-1].replace(str(path), "the upload")[:300] if lines else ""
            msg = f"the upload is not a complete git bundle: {detail or 'git cannot read it'}"
            raise GitError(msg)
        heads = run_git(ctx, "bundle", "list-heads", str(path), spool=True).stdout
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    found = HEAD_LINE.search(heads)
    if found is None:
        msg = "the bundle has no HEAD (make it with: git bundle create FILE HEAD)"
        raise GitError(msg)
    return found.group(1).decode()


def clone_bundle(path: Path, head: str, dest: Path) -> None:
    """A work tree of the bundle's ``head`` at ``dest`` (a new folder) on branch ``main``,
    through the hardened git runner: no transport, hooks or configuration of anybody's.
    :class:`GitError` (and nothing left at ``dest``) when git refuses."""
    dest.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        run_git(GitContext(cwd=dest.parent, home=dest.parent), "init", "-q", str(dest))
        ctx = GitContext(cwd=dest, git_dir=dest / ".git", work_tree=dest, home=dest.parent)
        run_git(ctx, "bundle", "unbundle", str(path), spool=True)
        run_git(ctx, "update-ref", "refs/heads/main", head)
        run_git(ctx, "reset", "-q", "--hard", "refs/heads/main", spool=True)
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)
        raise


def remove_clone(dest: Path) -> None:
    """Removes a bundle job's clone, the engine's private git dir and write lock file for
    it (the job's record, diff and evidence are in the job store and stay)."""
    if not dest.exists():
        return
    with contextlib.suppress(Exception):
        from controller.paths import patchbox_home
        from controller.repo.layout import locate
        from controller.repo.private import PrivateRepo

        layout = locate(dest)
        shutil.rmtree(PrivateRepo(layout).root, ignore_errors=True)
        (patchbox_home() / "locks" / f"{repo_key(str(layout.top))}.lock").unlink(missing_ok=True)
    shutil.rmtree(dest, ignore_errors=True)


def sweep(store: ServiceStore, config: ServiceConfig, *, clones: bool = False) -> None:
    """Removes bundles older than ``bundle_keep_seconds`` and unfinished uploads as old;
    with ``clones`` (at start, before any request) also the clones of jobs that are neither
    queued nor running (a job's own clone goes when it ends: :meth:`Runner.release`)."""
    cutoff = time.time() - config.bundle_keep_seconds
    for bundle in store.bundles_before(cutoff):
        bundle_path(config, bundle.tenant, bundle.bundle_id).unlink(missing_ok=True)
        store.delete_bundle(bundle.bundle_id)
    root = config.data_path()
    if not root.is_dir():
        return
    for tenant in root.iterdir():
        with contextlib.suppress(OSError):
            for part in (tenant / "bundles").glob("*.part"):
                if part.stat().st_mtime < cutoff:
                    part.unlink(missing_ok=True)
        folder = tenant / "clones"
        if clones and folder.is_dir():
            for clone in folder.iterdir():
                row = store.get_job(clone.name)
                if row is None or row.state not in PENDING_STATES:
                    remove_clone(clone)
