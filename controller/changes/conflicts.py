"""Why an apply or revert writes nothing: the conflicts found, the errors that carry them,
and the checks that find them on the repository and on one path."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from controller.changes.worktree import FileState
from controller.repo.layout import RepoLayout, operations_in_progress, resolve_head

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


class Conflict(BaseModel):
    """Why an apply or revert did not write anything."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    code: ConflictCode
    path: str | None = None
    message: str
    detail: str | None = None
    """The merge result with its conflict markers (bounded), for ``merge_conflict``."""


def check_repo(layout: RepoLayout, head: str | None) -> list[Conflict]:
    """HEAD no longer at ``head`` (when given), and every git operation in progress."""
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


def state_conflict(path: str, state: FileState, *, absent: bool) -> Conflict:
    """Why ``state`` is not what was expected (an absent path when ``absent``)."""
    if state.kind == "other":
        return Conflict(code="not_regular", path=path, message="not a regular file")
    if absent:
        return Conflict(code="exists", path=path, message="the path exists in the work tree")
    if state.kind == "missing":
        return Conflict(code="missing", path=path, message="the file was removed")
    return Conflict(code="changed", path=path, message="the file changed")
