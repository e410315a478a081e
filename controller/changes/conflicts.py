"""Why an apply or revert writes nothing: the conflicts found, the errors that carry them,
the checks that find them on the repository and on one path, and the message of a refused
apply (which files differ from the baseline, and what to do about it).

Where HEAD points is not a conflict: an apply needs the baseline's bytes at the paths the
diff touches, whatever commits or branch switches happened since. A git operation in
progress (merge, rebase, cherry-pick, revert, bisect, ``git am``, an index lock) is one."""

from __future__ import annotations

from collections.abc import Sequence

from controller.changes.worktree import FileState
from controller.errorinfo import Hint
from controller.errors import ApplyConflictError
from controller.reasons import Conflict, ConflictCode
from controller.repo.layout import RepoLayout, operations_in_progress

NAMED_LIMIT = 8
"""How many paths a refusal's message names (the conflicts list has them all)."""
PATH_LIMIT = 200
"""How many characters of one path a refusal's message shows."""


def check_repo(layout: RepoLayout) -> list[Conflict]:
    """Every git operation in progress (HEAD itself may point anywhere)."""
    return [
        Conflict(code="operation_in_progress", message=f"{r.code}: {r.detail}")
        for r in operations_in_progress(layout)
    ]


def state_conflict(path: str, state: FileState, *, absent: bool) -> Conflict:
    """Why ``state`` is not what was expected (an absent path when ``absent``)."""
    if state.kind == "other":
        return Conflict(code="not_regular", path=path, message="not a regular file")
    if absent:
        return Conflict(code="exists", path=path, message="the path exists in the work tree")
    if state.kind == "missing":
        return Conflict(code="missing", path=path, message="the file was removed")
    return Conflict(code="changed", path=path, message="the file changed")


_DIFFERS: dict[ConflictCode, str] = {
    "changed": "changed",
    "missing": "removed",
    "exists": "exists, not in the baseline",
    "not_regular": "not a regular file",
    "mode_changed": "executable bit changed",
}
"""How a path that differs from the baseline is described in a refusal's message."""
_UNMERGED: frozenset[ConflictCode] = frozenset({"merge_conflict", "merge_failed"})


def _named(items: Sequence[str]) -> str:
    shown = ", ".join(items[:NAMED_LIMIT])
    more = len(items) - NAMED_LIMIT
    return shown + (f" and {more} more" if more > 0 else "")


def _path(conflict: Conflict) -> str:
    path = conflict.path or ""
    return path if len(path) <= PATH_LIMIT else path[: PATH_LIMIT - 3] + "..."


def refusal_message(conflicts: Sequence[Conflict]) -> str:
    """The one-line message of an apply refused before anything was written: the git
    operations in progress, the files that differ from the baseline and those that did not
    merge, each with why (at most :data:`NAMED_LIMIT` of each named: the conflicts list has
    them all)."""
    operations = [c.message for c in conflicts if c.code == "operation_in_progress"]
    differ = [f"{_path(c)} ({_DIFFERS[c.code]})" for c in conflicts if c.code in _DIFFERS]
    unmerged = [f"{_path(c)} ({c.message})" for c in conflicts if c.code in _UNMERGED]
    other = [
        c.code + (f" ({_path(c)})" if c.path else "")
        for c in conflicts
        if c.code != "operation_in_progress" and c.code not in _DIFFERS and c.code not in _UNMERGED
    ]
    parts = []
    if operations:
        parts.append(f"a git operation is in progress ({_named(operations)}); finish or abort it")
    if differ:
        touched = f"{len(differ)} file(s) the diff touches differ from the baseline"
        parts.append(f"{touched}: {_named(differ)}")
    if unmerged:
        parts.append(f"{len(unmerged)} file(s) do not merge cleanly: {_named(unmerged)}")
    if other:
        parts.append(_named(other))
    return "cannot apply: " + "; ".join(parts) + "; nothing was written"


def apply_refused(
    conflicts: Sequence[Conflict], *, job_id: str, suggest_merge: bool = False
) -> ApplyConflictError:
    """The ``APPLY_CONFLICT`` of an apply refused before anything was written, with the
    message of :func:`refusal_message` (its ``conflicts`` carry every path and why); with
    ``suggest_merge``, the remedy that would merge them (the ``merge`` option on ``job_id``)."""
    hint = Hint(option="merge", job_id=job_id) if suggest_merge else None
    return ApplyConflictError(conflicts, refusal_message(conflicts), hint=hint)
