"""The plan of an apply: what each touched path holds before and after, checked against
the work tree before anything is written.

Every path must have its baseline content (by SHA-256) and HEAD must be the baseline's, with
no git operation in progress, else the plan carries the conflicts. With ``merge`` a path the
user changed meanwhile is merged three-way (``git merge-file`` on temp files in a
controller-owned folder); overlapping changes stay a conflict. A created file's mode follows
the umask, a changed file keeps its permissions, and only the executable bit follows the
diff.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from controller.changes.conflicts import Conflict, check_repo, state_conflict
from controller.changes.journal import PathRecord, Side
from controller.changes.tree import MODE_EXEC
from controller.changes.validate import PathChange, Prepared
from controller.changes.worktree import FileState, WorkTree
from controller.paths import owned_temp_dir
from controller.repo.baseline import Baseline
from controller.repo.git import GitContext, run_git
from controller.repo.layout import RepoLayout

MERGE_DETAIL_LIMIT = 8192


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
class Plan:
    """Per touched path its record and its contents before and after, in the same order;
    the folders to create; and every conflict found (the apply writes nothing if any)."""

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
        self.plan = Plan([], [], [], [], [])

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
                plan.conflicts.append(state_conflict(change.path, state, absent=True))
                return
        elif state.kind != "file":
            plan.conflicts.append(state_conflict(change.path, state, absent=False))
            return
        elif state.sha256 != change.sha256_before:
            if not (self.merge and change.after is not None and change.renamed_from is None):
                plan.conflicts.append(state_conflict(change.path, state, absent=False))
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


def plan_apply(
    prepared: Prepared, layout: RepoLayout, baseline: Baseline, wt: WorkTree, merge: bool
) -> Plan:
    """The plan of applying ``prepared`` to the work tree ``wt`` of ``layout``, read now."""
    planner = _Planner(wt, Path(baseline.private_git_dir), merge)
    conflicts = check_repo(layout, baseline.head)
    for change in prepared.changes:
        planner.states[change.path] = wt.state(change.path, with_data=merge)
    for change in prepared.changes:
        planner.add(change)
    plan = planner.plan
    plan.created_dirs = _new_folders(wt, prepared.changes, plan.conflicts)
    plan.conflicts[:0] = conflicts
    return plan
