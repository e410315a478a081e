"""The private baseline of a job: the work tree as the user sees it (once
:mod:`controller.repo.health` finds it healthy), frozen in the controller's own git dir,
never written into the user's repository; and ``git archive`` of its tree.

How the user's repository is read without being written or trusted:

- A private git dir per repository (``$PATCHBOX_HOME/repos/<key>/git``) borrows the user's
  objects read-only through ``objects/info/alternates``. Its config, hooks and attributes
  are the controller's: the repository's own ``.git/config`` is never read by these
  commands, so its fsmonitor, hooks path and filter drivers cannot run.
- Commands that write objects see no alternates (``$PATCHBOX_HOME/repos/<key>/objects``,
  the private dir's second alternate): git would otherwise "freshen" the user's copy of an
  object it finds there, that is, set the mtime of the user's object file or pack.
- ``info/attributes`` there turns every content conversion off, so blobs are the exact bytes
  of the work tree (CRLF included).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from controller.errorinfo import Hint
from controller.errors import ErrorCode, GitError, PatchboxError, UsageError
from controller.paths import owned_temp_dir
from controller.repo.git import GIT_TIMEOUT, GitContext, git_argv, run_git
from controller.repo.health import (
    Counts,
    HealthReport,
    SnapshotLimits,
    blocked_error,
    inspect_work_tree,
)
from controller.repo.layout import locate, resolve_head, submodule_paths
from controller.repo.private import PrivateRepo
from controller.text import visible

Mode = Literal["require-clean", "include-local-changes"]

ARCHIVE_CHUNK = 1 << 20


class Baseline(BaseModel):
    """The frozen inputs of a job's starting point."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    repo: str
    mode: Mode
    head: str
    tree: str
    """Object id of the baseline tree in the private git dir."""
    commit: str
    """HEAD itself for a clean tree; else a private commit whose parent is HEAD."""
    local_digest: str
    """SHA-256 over the local-change state (status and resulting tree)."""
    counts: Counts
    submodules: list[str]
    private_git_dir: str
    built_ms: int


def build_baseline(
    path: Path, mode: Mode = "require-clean", limits: SnapshotLimits | None = None
) -> tuple[Baseline, HealthReport]:
    """Checks health, then freezes the baseline. Raises ``NOT_A_REPOSITORY``,
    ``REPO_BLOCKED`` (with reasons) or ``CONSENT_REQUIRED`` (dirty tree, no consent)."""
    started = time.perf_counter()
    layout = locate(path)
    private = PrivateRepo(layout)
    scratch = owned_temp_dir("baseline-")
    try:
        with private.locked():
            private.ensure()
            seen = inspect_work_tree(layout, private, limits or SnapshotLimits(), scratch)
            report = seen.report
            if not report.ok:
                raise blocked_error(report)
            head = report.head or ""
            if report.dirty and mode == "require-clean":
                c = report.counts
                msg = (
                    f"the work tree has local changes ({c.staged_files} staged, "
                    f"{c.unstaged_files} unstaged, {c.untracked_files} untracked: "
                    f"{named_files(seen.changed_paths)}); commit or stash them, or consent "
                    "to including them"
                )
                raise PatchboxError(
                    msg, code=ErrorCode.CONSENT_REQUIRED, hint=Hint(option="include_local_changes")
                )
            head_tree = private.git("rev-parse", f"{head}^{{tree}}").decode().strip()
            tree = head_tree
            if seen.status.changed:
                assert seen.index is not None  # noqa: S101 - set whenever HEAD resolved
                private.git("add", "-A", "--", ".", index=seen.index, work_tree=True, writes=True)
                # Unchanged blobs are in the user's objects, which this command cannot see.
                out = private.git("write-tree", "--missing-ok", index=seen.index, writes=True)
                tree = out.decode().strip()
            commit = head if tree == head_tree else private.write_commit(tree, head)
            private.git("update-ref", f"refs/patchbox/baselines/{tree}", commit)
            digest = hashlib.sha256(seen.status.raw + b"\0" + tree.encode()).hexdigest()
            baseline = Baseline(
                repo=str(layout.top),
                mode=mode,
                head=head,
                tree=tree,
                commit=commit,
                local_digest=digest,
                counts=report.counts,
                submodules=report.submodules,
                private_git_dir=str(private.git_dir),
                built_ms=round((time.perf_counter() - started) * 1000),
            )
            return baseline, report
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


NAMED_FILES = 5
"""The files a refusal for local changes names (then how many more)."""


def named_files(paths: Iterable[str], shown: int = NAMED_FILES) -> str:
    """The first ``shown`` of ``paths`` in order, each cut at 120 characters and every
    character a terminal acts on or hides written as an escape (file names are the
    repository's, untrusted), then ``and N more``. Protected paths (``.env``, keys) are
    counted, never named: the message may reach a model (an MCP session's refusal)."""
    from patchbox_agent.protected import is_protected_path

    every = sorted(set(paths))
    ordered = [p for p in every if not is_protected_path(p)]
    hidden = len(every) - len(ordered)
    names = ", ".join(visible(p[:120]) for p in ordered[:shown])
    more = len(ordered) - shown
    text = names + (f" and {more} more" if more > 0 else "")
    if hidden:
        text += (", " if text else "") + f"{hidden} protected file{'s' * (hidden != 1)}"
    return text


OBJECT_ID = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
"""A full commit id, SHA-1 or SHA-256."""


def commit_baseline(path: Path, commit: str) -> Baseline | None:
    """The clean baseline of ``commit`` (a full object id) for the repository at ``path``:
    its tree, read in the private git dir (which borrows the repository's objects; nothing
    is written to the repository, and its work tree and index are not read). None when the
    repository does not have that commit. For a diff made elsewhere on that commit (a bundle
    job on a service): :func:`controller.changes.apply.apply_changeset` then checks the work
    tree's touched paths against it as for any job. Raises ``NOT_A_REPOSITORY``."""
    if not OBJECT_ID.fullmatch(commit):
        msg = f"not a full commit id: {commit[:80]!r}"
        raise UsageError(msg)
    started = time.perf_counter()
    layout = locate(path)
    private = PrivateRepo(layout)
    with private.locked():
        private.ensure()
        kind = run_git(private.ctx(), "cat-file", "-t", commit, check=False)
        if kind.returncode != 0 or kind.stdout.strip() != b"commit":
            return None
        tree = private.git("rev-parse", f"{commit}^{{tree}}").decode().strip()
        private.git("update-ref", f"refs/patchbox/baselines/{tree}", commit)
    return Baseline(
        repo=str(layout.top),
        mode="require-clean",
        head=commit,
        tree=tree,
        commit=commit,
        local_digest=hashlib.sha256(b"\0" + tree.encode()).hexdigest(),
        counts=Counts(),
        submodules=submodule_paths(layout),
        private_git_dir=str(private.git_dir),
        built_ms=round((time.perf_counter() - started) * 1000),
    )


def grow_pipe(fd: int) -> None:
    """Asks for a 1 MiB pipe buffer instead of the default 64 KiB (fewer wake-ups: bulk
    pipelines run faster, see docs/performance.md). Harmless where refused."""
    with contextlib.suppress(OSError):
        fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), 1 << 20)


def private_repo_of(baseline: Baseline) -> PrivateRepo:
    """The private git dir a baseline was built in (for later reads of its blobs)."""
    return PrivateRepo(locate(Path(baseline.repo)))


def predicted_tree(path: Path) -> str | None:
    """The tree a clean baseline of ``path`` would have (HEAD's), read from files and the
    private git dir without its lock: a guess made before the baseline is built, so that
    what may serve it (a spare, a cached archive) can be looked up meanwhile. None when it
    cannot be told at once (no private git dir yet, HEAD unreadable): only
    :func:`build_baseline` decides what the baseline is."""
    try:
        layout = locate(path)
        head, why = resolve_head(layout)
        private = PrivateRepo(layout)
        if why is not None or head is None or not (private.git_dir / "HEAD").is_file():
            return None
        out = private.git("rev-parse", "--verify", "--quiet", f"{head}^{{tree}}")
    except (PatchboxError, OSError):
        return None
    return out.decode().strip() or None


def archive_process(baseline: Baseline, stdout: int) -> subprocess.Popen[bytes]:
    """``git archive`` of the baseline tree in the private git dir (neutral attributes: no
    conversion, nothing dropped; submodules come out as empty folders), writing the tar to
    ``stdout`` (a descriptor, or ``subprocess.PIPE``); its stderr is a pipe."""
    git_dir = Path(baseline.private_git_dir)
    ctx = GitContext(cwd=git_dir.parent, git_dir=git_dir, home=git_dir.parent)
    return subprocess.Popen(
        git_argv("archive", "--format=tar", baseline.tree),
        cwd=ctx.cwd,
        env=ctx.env(),
        stdout=stdout,
        stderr=subprocess.PIPE,
    )


def archive_into(baseline: Baseline, fd: int) -> None:
    """``git archive`` of the baseline tree writing into ``fd`` itself (no byte through
    Python). A pipe whose reader left (SIGPIPE) is not an error here: GNU tar stops reading
    at the end-of-archive blocks, and whether the tree was unpacked is the reader's to say."""
    proc = archive_process(baseline, fd)
    try:
        code = proc.wait(timeout=GIT_TIMEOUT)
    except subprocess.TimeoutExpired as exc:
        raise GitError("git archive did not finish") from exc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()
    if code not in (0, -signal.SIGPIPE):
        raise GitError(f"git archive failed with exit {code}")


@contextlib.contextmanager
def archive_stream(baseline: Baseline) -> Iterator[Iterator[bytes]]:
    """The baseline tree as a tar stream (see :func:`archive_process`). The process is
    killed if the consumer stops early."""
    proc = archive_process(baseline, subprocess.PIPE)
    assert proc.stdout is not None  # noqa: S101 - Popen contract with PIPE
    grow_pipe(proc.stdout.fileno())

    def chunks() -> Iterator[bytes]:
        assert proc.stdout is not None  # noqa: S101
        while chunk := proc.stdout.read(ARCHIVE_CHUNK):
            yield chunk
        try:
            code = proc.wait(timeout=GIT_TIMEOUT)
        except subprocess.TimeoutExpired as exc:
            raise GitError("git archive did not finish") from exc
        if code != 0:
            raise GitError(f"git archive failed with exit {code}")

    try:
        yield chunks()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        proc.stdout.close()
        if proc.stderr is not None:
            proc.stderr.close()
