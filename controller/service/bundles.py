"""Uploaded git bundles: where the service keeps them and their clones, verifying and
checking one out through the hardened git runner, removing clones and expired uploads.

A bundle is small, what it checks out need not be: a few hundred kilobytes of pack can hold a
gigabyte of zeros or a million files. So before anything is checked out the tree of its
HEAD is read (``git ls-tree``, stopped as soon as it is over a limit) and the checkout is
refused when it holds more bytes or entries than the service's limits; the checkout then
writes exactly those blobs (no ``.gitattributes`` conversion can make a file larger)."""

from __future__ import annotations

import contextlib
import os
import re
import select
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from controller.errors import ErrorCode, GitError, PatchboxError
from controller.jobs.store import repo_key
from controller.repo.git import GitContext, git_argv, run_git
from controller.repo.private import NEUTRAL_ATTRIBUTES
from controller.service.store import PENDING_STATES, ServiceStore

if TYPE_CHECKING:
    from controller.service.config import ServiceConfig

BUNDLE_ID = re.compile(r"^b[0-9a-f]{32}$")
"""An uploaded bundle's id: ``b`` and 32 random hex digits."""
HEAD_LINE = re.compile(rb"^([0-9a-f]{40}|[0-9a-f]{64}) HEAD$", re.MULTILINE)
TREE_SECONDS = 120.0
"""How long reading a bundle's tree may take."""
TREE_READ = 64 * 1024
MAX_TREE_RECORD = 64 * 1024
"""The longest ``git ls-tree`` record (a path longer than any file system takes)."""


@dataclass(frozen=True)
class TreeLimits:
    """What one checkout may write: ``max_bytes`` of files, ``max_entries`` files, folders,
    symbolic links and submodules (``[service]`` ``bundle_max_tree_bytes`` and
    ``bundle_max_tree_entries``)."""

    max_bytes: int
    max_entries: int

    @classmethod
    def of(cls, config: ServiceConfig) -> TreeLimits:
        return cls(config.bundle_max_tree_bytes, config.bundle_max_tree_entries)


@dataclass(frozen=True)
class TreeSize:
    entries: int
    bytes: int


def tenant_folder(config: ServiceConfig, tenant: str) -> Path:
    """The tenant's folder of the service's ``data_dir``: ``bundles/`` and ``clones/``."""
    return config.data_path() / tenant


def bundle_path(config: ServiceConfig, tenant: str, bundle_id: str) -> Path:
    return tenant_folder(config, tenant) / "bundles" / f"{bundle_id}.bundle"


def clone_path(config: ServiceConfig, tenant: str, job_id: str) -> Path:
    return tenant_folder(config, tenant) / "clones" / job_id


def _git_ctx(folder: Path) -> GitContext:
    return GitContext(cwd=folder, git_dir=folder, home=folder)


def verify_bundle(path: Path, scratch: Path, limits: TreeLimits) -> str:
    """HEAD's commit id in the git bundle at ``path``, through the hardened git runner in an
    empty private repository ``scratch`` (removed after): the bundle must be one git reads,
    hold its whole history (no prerequisite commits) and have ``HEAD``, as ``git bundle
    create - HEAD`` writes (:class:`GitError` otherwise), and HEAD's tree must be within
    ``limits`` (``BUNDLE_TREE_TOO_LARGE``, see :func:`measure_tree`)."""
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
        found = HEAD_LINE.search(heads)
        if found is None:
            msg = "the bundle has no HEAD (make it with: git bundle create FILE HEAD)"
            raise GitError(msg)
        head = found.group(1).decode()
        run_git(ctx, "bundle", "unbundle", str(path), spool=True)
        measure_tree(ctx, head, limits)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return head


def measure_tree(ctx: GitContext, commit: str, limits: TreeLimits) -> TreeSize:
    """The entries and the bytes of files of ``commit``'s tree in the repository of ``ctx``
    (``git ls-tree -r -t -l`` through the hardened git runner's command line and
    environment, read as it comes): a :class:`PatchboxError` ``BUNDLE_TREE_TOO_LARGE`` as
    soon as either is over ``limits``, and git is stopped then; :class:`GitError` when git
    fails or takes longer than :data:`TREE_SECONDS`. Folders count as entries, so a tree
    that nests folders without end is stopped as soon as one with files."""
    argv = git_argv("ls-tree", "-r", "-t", "-l", "-z", "--full-tree", commit)
    with tempfile.TemporaryFile() as errors:
        proc = subprocess.Popen(
            argv,
            cwd=ctx.cwd,
            env=ctx.env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=errors,
        )
        try:
            size = _count_tree(proc, limits)
            code = proc.wait(timeout=TREE_SECONDS)
        except subprocess.TimeoutExpired as exc:
            raise GitError(f"git ls-tree did not finish in {TREE_SECONDS:g} s") from exc
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
        if code != 0:
            errors.seek(0)
            lines = errors.read(4096).decode("utf-8", "replace").strip().splitlines()
            raise GitError(f"git ls-tree failed: {(lines[-1] if lines else '')[:300]}")
    return size


def _count_tree(proc: subprocess.Popen[bytes], limits: TreeLimits) -> TreeSize:
    assert proc.stdout is not None  # noqa: S101 - Popen contract with PIPE
    fd = proc.stdout.fileno()
    poller = select.poll()  # not select(): a busy service's descriptors may pass 1024
    poller.register(fd, select.POLLIN)
    deadline = time.monotonic() + TREE_SECONDS
    pending = b""
    entries = total = 0
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise GitError(f"git ls-tree did not finish in {TREE_SECONDS:g} s")
        if not poller.poll(left * 1000):
            continue
        chunk = os.read(fd, TREE_READ)
        if not chunk:
            return TreeSize(entries, total)
        *records, pending = (pending + chunk).split(b"\0")
        if len(pending) > MAX_TREE_RECORD:
            msg = f"the bundle's HEAD has a path longer than {MAX_TREE_RECORD} bytes"
            raise PatchboxError(msg, code=ErrorCode.BUNDLE_INVALID)
        for record in records:
            fields = record.partition(b"\t")[0].split()
            entries += 1
            if len(fields) == 4 and fields[1] == b"blob" and fields[3].isdigit():
                total += int(fields[3])
            if entries > limits.max_entries:
                msg = (
                    f"the bundle's HEAD holds more than {limits.max_entries} files and "
                    "folders (bundle_max_tree_entries)"
                )
                raise PatchboxError(msg, code=ErrorCode.BUNDLE_TREE_TOO_LARGE)
            if total > limits.max_bytes:
                msg = (
                    f"the bundle's HEAD holds more than {limits.max_bytes} bytes of files "
                    "(bundle_max_tree_bytes)"
                )
                raise PatchboxError(msg, code=ErrorCode.BUNDLE_TREE_TOO_LARGE)


def clone_bundle(path: Path, head: str, dest: Path, limits: TreeLimits) -> None:
    """A work tree of the bundle's ``head`` at ``dest`` (a new folder) on branch ``main``,
    through the hardened git runner: no transport, hooks or configuration of anybody's.
    The bundle's objects are read in first and HEAD's tree measured against ``limits``
    (:func:`measure_tree`) before a file is checked out; the clone's ``info/attributes``
    turns every conversion off, so each file is its blob's bytes. :class:`GitError` or
    ``BUNDLE_TREE_TOO_LARGE``, and nothing left at ``dest``, when refused."""
    dest.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        run_git(GitContext(cwd=dest.parent, home=dest.parent), "init", "-q", str(dest))
        ctx = GitContext(cwd=dest, git_dir=dest / ".git", work_tree=dest, home=dest.parent)
        run_git(ctx, "bundle", "unbundle", str(path), spool=True)
        measure_tree(ctx, head, limits)
        info = dest / ".git" / "info"
        info.mkdir(mode=0o700, exist_ok=True)
        (info / "attributes").write_text(NEUTRAL_ATTRIBUTES, encoding="utf-8")
        run_git(ctx, "update-ref", "refs/heads/main", head)
        run_git(ctx, "reset", "-q", "--hard", "refs/heads/main", spool=True)
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)
        raise


def checkout(config: ServiceConfig, tenant: str, bundle_id: str, head: str, dest: Path) -> None:
    """The clone a bundle job runs on, made when the job starts (:func:`clone_bundle`):
    ``BUNDLE_INVALID`` when the bundle is gone or git refuses it, ``BUNDLE_TREE_TOO_LARGE``
    over the service's limits; the messages name neither the bundle's file nor the clone."""
    source = bundle_path(config, tenant, bundle_id)
    if not source.is_file():
        msg = f"the bundle {bundle_id} is no longer kept (bundle_keep_seconds)"
        raise PatchboxError(msg, code=ErrorCode.BUNDLE_INVALID)
    try:
        clone_bundle(source, head, dest, TreeLimits.of(config))
    except GitError as exc:
        message = exc.message.replace(str(source), "the bundle").replace(str(dest), "the clone")
        msg = f"the bundle cannot be checked out: {message}"
        raise PatchboxError(msg, code=ErrorCode.BUNDLE_INVALID) from exc


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
    """Removes bundles older than ``bundle_keep_seconds`` that no queued or running job
    needs, and unfinished uploads as old; with ``clones`` (at start, before any request)
    also the clones of jobs that are neither queued nor running (a job's own clone goes when
    it ends: :meth:`Runner.release`)."""
    cutoff = time.time() - config.bundle_keep_seconds
    needed = {row.request.bundle for row in store.jobs_in(PENDING_STATES)}
    for bundle in store.bundles_before(cutoff):
        if bundle.bundle_id in needed:
            continue
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
