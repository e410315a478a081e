"""Apply and revert of a validated change set on the user's work tree.

No git command runs in the user's repository: HEAD and operations in progress are read as
files (:mod:`controller.repo.layout`), baseline contents come from the controller's private git
dir, and the work tree is reached only through folder descriptors opened without following
symlinks. The index is never opened.

:func:`apply_changeset` validates the diff again (:func:`controller.changes.validate
.prepare_changeset`: rules, patch check, every new content computed in memory), then checks
the work tree: HEAD is the baseline's, no git operation is in progress, and every touched path
has its baseline content (by SHA-256), else ``APPLY_CONFLICT`` with nothing written. With
``merge=True`` a path the user changed meanwhile is merged three-way (``git merge-file`` on
temp files in a controller-owned folder); overlapping changes stay a conflict. The journal
record (every before and after content) is written and fsync'd before the first write; each
new content goes to a temp file beside its target, flushed to disk, then renamed over it (a
path is re-checked just before); the touched folders are flushed, then the apply is marked
done.

:func:`revert_changeset` requires every touched path to still have its post-apply content,
restores the pre-apply contents and modes the same way, and verifies them.

Journal rule (:func:`recover`): an apply or revert that did not reach its done marker is
rolled back to the state it started from (an interrupted apply leaves the job not applied,
an interrupted revert leaves it applied), provided every touched path holds either its
before or its after content; otherwise nothing is written and the job needs attention.
Paths the diff does not touch are never written.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field

from controller.changes.journal import (
    ApplyRecord,
    Journal,
    JournalCorruptError,
    PathRecord,
    Recorded,
    Side,
    check_job_id,
    contents_digest,
    fault_point,
    new_nonce,
)
from controller.changes.validate import (
    MODE_EXEC,
    ChangeSet,
    ChangesetLimits,
    PathChange,
    Prepared,
    prepare_changeset,
)
from controller.errors import ErrorCode, PatchboxError
from controller.paths import owned_temp_dir
from controller.repo.baseline import Baseline
from controller.repo.git import GitContext, run_git
from controller.repo.layout import RepoLayout, locate, operations_in_progress, resolve_head

ConflictCode = Literal[
    "head_moved",
    "operation_in_progress",
    "changed",
    "missing",
    "exists",
    "not_regular",
    "mode_changed",
    "merge_conflict",
    "merge_failed",
    "write_failed",
    "already_applied",
    "not_applied",
    "needs_attention",
]
MERGE_DETAIL_LIMIT = 8192
IO_THREADS = 16
"""Threads that write and flush files at once (their flushes share the disk's commits)."""

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_READ_CHUNK = 1 << 24
_TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
Target = Literal["before", "after"]


class Conflict(BaseModel):
    """Why an apply or revert did not write anything."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    code: ConflictCode
    path: str | None = None
    message: str
    detail: str | None = None
    """The merge result with its conflict markers (bounded), for ``merge_conflict``."""


class _ConflictError(PatchboxError):
    def __init__(self, conflicts: Sequence[Conflict]) -> None:
        listed = ", ".join(c.code + (f" ({c.path})" if c.path else "") for c in conflicts)
        super().__init__(f"{self.verb}: {listed[:1000]}")
        self.conflicts = list(conflicts)

    verb = ""


class ApplyConflictError(_ConflictError):
    """``APPLY_CONFLICT``: the work tree is not as the change set expects; nothing written."""

    code = ErrorCode.APPLY_CONFLICT
    verb = "cannot apply"


class RevertConflictError(_ConflictError):
    """``REVERT_CONFLICT``: a touched path changed after the apply; nothing written."""

    code = ErrorCode.REVERT_CONFLICT
    verb = "cannot revert"


class AppliedFile(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str
    change: Literal["create", "modify", "delete"]
    sha256_before: str | None
    sha256_after: str | None
    merged: bool = False


class ApplyResult(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    job_id: str
    changeset: ChangeSet
    files: list[AppliedFile]
    """Per path written (a rename is a create and a delete)."""
    merged: list[str]
    """Paths merged three-way with the user's concurrent change (``merge=True`` only)."""


class RevertResult(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    job_id: str
    files: list[AppliedFile]
    """Per path restored; ``sha256_after`` is the restored content."""


class Recovery(BaseModel):
    """The state of one job after :func:`recover`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    job_id: str
    state: Literal["applied", "not_applied", "needs_attention"]
    action: Literal["none", "rolled_back_apply", "rolled_back_revert"] = "none"
    paths: list[str] = Field(default_factory=list)
    """For ``needs_attention``: the paths that hold neither their before nor their after
    content (the journal keeps both)."""
    message: str = ""


# ---------------------------------------------------------------------------------------
# The work tree


@dataclass(frozen=True)
class FileState:
    kind: Literal["missing", "file", "other"]
    sha256: str | None = None
    mode: int = 0
    data: bytes | None = None

    def matches(self, side: Side | None) -> bool:
        """Same content and executable bit, or both absent."""
        if side is None:
            return self.kind == "missing"
        return (
            self.kind == "file"
            and self.sha256 == side.sha256
            and bool(self.mode & 0o111) == bool(side.mode & 0o111)
        )


class WorkTree:
    """A work tree reached through folder descriptors opened with ``O_NOFOLLOW``: a
    symlink anywhere in a path makes it ``other``, never followed. Close it (context
    manager) to release the descriptors."""

    def __init__(self, top: Path) -> None:
        self._root = os.open(top, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self._fds: dict[str, int] = {"": self._root}

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def _folder(self, folder: str, *, create: bool = False) -> int:
        fd = self._fds.get(folder)
        if fd is not None:
            return fd
        parent, _, name = folder.rpartition("/")
        parent_fd = self._folder(parent, create=create)
        try:
            fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
        except FileNotFoundError:
            if not create:
                raise
            os.mkdir(name, 0o777, dir_fd=parent_fd)
            fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
        self._fds[folder] = fd
        return fd

    def folder_kind(self, folder: str) -> Literal["missing", "folder", "other"]:
        try:
            self._folder(folder)
        except FileNotFoundError:
            return "missing"
        except OSError:
            return "other"
        return "folder"

    def state(self, path: str, *, with_data: bool = False) -> FileState:
        folder, _, name = path.rpartition("/")
        try:
            fd = os.open(name, _READ_FLAGS, dir_fd=self._folder(folder))
        except FileNotFoundError:
            return FileState("missing")
        except OSError:
            return FileState("other")
        digest, chunks = hashlib.sha256(), []
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return FileState("other")
            while chunk := os.read(fd, min(max(st.st_size + 1, 1 << 16), _READ_CHUNK)):
                digest.update(chunk)
                if with_data:
                    chunks.append(chunk)
        except OSError:
            return FileState("other")
        finally:
            os.close(fd)
        data = b"".join(chunks) if with_data else None
        return FileState("file", digest.hexdigest(), stat.S_IMODE(st.st_mode), data)

    def write_temps(self, items: Sequence[tuple[str, str, bytes, int]]) -> None:
        """Writes each ``(path, temp name, content, mode)`` to the temp file beside ``path``
        (created exclusively, never through a symlink) and flushes it to disk; the files
        are written by a few threads at once, so their flushes share disk commits."""
        folders = [self._folder(path.rpartition("/")[0], create=True) for path, *_ in items]
        jobs = [
            (fd, temp, data, mode) for fd, (_, temp, data, mode) in zip(folders, items, strict=True)
        ]
        _in_threads(_write_temp, jobs)

    def sync_folders(self, folders: Iterable[str]) -> None:
        """Flushes the entries of these folders (renames, removals) to disk; folders that
        are gone are skipped."""
        fds = []
        for folder in set(folders):
            try:
                fds.append(self._folder(folder))
            except OSError:
                continue
        _in_threads(os.fsync, fds)

    def replace(self, path: str, temp: str) -> None:
        folder, _, name = path.rpartition("/")
        fd = self._folder(folder)
        os.rename(temp, name, src_dir_fd=fd, dst_dir_fd=fd)

    def remove(self, path: str) -> None:
        folder, _, name = path.rpartition("/")
        try:
            os.unlink(name, dir_fd=self._folder(folder))
        except FileNotFoundError:
            pass

    def remove_temp(self, path: str, temp: str) -> None:
        try:
            os.unlink(temp, dir_fd=self._folder(path.rpartition("/")[0]))
        except OSError:
            pass

    def make_folders(self, folders: Sequence[str]) -> None:
        for folder in folders:
            self._folder(folder, create=True)

    def remove_empty_folders(self, folders: Sequence[str]) -> None:
        """Removes those of ``folders`` that are empty, deepest first."""
        for folder in sorted(folders, key=lambda f: f.count("/"), reverse=True):
            parent, _, name = folder.rpartition("/")
            fd = self._fds.pop(folder, None)
            if fd is not None:
                os.close(fd)
            try:
                os.rmdir(name, dir_fd=self._folder(parent))
            except OSError:
                pass


def _write_temp(folder_fd: int, temp: str, data: bytes, mode: int) -> None:
    fd = os.open(temp, _TEMP_FLAGS, 0o600, dir_fd=folder_fd)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fchmod(fd, mode)
        os.fdatasync(fd)
    finally:
        os.close(fd)


def _in_threads(fn: Callable[..., object], jobs: Sequence[Any]) -> None:
    """Runs ``fn`` on every job (a tuple of arguments, or one argument) on up to
    ``IO_THREADS`` threads; the first error is raised after all have run."""
    calls = [job if isinstance(job, tuple) else (job,) for job in jobs]
    if len(calls) <= 1:
        for args in calls:
            fn(*args)
        return
    with ThreadPoolExecutor(max_workers=min(IO_THREADS, len(calls))) as pool:
        futures = [pool.submit(fn, *args) for args in calls]
    for future in futures:
        future.result()


# ---------------------------------------------------------------------------------------
# Moving a record's paths between their before and after contents


class _RacedError(Exception):
    def __init__(self, path: str, moved: list[int]) -> None:
        super().__init__(path)
        self.path = path
        self.moved = moved


def _temp_name(nonce: str, index: int, target: Target) -> str:
    return f".patchbox-{nonce}-{index}{'a' if target == 'after' else 'b'}.tmp"


def _sides(entry: PathRecord, target: Target) -> tuple[Side | None, Side | None]:
    """(source, target) sides of a path for a move towards ``target``."""
    if target == "after":
        return entry.before, entry.after
    return entry.after, entry.before


def _pending(wt: WorkTree, rec: Recorded, target: Target, indexes: Sequence[int]) -> list[int]:
    """The indexes not yet at ``target``; raises :class:`_RacedError` for a path that holds
    neither its source nor its target content."""
    todo: list[int] = []
    for i in indexes:
        source, wanted = _sides(rec.record.paths[i], target)
        state = wt.state(rec.record.paths[i].path)
        if state.matches(wanted):
            continue
        if not state.matches(source):
            raise _RacedError(rec.record.paths[i].path, [])
        todo.append(i)
    return todo


def _write_temps(
    wt: WorkTree, rec: Recorded, target: Target, todo: Sequence[int], step: str
) -> None:
    record = rec.record
    contents = rec.after if target == "after" else rec.before
    items = []
    for i in todo:
        data, wanted = contents[i], _sides(record.paths[i], target)[1]
        if data is not None and wanted is not None:
            items.append(
                (record.paths[i].path, _temp_name(record.nonce, i, target), data, wanted.mode)
            )
    wt.write_temps(items)
    fault_point(f"{step}.temps")


def _folders_to_sync(record: ApplyRecord) -> list[str]:
    """Folders whose entries a move changes: each path's, and each created folder's parent."""
    return [p.path.rpartition("/")[0] for p in record.paths] + [
        f.rpartition("/")[0] for f in record.created_dirs
    ]


def _move(
    wt: WorkTree,
    rec: Recorded,
    target: Target,
    step: str,
    todo: Sequence[int] | None = None,
) -> None:
    """Brings the paths of the record from their source content to their ``target``
    content: those in ``todo`` (the caller has just seen them at their source), or every
    path not at its target yet. Temp files are written and flushed first; every path is
    re-checked just before it is replaced, and a path that holds neither content raises
    :class:`_RacedError` (with the indexes moved so far). Ends with the touched folders
    flushed."""
    record = rec.record
    if target == "after":
        wt.make_folders(record.created_dirs)
        fault_point(f"{step}.dirs")
    if todo is None:
        todo = _pending(wt, rec, target, range(len(record.paths)))
    _write_temps(wt, rec, target, todo, step)
    moved: list[int] = []
    for k, i in enumerate(todo, 1):
        entry = record.paths[i]
        source, wanted = _sides(entry, target)
        if not wt.state(entry.path).matches(source):
            _clean_temps(wt, rec, todo)
            raise _RacedError(entry.path, moved)
        if wanted is None:
            wt.remove(entry.path)
        else:
            wt.replace(entry.path, _temp_name(record.nonce, i, target))
        moved.append(i)
        fault_point(f"{step}.write.{k}")
    if target == "before":
        wt.remove_empty_folders(record.created_dirs)
    wt.sync_folders(_folders_to_sync(record))
    fault_point(f"{step}.synced")


def _clean_temps(wt: WorkTree, rec: Recorded, indexes: Sequence[int] | None = None) -> None:
    record = rec.record
    for i in indexes if indexes is not None else range(len(record.paths)):
        for target in ("before", "after"):
            wt.remove_temp(record.paths[i].path, _temp_name(record.nonce, i, target))


def _mismatches(wt: WorkTree, rec: Recorded, target: Target) -> list[str]:
    return [
        p.path
        for p in rec.record.paths
        if not wt.state(p.path).matches(p.after if target == "after" else p.before)
    ]


def _applied_files(record: ApplyRecord, *, reverse: bool = False) -> list[AppliedFile]:
    files = []
    for p in record.paths:
        first, second = (p.after, p.before) if reverse else (p.before, p.after)
        change: Literal["create", "modify", "delete"] = (
            "create" if first is None else "delete" if second is None else "modify"
        )
        files.append(
            AppliedFile(
                path=p.path,
                change=change,
                sha256_before=first.sha256 if first else None,
                sha256_after=second.sha256 if second else None,
                merged=p.merged,
            )
        )
    return files


# ---------------------------------------------------------------------------------------
# Apply


def _umask() -> int:
    try:
        for line in Path("/proc/self/status").read_text("ascii").splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _with_exec(mode: int, executable: bool) -> int:
    if executable:
        return mode | ((mode & 0o444) >> 2)
    return mode & ~0o111


@dataclass
class _Plan:
    paths: list[PathRecord]
    before: list[bytes | None]
    after: list[bytes | None]
    created_dirs: list[str]
    conflicts: list[Conflict]


def _merge(git_dir: Path, base: bytes, ours: bytes, theirs: bytes) -> tuple[bytes, int]:
    """``git merge-file -p`` of the three versions in a controller-owned folder: the
    merged bytes and git's status (0 clean, >0 conflicts, <0 or 255 failure)."""
    scratch = owned_temp_dir("merge-")
    try:
        for name, data in (("ours", ours), ("base", base), ("theirs", theirs)):
            (scratch / name).write_bytes(data)
        ctx = GitContext(cwd=scratch, git_dir=git_dir, home=scratch)
        proc = run_git(
            ctx,
            "merge-file",
            "-p",
            "-L",
            "work tree",
            "-L",
            "baseline",
            "-L",
            "change set",
            "ours",
            "base",
            "theirs",
            check=False,
        )
        return proc.stdout, proc.returncode
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _check_repo(layout: RepoLayout, head: str | None) -> list[Conflict]:
    conflicts = []
    if head is not None:
        current, _ = resolve_head(layout)
        if current != head:
            conflicts.append(Conflict(code="head_moved", message="HEAD moved since the baseline"))
    conflicts += [
        Conflict(code="operation_in_progress", message=f"{r.code}: {r.detail}")
        for r in operations_in_progress(layout)
    ]
    return conflicts


def _state_conflict(path: str, state: FileState, *, absent: bool) -> Conflict:
    """Why ``state`` is not what was expected (an absent path when ``absent``)."""
    if state.kind == "other":
        return Conflict(code="not_regular", path=path, message="not a regular file")
    if absent:
        return Conflict(code="exists", path=path, message="the path exists in the work tree")
    if state.kind == "missing":
        return Conflict(code="missing", path=path, message="the file was removed")
    return Conflict(code="changed", path=path, message="the file changed")


def _new_folders(wt: WorkTree, changes: Sequence[PathChange], found: list[Conflict]) -> list[str]:
    """The folders that created files need and that do not exist yet, parents first; a
    path in the way that is not a folder is added to ``found``."""
    folders: dict[str, None] = {}
    reported = {c.path for c in found}
    for change in changes:
        if change.before is not None or change.after is None or change.path in reported:
            continue
        parts = change.path.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            folder = "/".join(parts[:i])
            if folder in folders:
                continue
            kind = wt.folder_kind(folder)
            if kind == "other":
                found.append(Conflict(code="not_regular", path=folder, message="not a folder"))
                break
            if kind == "missing":
                folders[folder] = None
    return list(folders)


class _Planner:
    def __init__(self, wt: WorkTree, git_dir: Path, merge: bool) -> None:
        self.wt = wt
        self.git_dir = git_dir
        self.merge = merge
        self.umask = _umask()
        self.states: dict[str, FileState] = {}
        self.plan = _Plan([], [], [], [], [])

    def _merged(self, change: PathChange, state: FileState) -> bytes | None:
        assert change.before is not None  # noqa: S101 - only called for a modified file
        assert change.after is not None  # noqa: S101
        assert state.data is not None  # noqa: S101
        merged, status = _merge(self.git_dir, change.before, state.data, change.after)
        if status == 0:
            return merged
        if 0 < status < 128:
            text = merged[:MERGE_DETAIL_LIMIT].decode("utf-8", "replace")
            self.plan.conflicts.append(
                Conflict(
                    code="merge_conflict",
                    path=change.path,
                    message=f"{status} overlapping change(s)",
                    detail=text,
                )
            )
        else:
            self.plan.conflicts.append(
                Conflict(code="merge_failed", path=change.path, message="git merge-file failed")
            )
        return None

    def _after_mode(self, change: PathChange, state: FileState) -> int:
        executable = change.mode_after == MODE_EXEC
        if change.renamed_from is not None:
            return _with_exec(self.states[change.renamed_from].mode, executable)
        if change.before is None:
            return (0o777 if executable else 0o666) & ~self.umask
        if change.mode_after != change.mode_before:
            return _with_exec(state.mode, executable)
        return state.mode

    def add(self, change: PathChange) -> None:
        state = self.states[change.path]
        plan = self.plan
        before, after, merged = change.before, change.after, False
        if change.before is None:
            if state.kind != "missing":
                plan.conflicts.append(_state_conflict(change.path, state, absent=True))
                return
        elif state.kind != "file":
            plan.conflicts.append(_state_conflict(change.path, state, absent=False))
            return
        elif state.sha256 != change.sha256_before:
            if not (self.merge and change.after is not None and change.renamed_from is None):
                plan.conflicts.append(_state_conflict(change.path, state, absent=False))
                return
            after = self._merged(change, state)
            if after is None:
                return
            before, merged = state.data, True
        if (
            state.kind == "file"
            and change.mode_after is not None
            and change.mode_after != change.mode_before
            and bool(state.mode & 0o111) != (change.mode_before == MODE_EXEC)
        ):
            plan.conflicts.append(
                Conflict(code="mode_changed", path=change.path, message="the mode changed")
            )
            return
        plan.paths.append(
            PathRecord(
                path=change.path,
                before=None
                if before is None
                else Side(sha256=state.sha256 or "", size=len(before), mode=state.mode),
                after=None
                if after is None
                else Side(
                    sha256=hashlib.sha256(after).hexdigest(),
                    size=len(after),
                    mode=self._after_mode(change, state),
                ),
                merged=merged,
            )
        )
        plan.before.append(before)
        plan.after.append(after)


def _plan(
    prepared: Prepared, layout: RepoLayout, baseline: Baseline, wt: WorkTree, merge: bool
) -> _Plan:
    planner = _Planner(wt, Path(baseline.private_git_dir), merge)
    conflicts = _check_repo(layout, baseline.head)
    for change in prepared.changes:
        planner.states[change.path] = wt.state(change.path, with_data=merge)
    for change in prepared.changes:
        planner.add(change)
    plan = planner.plan
    plan.created_dirs = _new_folders(wt, prepared.changes, plan.conflicts)
    plan.conflicts[:0] = conflicts
    return plan


def _settle(journal: Journal, job_id: str, *, for_apply: bool) -> Recorded | None:
    """Brings an interrupted operation of the job to rest (caller holds the job's lock and
    the repository's); returns the record of an applied job."""
    phase = journal.phase(job_id)
    if phase == "none":
        return None
    try:
        rec = journal.read_record(job_id)
    except JournalCorruptError as exc:
        conflict = Conflict(code="needs_attention", message=exc.message)
        raise (ApplyConflictError if for_apply else RevertConflictError)([conflict]) from exc
    if phase in ("applying", "reverting"):
        outcome = _recover_locked(journal, job_id, rec)
        if outcome.state == "needs_attention":
            paths: list[str | None] = [*outcome.paths] or [None]
            conflicts = [
                Conflict(code="needs_attention", path=p, message=outcome.message) for p in paths
            ]
            raise (ApplyConflictError if for_apply else RevertConflictError)(conflicts)
    return rec if journal.phase(job_id) == "applied" else None


def apply_changeset(  # noqa: PLR0913 - the change set and keyword-only job inputs
    baseline: Baseline,
    diff: str | bytes,
    *,
    job_id: str,
    allowed_paths: Sequence[str] | None = None,
    extra_protected: Sequence[str] = (),
    limits: ChangesetLimits | None = None,
    merge: bool = False,
    journal: Journal | None = None,
) -> ApplyResult:
    """Applies a job's diff to the user's work tree, all or nothing.

    Raises :class:`~controller.changes.validate.ChangesetInvalidError` when the diff fails
    validation, :class:`ApplyConflictError` when the work tree is not as expected (also for
    a job already applied); in both cases nothing was written. A job that was rolled back
    or reverted may be applied again."""
    check_job_id(job_id)
    journal = journal or Journal()
    prepared = prepare_changeset(
        baseline,
        diff,
        allowed_paths=allowed_paths,
        extra_protected=extra_protected,
        limits=limits,
    )
    layout = locate(Path(baseline.repo))
    repo = str(layout.top)
    with journal.locked(f"job:{job_id}"), journal.locked(f"repo:{repo}"):
        if _settle(journal, job_id, for_apply=True) is not None:
            raise ApplyConflictError(
                [Conflict(code="already_applied", message=f"job {job_id} is applied")]
            )
        journal.discard(job_id)
        with WorkTree(layout.top) as wt:
            plan = _plan(prepared, layout, baseline, wt, merge)
            if plan.conflicts:
                raise ApplyConflictError(plan.conflicts)
            fault_point("apply.checked")
            record = ApplyRecord(
                job_id=job_id,
                repo=repo,
                head=baseline.head,
                baseline_tree=baseline.tree,
                diff_sha256=prepared.changeset.diff_sha256,
                nonce=new_nonce(),
                paths=plan.paths,
                created_dirs=plan.created_dirs,
                contents_sha256=contents_digest(plan.before, plan.after),
            )
            journal.write_record(record, plan.before, plan.after)
            rec = Recorded(record=record, before=plan.before, after=plan.after)
            _run_or_roll_back(wt, rec, "after", "apply", journal)
        journal.mark(job_id, "apply.done")
        fault_point("apply.done")
    return ApplyResult(
        job_id=job_id,
        changeset=prepared.changeset,
        files=_applied_files(record),
        merged=[p.path for p in record.paths if p.merged],
    )


def _run_or_roll_back(
    wt: WorkTree, rec: Recorded, target: Target, step: str, journal: Journal
) -> None:
    """Moves the record to ``target``. When a path changes under it, or a write fails (no
    space, no permission), moves what it already wrote back, settles the journal and raises
    the conflict; when even that fails, the journal keeps the operation for recovery."""
    error: Callable[[Sequence[Conflict]], _ConflictError] = (
        ApplyConflictError if target == "after" else RevertConflictError
    )
    back: Target = "before" if target == "after" else "after"
    try:
        _move(wt, rec, target, step, range(len(rec.record.paths)))
    except _RacedError as raced:
        cause = Conflict(code="changed", path=raced.path, message="changed during the write")
        undo: Sequence[int] | None = raced.moved
    except OSError as exc:
        cause = Conflict(code="write_failed", message=exc.strerror or "a write failed")
        undo = None
    else:
        return
    try:
        _clean_temps(wt, rec)
        _move(wt, rec, back, f"{step}.undo", undo)
    except (_RacedError, OSError):
        attention = Conflict(code="needs_attention", message="run recovery")
        raise error([cause, attention]) from None
    if target == "after":
        journal.mark(rec.record.job_id, "apply.undone")
    else:
        journal.unmark(rec.record.job_id, "revert.begin")
    raise error([cause])


# ---------------------------------------------------------------------------------------
# Revert and recovery


def revert_changeset(job_id: str, *, journal: Journal | None = None) -> RevertResult:
    """Restores every path an applied job touched. Raises
    :class:`RevertConflictError` (nothing written) when the job is not applied, a git
    operation is in progress, or a touched path no longer has its post-apply content."""
    check_job_id(job_id)
    journal = journal or Journal()
    with journal.locked(f"job:{job_id}"):
        if journal.phase(job_id) == "none":
            raise RevertConflictError(
                [Conflict(code="not_applied", message=f"job {job_id} is not applied")]
            )
        try:
            repo = journal.read_record(job_id).record.repo
        except JournalCorruptError as exc:
            raise RevertConflictError(
                [Conflict(code="needs_attention", message=exc.message)]
            ) from exc
        with journal.locked(f"repo:{repo}"):
            rec = _settle(journal, job_id, for_apply=False)
            if rec is None:
                raise RevertConflictError(
                    [Conflict(code="not_applied", message=f"job {job_id} is not applied")]
                )
            _revert_locked(journal, rec)
    return RevertResult(job_id=job_id, files=_applied_files(rec.record, reverse=True))


def _revert_locked(journal: Journal, rec: Recorded) -> None:
    record = rec.record
    conflicts = _check_repo(locate(Path(record.repo)), None)
    with WorkTree(Path(record.repo)) as wt:
        for entry in record.paths:
            state = wt.state(entry.path)
            if not state.matches(entry.after):
                conflicts.append(_state_conflict(entry.path, state, absent=entry.after is None))
        if conflicts:
            raise RevertConflictError(conflicts)
        fault_point("revert.checked")
        journal.mark(record.job_id, "revert.begin")
        fault_point("revert.begin")
        _run_or_roll_back(wt, rec, "before", "revert", journal)
    with WorkTree(Path(record.repo)) as fresh:
        wrong = _mismatches(fresh, rec, "before")
    if wrong:
        raise RevertConflictError(
            [
                Conflict(code="needs_attention", path=p, message="differs after the revert")
                for p in wrong
            ]
        )
    journal.mark(record.job_id, "revert.done")
    fault_point("revert.done")


def _recover_locked(journal: Journal, job_id: str, rec: Recorded) -> Recovery:
    phase = journal.phase(job_id)
    if phase == "applied":
        return Recovery(job_id=job_id, state="applied")
    if phase not in ("applying", "reverting"):
        return Recovery(job_id=job_id, state="not_applied")
    target: Target = "before" if phase == "applying" else "after"
    trouble = _roll_back(rec, target)
    if trouble is not None:
        return trouble
    if phase == "applying":
        journal.mark(job_id, "apply.undone")
        fault_point("recover.done")
        return Recovery(
            job_id=job_id,
            state="not_applied",
            action="rolled_back_apply",
            message="an interrupted apply was rolled back",
        )
    journal.unmark(job_id, "revert.begin")
    fault_point("recover.done")
    return Recovery(
        job_id=job_id,
        state="applied",
        action="rolled_back_revert",
        message="an interrupted revert was rolled back",
    )


def _roll_back(rec: Recorded, target: Target) -> Recovery | None:
    """Brings every path of an interrupted operation to ``target``; a ``needs_attention``
    report (nothing written) when a path holds neither of its contents."""
    job_id = rec.record.job_id

    def attention(paths: list[str], message: str) -> Recovery:
        return Recovery(job_id=job_id, state="needs_attention", paths=paths, message=message)

    try:
        wt = WorkTree(Path(rec.record.repo))
    except OSError:
        return attention([], "the work tree cannot be opened")
    with wt:
        _clean_temps(wt, rec)
        odd = []
        for entry in rec.record.paths:
            state = wt.state(entry.path)
            if not (state.matches(entry.before) or state.matches(entry.after)):
                odd.append(entry.path)
        if odd:
            return attention(odd, "paths hold neither their content before nor after the change")
        try:
            _move(wt, rec, target, "recover")
        except _RacedError as raced:
            return attention([raced.path], "a path changed during recovery")
        except OSError as exc:
            return attention([], f"a write failed during recovery: {exc.strerror}")
    with WorkTree(Path(rec.record.repo)) as fresh:
        wrong = _mismatches(fresh, rec, target)
    return attention(wrong, "differs after recovery") if wrong else None


def recover_job(job_id: str, *, journal: Journal | None = None) -> Recovery:
    """Settles one job (see the journal rule above) and reports its state."""
    check_job_id(job_id)
    journal = journal or Journal()
    with journal.locked(f"job:{job_id}"):
        if journal.phase(job_id) == "none":
            journal.discard(job_id)
            return Recovery(job_id=job_id, state="not_applied")
        try:
            rec = journal.read_record(job_id)
        except JournalCorruptError as exc:
            return Recovery(job_id=job_id, state="needs_attention", message=exc.message)
        with journal.locked(f"repo:{rec.record.repo}"):
            return _recover_locked(journal, job_id, rec)


def recover(journal: Journal | None = None) -> list[Recovery]:
    """For a restarted controller: settles every job in the journal and reports each one
    as ``applied``, ``not_applied`` or ``needs_attention``."""
    journal = journal or Journal()
    return [recover_job(job_id, journal=journal) for job_id in journal.jobs()]


def job_state(job_id: str, *, journal: Journal | None = None) -> Recovery:
    """The state of one job as the journal has it, without settling anything."""
    journal = journal or Journal()
    phase = journal.phase(check_job_id(job_id))
    if phase == "applied":
        return Recovery(job_id=job_id, state="applied")
    if phase in ("applying", "reverting"):
        return Recovery(job_id=job_id, state="needs_attention", message=f"{phase} interrupted")
    return Recovery(job_id=job_id, state="not_applied")
