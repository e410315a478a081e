"""A job's diff carried onto a newer baseline of the same repository (``patchbox rebase``).

Per path the diff touches, three versions are read in the controller's private git dir:
the old baseline's (the base), the new baseline's (ours) and the diff's result on the old
baseline (theirs). A path the new baseline left as the old one had takes the diff's
result; a path the diff left alone is not touched; a file both changed is merged by
``git merge-file`` (git's three-way merge, on temp files in a controller-owned folder).
Everything else is a conflict: a file the repository removed and the diff changed, a file
the diff removed and the repository changed, a file both created with other contents, an
executable bit both changed another way. Any conflict refuses the whole rebase
(``REBASE_CONFLICT``, each file named with the lines of each overlapping change) before
anything is written; the user's repository is never written at all.

The result is a tree in the private git dir and its diff from the new baseline, made by
the same ``git diff-tree`` options as a job's own diff
(:func:`controller.changes.collect.collect`).
"""

from __future__ import annotations

import hashlib
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from controller.changes.changeset import PathChange
from controller.changes.collect import (
    DIFF_TREE,
    ChangedFile,
    Collected,
    store_blobs,
    tree_over,
)
from controller.changes.conflicts import NAMED_LIMIT, PATH_LIMIT
from controller.changes.gittree import GitTree
from controller.changes.plan import MERGE_DETAIL_LIMIT, merge_file
from controller.changes.tree import MODE_EXEC, MODE_FILE, TreeEntry
from controller.changes.validate import prepare_changeset
from controller.errors import RebaseConflictError
from controller.paths import owned_temp_dir
from controller.reasons import Conflict
from controller.repo.baseline import Baseline, private_repo_of

LABELS = ("repository now", "job's baseline", "job's change")
"""How the conflict markers of a rebase name ours, the base and theirs."""


@dataclass(frozen=True)
class LineRange:
    """Lines ``first`` to ``last`` (from 1) of a file as the repository holds it now."""

    first: int
    last: int

    def text(self) -> str:
        return (
            f"line {self.first}" if self.first >= self.last else f"lines {self.first}-{self.last}"
        )


@dataclass
class Carried:
    """The diff carried onto the new baseline (git's unified format, full index lines,
    empty when the new baseline holds the change already), the tree it leads to, and the
    paths merged three-way."""

    collected: Collected
    merged: list[str] = field(default_factory=list)


def conflict_ranges(merged: bytes) -> list[LineRange]:
    """Where each conflict of ``git merge-file``'s output sits in ours (the repository's
    version): the lines of ours between the ``<<<<<<<`` and ``=======`` markers (a change
    that only adds lines there is named by the line it comes before)."""
    ranges: list[LineRange] = []
    line = 0  # lines of ours seen so far
    start: int | None = None
    in_ours = False
    for raw in merged.split(b"\n"):
        if raw.startswith(b"<<<<<<< ") or raw == b"<<<<<<<":
            start, in_ours = line + 1, True
            continue
        if in_ours and (raw.startswith(b"||||||| ") or raw in {b"|||||||", b"======="}):
            in_ours = False
            assert start is not None  # noqa: S101 - set by the opening marker
            ranges.append(LineRange(start, max(start, line)))
            continue
        if start is not None and (raw.startswith(b">>>>>>> ") or raw == b">>>>>>>"):
            start = None
            continue
        if start is None or in_ours:
            line += 1
    return ranges


def _mode_of(change: PathChange, now: TreeEntry) -> str | None:
    """The executable bit after the rebase, or None when both changed it differently."""
    before, after = change.mode_before, change.mode_after
    if after is None or after in (before, now.mode):
        return now.mode
    if now.mode == before:
        return after
    return None


class _Carrier:
    def __init__(self, new: Baseline) -> None:
        self.git_dir = Path(new.private_git_dir)
        self.conflicts: list[Conflict] = []
        self.merged: list[str] = []
        self.entries: list[tuple[str, str, bytes | None]] = []
        """(path, mode, content) to write; content None removes the path."""
        self.added: set[str] = set()
        """The paths of :attr:`entries` the new baseline does not hold."""

    def add(self, change: PathChange, now: TreeEntry | None, data: bytes | None) -> None:
        path = change.path
        if now is not None and now.mode not in (MODE_FILE, MODE_EXEC):
            self._conflict("not_regular", path, "not a regular file in the repository now")
        elif change.before is None:
            self._created(change, now, data)
        elif now is None:
            if change.after is not None:
                self._conflict("missing", path, "changed by the job, removed since")
        elif change.after is None:  # removed by the job (or the old name of a rename)
            if data == change.before:
                self.entries.append((path, now.mode, None))
            else:
                self._conflict("changed", path, "removed by the job, changed since")
        else:
            assert data is not None  # noqa: S101 - read for every file the new tree has
            self._changed(change, now, data)

    def _created(self, change: PathChange, now: TreeEntry | None, data: bytes | None) -> None:
        if now is None:
            self.entries.append((change.path, change.mode_after or MODE_FILE, change.after))
            self.added.add(change.path)
        elif data != change.after or now.mode != change.mode_after:
            self._conflict("exists", change.path, "created by the job and, otherwise, since")

    def _changed(self, change: PathChange, now: TreeEntry, data: bytes) -> None:
        assert change.before is not None  # noqa: S101 - a file of the old baseline
        assert change.after is not None  # noqa: S101 - and of the job's result
        mode = _mode_of(change, now)
        if mode is None:
            self._conflict("mode_changed", change.path, "the executable bit changed both ways")
            return
        content = self._content(change.path, change.before, data, change.after)
        if content is not None and (content != data or mode != now.mode):
            self.entries.append((change.path, mode, content))

    def _content(self, path: str, base: bytes, ours: bytes, theirs: bytes) -> bytes | None:
        if ours in (base, theirs):
            return theirs
        if theirs == base:
            return ours
        merged, status = merge_file(self.git_dir, base, ours, theirs, LABELS)
        if status == 0:
            self.merged.append(path)
            return merged
        if 0 < status < 128:  # git merge-file: the number of conflicts
            where = ", ".join(r.text() for r in conflict_ranges(merged)) or "unknown lines"
            self._conflict(
                "merge_conflict",
                path,
                f"{status} overlapping change(s) at {where}",
                merged[:MERGE_DETAIL_LIMIT].decode("utf-8", "replace"),
            )
        else:
            self._conflict("merge_failed", path, "git merge-file failed")
        return None

    def _conflict(self, code: str, path: str, message: str, detail: str | None = None) -> None:
        self.conflicts.append(
            Conflict.model_validate(
                {"code": code, "path": path, "message": message, "detail": detail}
            )
        )


def refusal_message(conflicts: Sequence[Conflict]) -> str:
    """The one-line message of a refused rebase: each file and why (the first
    :data:`~controller.changes.conflicts.NAMED_LIMIT`; the conflicts list has them all)."""
    named = []
    for c in conflicts[:NAMED_LIMIT]:
        path = c.path or ""
        named.append(
            f"{path if len(path) <= PATH_LIMIT else path[: PATH_LIMIT - 3] + '...'} ({c.message})"
        )
    more = len(conflicts) - NAMED_LIMIT
    listed = "; ".join(named) + (f"; and {more} more" if more > 0 else "")
    return (
        f"cannot rebase: {len(conflicts)} file(s) do not merge onto the repository as it is "
        f"now: {listed}; nothing was written"
    )


def carry(
    old: Baseline,
    diff: str,
    new: Baseline,
    *,
    allowed_paths: Sequence[str] | None = None,
    extra_protected: Sequence[str] = (),
) -> Carried:
    """``diff`` (made on ``old``) carried onto ``new``; raises
    :class:`~controller.errors.RebaseConflictError` naming every conflict, or
    ``CHANGESET_INVALID`` when ``diff`` does not pass the rules on ``old``."""
    prepared = prepare_changeset(
        old, diff, allowed_paths=allowed_paths, extra_protected=extra_protected
    )
    carrier = _Carrier(new)
    paths = [c.path for c in prepared.changes]
    with GitTree(Path(new.private_git_dir), new.tree) as tree:
        tree.prefetch(paths)
        found = [tree.lookup(p).entry for p in paths]
        wanted = [e for e in found if e is not None and e.mode in (MODE_FILE, MODE_EXEC)]
        contents = dict(zip([e.oid for e in wanted], tree.read_all(wanted), strict=True))
    for change, now in zip(prepared.changes, found, strict=True):
        data = contents.get(now.oid) if now is not None else None
        carrier.add(change, now, data)
    if carrier.conflicts:
        raise RebaseConflictError(carrier.conflicts, refusal_message(carrier.conflicts))
    return Carried(_write(new, carrier.entries, carrier.added), merged=carrier.merged)


def result_baseline(baseline: Baseline, diff: str) -> Baseline:
    """``baseline`` with ``diff`` applied (a follow-up starts from its parent's result): its
    tree written in the private git dir, a private commit on the baseline's, nothing of the
    repository read or written."""
    started = time.perf_counter()
    tree = carry(baseline, diff, baseline).collected.tree
    private = private_repo_of(baseline)
    commit = private.write_commit(tree, baseline.commit)
    private.git("update-ref", f"refs/patchbox/baselines/{tree}", commit)
    return baseline.model_copy(
        update={
            "tree": tree,
            "commit": commit,
            "local_digest": hashlib.sha256(b"result\0" + tree.encode()).hexdigest(),
            "built_ms": round((time.perf_counter() - started) * 1000),
        }
    )


def tree_diff(baseline: Baseline, tree: str) -> str:
    """The diff from ``baseline``'s tree to ``tree``, as a job's diff is made."""
    return (
        private_repo_of(baseline)
        .git(*DIFF_TREE, baseline.tree, tree)
        .decode("utf-8", "surrogateescape")
    )


def _write(
    new: Baseline, entries: list[tuple[str, str, bytes | None]], added: set[str]
) -> Collected:
    """The new baseline's tree with ``entries`` written over it, and its diff."""
    private = private_repo_of(new)
    scratch = owned_temp_dir("carry-")
    try:
        blobs: dict[str, Path] = {}
        for path, _mode, data in entries:
            if data is not None:
                blobs[path] = scratch / f"blob{len(blobs)}"
                blobs[path].write_bytes(data)
        oids = dict(zip(blobs, store_blobs(private, list(blobs.values())), strict=True))
        written = [(mode, oids[path], path) for path, mode, data in entries if data is not None]
        removed = [path for path, _mode, data in entries if data is None]
        tree, diff = tree_over(private, new.tree, written, removed, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    files = [ChangedFile(path, "removed", None, None) for path in removed]
    files += [
        ChangedFile(
            path,
            "added" if path in added else "modified",
            mode,
            hashlib.sha256(data).hexdigest(),
        )
        for path, mode, data in entries
        if data is not None
    ]
    return Collected(diff=diff, tree=tree, files=sorted(files, key=lambda f: f.path))
