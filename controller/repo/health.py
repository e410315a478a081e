"""The health answer for a repository: whether a baseline can be frozen from its work tree
now, the reasons when not (stable reason codes), and the counts of its local changes.

The work tree is looked at in the controller's private git dir
(:mod:`controller.repo.private`), never through the user's git configuration:

- The user's index is *copied* (with its mtime, so git's racy-entry check still holds) and
  only the copy is used; with ``GIT_OPTIONAL_LOCKS=0`` nothing refreshes the original.
  A repository whose own settings convert content (``core.autocrlf``, ``text``/``eol``/
  ``filter`` attributes) gets no copy: every file is hashed as it is on disk. Whether such a
  tree is dirty is asked of a second private git dir (``view``) that applies the
  repository's eol settings and attributes, as the user's ``git status`` does.
- Items git itself does not list (FIFOs, sockets, devices), untracked symlinks and nested
  repositories are reasons, as are operations in progress, a sparse checkout, an unreadable
  HEAD, unmerged paths and local changes over :class:`SnapshotLimits`.
"""

from __future__ import annotations

import os
import shutil
import stat
import threading
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from controller.errors import (
    BareRepositoryError,
    ErrorCode,
    GitError,
    PatchboxError,
    RepoBlockedError,
)
from controller.paths import owned_temp_dir
from controller.reasons import Reason
from controller.repo.git import run_git
from controller.repo.layout import (
    RepoLayout,
    environment_attributes,
    is_sparse,
    locate,
    operations_in_progress,
    read_config,
    resolve_head,
    submodule_paths,
)
from controller.repo.private import PrivateRepo, converts_content


class SnapshotLimits(BaseModel):
    """How much local change a baseline may carry."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    max_files: int = Field(default=10_000, ge=0, le=10_000_000)
    max_bytes: int = Field(default=256 * 1024 * 1024, ge=0, le=1 << 40)


class Counts(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    staged_files: int = 0
    unstaged_files: int = 0
    untracked_files: int = 0
    changed_files: int = 0
    """Distinct paths with any local change."""
    local_bytes: int = 0
    """Bytes on disk of the changed paths that exist."""


class HealthReport(BaseModel):
    """A diagnosis of the repository at one moment: not a lock."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    repo: str
    ok: bool
    kind: str | None = None
    head: str | None = None
    reasons: list[Reason] = Field(default_factory=list)
    counts: Counts = Field(default_factory=Counts)
    submodules: list[str] = Field(default_factory=list)
    """Submodule paths; they are not entered (the baseline holds an empty folder)."""
    converting: bool = False
    """The repository converts content on checkout; the baseline hashes every file."""

    @property
    def dirty(self) -> bool:
        return self.counts.changed_files > 0


@dataclass
class _Status:
    staged: set[str] = field(default_factory=set)
    unstaged: set[str] = field(default_factory=set)
    untracked: list[str] = field(default_factory=list)
    unmerged: list[str] = field(default_factory=list)
    raw: bytes = b""

    @property
    def changed(self) -> bool:
        return bool(self.staged or self.unstaged or self.untracked or self.unmerged)


def _parse_status(raw: bytes) -> _Status:
    status = _Status(raw=raw)
    records = raw.split(b"\0")
    for record in records:
        if not record:
            continue
        kind = record[:1]
        if kind == b"1":
            fields = record.split(b" ", 8)
            xy, path = fields[1], fields[8].decode("utf-8", "surrogateescape")
            if xy[:1] != b".":
                status.staged.add(path)
            if xy[1:2] != b".":
                status.unstaged.add(path)
        elif kind == b"u":
            fields = record.split(b" ", 10)
            status.unmerged.append(fields[10].decode("utf-8", "surrogateescape"))
        elif kind == b"?":
            status.untracked.append(record[2:].decode("utf-8", "surrogateescape"))
    return status


def _walk(top: Path) -> tuple[list[str], list[Path]]:
    """One pass over the work tree: items git itself does not list (FIFOs, sockets,
    devices) and every ``.gitattributes`` file."""
    specials: list[str] = []
    attributes: list[Path] = []
    stack = [top]
    while stack:
        folder = stack.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            if entry.name == ".git" and folder == top:
                continue
            if entry.is_dir(follow_symlinks=False):
                stack.append(Path(entry.path))
            elif entry.is_file(follow_symlinks=False):
                if entry.name == ".gitattributes":
                    attributes.append(Path(entry.path))
            elif not entry.is_symlink():
                specials.append(os.path.relpath(entry.path, top))
    return specials, attributes


def _not_ignored(private: PrivateRepo, index: Path, paths: list[str]) -> list[str]:
    if not paths:
        return []
    proc = run_git(
        private.ctx(index=index, work_tree=True),
        "check-ignore",
        "--no-index",
        "-z",
        "--stdin",
        stdin=b"\0".join(p.encode("utf-8", "surrogateescape") for p in paths) + b"\0",
        check=False,
    )
    ignored = {p.decode("utf-8", "surrogateescape") for p in proc.stdout.split(b"\0") if p}
    return [p for p in paths if p not in ignored]


class Inspection:
    """One look at the work tree: the health answer plus what a build needs next."""

    def __init__(
        self,
        report: HealthReport,
        status: _Status,
        index: Path | None,
        seen_by_user: _Status | None = None,
    ) -> None:
        self.report = report
        self.status = status
        self.index = index
        user = seen_by_user or status
        self.changed_paths: list[str] = sorted(
            user.staged | user.unstaged | set(user.untracked) | set(user.unmerged)
        )
        """Every path with a local change, as the user's git sees it."""


def _head_commit(layout: RepoLayout, private: PrivateRepo, reasons: list[Reason]) -> str | None:
    head, why = resolve_head(layout)
    if why is not None:
        reasons.append(why)
        return None
    assert head is not None  # noqa: S101 - resolve_head gives an id or a reason
    try:
        kind = private.git("cat-file", "-t", head).strip()
    except GitError:
        kind = b""
    if kind != b"commit":
        reasons.append(Reason(code="HEAD_UNRESOLVABLE", detail="HEAD is not a readable commit"))
        return None
    return head


def _status(
    private: PrivateRepo,
    head: str,
    index: Path,
    *,
    copy_from: Path | None,
    view: tuple[str, ...] | None = None,
) -> _Status:
    """``git status`` of the work tree against a private index: a copy of the user's (stat
    data reused) or, without one, HEAD's tree (every file hashed). With ``view`` (``-c``
    arguments), in the view git dir."""
    in_view = view is not None
    if copy_from is not None:
        shutil.copy2(copy_from, index)
    else:
        private.git("read-tree", head, index=index, view=in_view)
    args = [*(view or ()), "status", "--porcelain=v2", "-z", "--untracked-files=all"]
    args += ["--ignored=no", "--no-renames", "--ignore-submodules=all"]
    proc = run_git(private.ctx(index=index, work_tree=True, view=in_view), *args, check=False)
    if proc.returncode != 0 and copy_from is not None:
        # An index git cannot read alone (a split index): start from HEAD instead.
        index.unlink(missing_ok=True)
        return _status(private, head, index, copy_from=None, view=view)
    if proc.returncode != 0:
        raise GitError("git status failed on the private copy of the index")
    return _parse_status(proc.stdout)


def _users_view(layout: RepoLayout, private: PrivateRepo, head: str, scratch: Path) -> _Status:
    """What the user's ``git status`` shows in a repository that converts line endings: the
    repository's eol settings and attributes apply (git's built-in conversions only; no
    filter driver is defined there)."""
    private.ensure_view()
    private.set_head(head, view=True)
    settings: list[str] = []
    for key in ("core.autocrlf", "core.eol"):
        value = read_config(layout, key)
        if value is not None:
            settings += ["-c", f"{key}={value}"]
    for path in environment_attributes(layout):
        settings += ["-c", f"core.attributesFile={path}"]
    user_index = layout.git_dir / "index"
    return _status(
        private,
        head,
        scratch / "index.view",
        copy_from=user_index if user_index.is_file() else None,
        view=tuple(settings),
    )


def _limit_reasons(counts: Counts, limits: SnapshotLimits) -> list[Reason]:
    out = []
    if counts.changed_files > limits.max_files:
        detail = f"{counts.changed_files} changed files > limit {limits.max_files}"
        out.append(Reason(code="LOCAL_CHANGES_TOO_MANY_FILES", detail=detail))
    if counts.local_bytes > limits.max_bytes:
        detail = f"{counts.local_bytes} bytes of local changes > limit {limits.max_bytes}"
        out.append(Reason(code="LOCAL_CHANGES_TOO_LARGE", detail=detail))
    return out


def inspect_work_tree(
    layout: RepoLayout, private: PrivateRepo, limits: SnapshotLimits, scratch: Path
) -> Inspection:
    """One look at the work tree, under the private git dir's lock (the caller holds it);
    ``scratch`` is a folder of the caller's for the private index copies."""
    reasons = operations_in_progress(layout)
    if is_sparse(layout):
        reasons.append(Reason(code="SPARSE_CHECKOUT", detail="sparse checkouts are not supported"))
    head = _head_commit(layout, private, reasons)
    if head is None:
        report = HealthReport(repo=str(layout.top), ok=False, kind=layout.kind, reasons=reasons)
        return Inspection(report, _Status(), None)
    private.set_head(head)
    index = scratch / "index"
    user_index = layout.git_dir / "index"
    copy_from = user_index if user_index.is_file() else None
    # The walk (Python) and git's status of the copied index (a subprocess) overlap; the
    # status is only used if the walk finds no content conversion.
    walked: list[tuple[list[str], list[Path]]] = []
    failed: list[BaseException] = []

    def walk() -> None:
        try:
            walked.append(_walk(layout.top))
        except BaseException as exc:  # re-raised in the caller's thread
            failed.append(exc)

    walker = threading.Thread(target=walk, name="baseline-walk")
    walker.start()
    try:
        speculative = _status(private, head, index, copy_from=copy_from)
    finally:
        walker.join()
    if failed:
        raise failed[0]
    specials, attribute_files = walked[0]
    converting = converts_content(layout, attribute_files)
    if converting:
        # The baseline takes every file's bytes as they are on disk; whether the tree is
        # dirty is what the user's own git says.
        status = _status(private, head, index, copy_from=None)
        seen_by_user = _users_view(layout, private, head, scratch)
    else:
        status = seen_by_user = speculative
    if seen_by_user.unmerged:
        n = len(seen_by_user.unmerged)
        reasons.append(Reason(code="UNMERGED_PATHS", detail=f"{n} unmerged path(s)"))
    counts, found = _count(layout.top, seen_by_user)
    reasons += found
    reasons += [
        Reason(code="UNTRACKED_NOT_REGULAR", detail=f"{rel}: not a file, folder or symlink")
        for rel in _not_ignored(private, index, specials)[:20]
    ]
    reasons += _limit_reasons(counts, limits)
    report = HealthReport(
        repo=str(layout.top),
        ok=not reasons,
        kind=layout.kind,
        head=head,
        reasons=reasons,
        counts=counts,
        submodules=submodule_paths(layout),
        converting=converting,
    )
    return Inspection(report, status, index, seen_by_user)


def _count(top: Path, status: _Status) -> tuple[Counts, list[Reason]]:
    reasons: list[Reason] = []
    untracked = set(status.untracked)
    changed = status.staged | status.unstaged | untracked | set(status.unmerged)
    total = 0
    for rel in changed:
        try:
            st = os.lstat(top / rel)
        except OSError:
            continue
        if rel in untracked or rel.endswith("/"):
            if stat.S_ISLNK(st.st_mode):
                reasons.append(Reason(code="UNTRACKED_SYMLINK", detail=f"{rel}: a symlink"))
            elif not stat.S_ISREG(st.st_mode):
                what = "a nested repository" if rel.endswith("/") else "not a regular file"
                reasons.append(Reason(code="UNTRACKED_NOT_REGULAR", detail=f"{rel}: {what}"))
        if stat.S_ISREG(st.st_mode):
            total += st.st_size
    counts = Counts(
        staged_files=len(status.staged),
        unstaged_files=len(status.unstaged),
        untracked_files=len(status.untracked),
        changed_files=len(changed),
        local_bytes=total,
    )
    return counts, reasons[:20]


def check_health(path: Path, limits: SnapshotLimits | None = None) -> HealthReport:
    """The health answer for ``path``; never raises for a repository's state."""
    try:
        layout = locate(path)
    except RepoBlockedError as exc:
        return HealthReport(repo=str(path), ok=False, reasons=exc.reasons)
    except BareRepositoryError as exc:
        reason = Reason(code="BARE_REPOSITORY", detail=exc.message)
        return HealthReport(repo=str(path), ok=False, reasons=[reason])
    except PatchboxError as exc:
        reason = Reason(code="NOT_A_REPOSITORY", detail=exc.message)
        return HealthReport(repo=str(path), ok=False, reasons=[reason])
    private = PrivateRepo(layout)
    scratch = owned_temp_dir("health-")
    try:
        with private.locked():
            private.ensure()
            return inspect_work_tree(layout, private, limits or SnapshotLimits(), scratch).report
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def blocked_error(report: HealthReport) -> PatchboxError:
    codes = ", ".join(r.code for r in report.reasons)
    if any(r.code in {"NOT_A_REPOSITORY", "BARE_REPOSITORY"} for r in report.reasons):
        return PatchboxError(
            f"{report.repo} is not a git work tree ({codes})", code=ErrorCode.NOT_A_REPOSITORY
        )
    return RepoBlockedError(f"the repository is blocked: {codes}", list(report.reasons))
