"""The plan of an apply: what each touched path holds before and after, checked against
the work tree before anything is written.

Every touched path must have its baseline content (by SHA-256) in the work tree, and no git
operation may be in progress, else the plan carries the conflicts (every one of them: the
apply then writes nothing). Where HEAD points is not checked: commits made since the
baseline, or a branch switch, that leave the touched paths as they were do not stop an
apply. With ``merge`` a file the user changed since the baseline is merged three-way
(``git merge-file`` on temp files in a controller-owned folder; base: the baseline's
content, ours: the work tree's, theirs: the diff's), a renamed one into its new name;
overlapping changes stay a conflict of that file. A deleted file that changed, a created
one that exists, a removed one, or one that is no longer a regular file is never merged. A
created file's mode follows the umask, a changed file keeps its permissions, and only the
executable bit follows the diff.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from controller.changes.changeset import PathChange, Prepared
from controller.changes.conflicts import check_repo, state_conflict
from controller.changes.journal import PathRecord, Side
from controller.changes.tree import MODE_EXEC
from controller.changes.worktree import FileState, WorkTree
from controller.paths import owned_temp_dir
from controller.reasons import Conflict
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
    the folders to create; every conflict found (the apply writes nothing if any); and
    whether ``--merge`` would merge a file that differs from the baseline."""

    paths: list[PathRecord]
    before: list[bytes | None]
    after: list[bytes | None]
    created_dirs: list[str]
    conflicts: list[Conflict]
    suggest_merge: bool = False


APPLY_LABELS = ("work tree", "baseline", "change set")
"""How an apply's merge names ours, the base and theirs in its conflict markers."""


def merge_file(
    git_dir: Path,
    base: bytes,
    ours: bytes,
    theirs: bytes,
    labels: tuple[str, str, str] = APPLY_LABELS,
) -> tuple[bytes, int]:
    """``git merge-file -p`` of the three versions in a controller-owned folder: the
    merged bytes and git's status (0 clean, >0 conflicts, <0 or 255 failure). ``labels``
    name ours, the base and theirs in the conflict markers."""
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
            labels[0],
            "-L",
            labels[1],
            "-L",
            labels[2],
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


class _Contents(NamedTuple):
    before: bytes | None
    after: bytes | None
    merged: bool = False


class _Planner:
    def __init__(
        self, wt: WorkTree, git_dir: Path, merge: bool, changes: Sequence[PathChange]
    ) -> None:
        self.wt = wt
        self.git_dir = git_dir
        self.merge = merge
        self.umask = _umask()
        self.changes = {c.path: c for c in changes}
        self.renamed_to = {c.renamed_from: c for c in changes if c.renamed_from is not None}
        self.states: dict[str, FileState] = {}
        self.merges: dict[str, bytes | None] = {}
        self.plan = Plan([], [], [], [], [])

    def _user_changed(self, path: str) -> bool:
        """``path`` is a regular file whose content is not the baseline's."""
        state = self.states[path]
        return state.kind == "file" and state.sha256 != self.changes[path].sha256_before

    def _theirs(self, change: PathChange) -> bytes | None:
        """What the diff makes of the baseline content of ``change.path``: its new content,
        the content of its new name for a renamed file, None for a created or deleted one
        (nothing to merge)."""
        if change.before is None:
            return None
        if change.after is not None:
            return change.after
        target = self.renamed_to.get(change.path)
        return target.after if target is not None else None

    def _merged(self, path: str, theirs: bytes) -> bytes | None:
        """The three-way merge of the work tree's ``path`` (ours) and ``theirs`` on the
        baseline content of ``path``, once per path; None, with the conflict of ``path``
        added to the plan, when it does not merge cleanly."""
        if path in self.merges:
            return self.merges[path]
        base, ours = self.changes[path].before, self.states[path].data
        assert base is not None  # noqa: S101 - only called for a file of the baseline
        assert ours is not None  # noqa: S101 - read with its bytes when merging
        merged, status = merge_file(self.git_dir, base, ours, theirs)
        result = merged if status == 0 else None
        if 0 < status < 128:
            text = merged[:MERGE_DETAIL_LIMIT].decode("utf-8", "replace")
            self.plan.conflicts.append(
                Conflict(
                    code="merge_conflict",
                    path=path,
                    message=f"{status} overlapping change(s)",
                    detail=text,
                )
            )
        elif status != 0:
            self.plan.conflicts.append(
                Conflict(code="merge_failed", path=path, message="git merge-file failed")
            )
        self.merges[path] = result
        return result

    def _after_mode(self, change: PathChange, state: FileState) -> int:
        executable = change.mode_after == MODE_EXEC
        if change.renamed_from is not None:
            return _with_exec(self.states[change.renamed_from].mode, executable)
        if change.before is None:
            return (0o777 if executable else 0o666) & ~self.umask
        if change.mode_after != change.mode_before:
            return _with_exec(state.mode, executable)
        return state.mode

    def _created(self, change: PathChange, state: FileState) -> _Contents | None:
        """A created path (a rename's new name too): it must be absent; with ``merge`` a
        renamed file the user changed gets the merge of its old name."""
        if state.kind != "missing":
            self.plan.conflicts.append(state_conflict(change.path, state, absent=True))
            return None
        source = change.renamed_from
        if source is None or change.after is None:
            return _Contents(None, change.after)
        if not (self.merge and self._user_changed(source)):
            return _Contents(None, change.after)  # the old name is checked on its own
        merged = self._merged(source, change.after)
        return None if merged is None else _Contents(None, merged, merged=True)

    def _contents(self, change: PathChange, state: FileState) -> _Contents | None:
        """What the path holds before and after, or None with its conflict added."""
        plan = self.plan
        if change.before is None:
            return self._created(change, state)
        if state.kind != "file":
            plan.conflicts.append(state_conflict(change.path, state, absent=False))
            return None
        if state.sha256 == change.sha256_before:
            return _Contents(change.before, change.after)
        theirs = self._theirs(change)
        if theirs is None or not self.merge:
            plan.suggest_merge = plan.suggest_merge or theirs is not None
            plan.conflicts.append(state_conflict(change.path, state, absent=False))
            return None
        merged = self._merged(change.path, theirs)
        if merged is None:
            return None
        # A renamed file's merged content goes to its new name; the old one is removed.
        return _Contents(state.data, merged if change.after is not None else None, merged=True)

    def add(self, change: PathChange) -> None:
        state = self.states[change.path]
        plan = self.plan
        contents = self._contents(change, state)
        if contents is None:
            return
        before, after = contents.before, contents.after
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
                merged=contents.merged,
            )
        )
        plan.before.append(before)
        plan.after.append(after)


def plan_apply(
    prepared: Prepared, layout: RepoLayout, baseline: Baseline, wt: WorkTree, merge: bool
) -> Plan:
    """The plan of applying ``prepared`` to the work tree ``wt`` of ``layout``, read now."""
    planner = _Planner(wt, Path(baseline.private_git_dir), merge, prepared.changes)
    conflicts = check_repo(layout)
    for change in prepared.changes:
        planner.states[change.path] = wt.state(change.path, with_data=merge)
    for change in prepared.changes:
        planner.add(change)
    plan = planner.plan
    plan.created_dirs = _new_folders(wt, prepared.changes, plan.conflicts)
    plan.conflicts[:0] = conflicts
    return plan
