"""Moving a journal record's paths between their before and after contents.

Temp files are written beside their targets and flushed first; then every path is
re-checked just before it is replaced or removed, so a path the user changes meanwhile is
never overwritten; last, the touched folders are flushed. When a path changes under the
move, or a write fails, what was moved goes back and the operation ends as a conflict.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

from controller.changes.journal import (
    ApplyRecord,
    Journal,
    PathRecord,
    Recorded,
    Side,
    fault_point,
)
from controller.changes.worktree import WorkTree
from controller.errors import ApplyConflictError, ConflictError, RevertConflictError
from controller.reasons import Conflict

Target = Literal["before", "after"]


class RacedError(Exception):
    """A path held neither its source nor its target content during a move; ``moved`` lists
    the indexes of the paths already moved."""

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
    """The indexes not yet at ``target``; raises :class:`RacedError` for a path that holds
    neither its source nor its target content."""
    todo: list[int] = []
    for i in indexes:
        source, wanted = _sides(rec.record.paths[i], target)
        state = wt.state(rec.record.paths[i].path)
        if state.matches(wanted):
            continue
        if not state.matches(source):
            raise RacedError(rec.record.paths[i].path, [])
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


def move(
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
    :class:`RacedError` (with the indexes moved so far). Ends with the touched folders
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
            clean_temps(wt, rec, todo)
            raise RacedError(entry.path, moved)
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


def clean_temps(wt: WorkTree, rec: Recorded, indexes: Sequence[int] | None = None) -> None:
    """Removes the temp files of the record's paths (those of ``indexes``, or all)."""
    record = rec.record
    for i in indexes if indexes is not None else range(len(record.paths)):
        for target in ("before", "after"):
            wt.remove_temp(record.paths[i].path, _temp_name(record.nonce, i, target))


def mismatches(wt: WorkTree, rec: Recorded, target: Target) -> list[str]:
    """The record's paths that do not hold their ``target`` content."""
    return [
        p.path
        for p in rec.record.paths
        if not wt.state(p.path).matches(p.after if target == "after" else p.before)
    ]


def run_or_roll_back(
    wt: WorkTree, rec: Recorded, target: Target, step: str, journal: Journal
) -> None:
    """Moves the record to ``target``. When a path changes under it, or a write fails (no
    space, no permission), moves what it already wrote back, settles the journal and raises
    the conflict; when even that fails, the journal keeps the operation for recovery."""
    error: Callable[[Sequence[Conflict]], ConflictError] = (
        ApplyConflictError if target == "after" else RevertConflictError
    )
    back: Target = "before" if target == "after" else "after"
    try:
        move(wt, rec, target, step, range(len(rec.record.paths)))
    except RacedError as raced:
        cause = Conflict(code="changed", path=raced.path, message="changed during the write")
        undo: Sequence[int] | None = raced.moved
    except OSError as exc:
        cause = Conflict(code="write_failed", message=exc.strerror or "a write failed")
        undo = None
    else:
        return
    try:
        clean_temps(wt, rec)
        move(wt, rec, back, f"{step}.undo", undo)
    except (RacedError, OSError):
        attention = Conflict(code="needs_attention", message="run recovery")
        raise error([cause, attention]) from None
    if target == "after":
        journal.mark(rec.record.job_id, "apply.undone")
    else:
        journal.unmark(rec.record.job_id, "revert.begin")
    raise error([cause])
