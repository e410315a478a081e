"""A job's diff validated on its baseline: :func:`prepare_changeset` runs the rules
(:func:`controller.changes.rules.check_diff`) against the baseline tree in the controller's
private git dir (:class:`~controller.changes.gittree.GitTree`, one ``git cat-file --batch``)
and adds the patch check of ``git apply --check --cached`` on a private temporary index
holding the baseline entries of the touched paths (``git apply --cached`` consults nothing
else), with no work tree. git's own reading of the diff (``--numstat``) must give the same
files and line counts as ours. Failures raise :class:`ChangesetInvalidError` with the reason
codes listed in :mod:`controller.changes.rules`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from controller.changes.changeset import ChangeSet, ChangesetLimits, Prepared
from controller.changes.gittree import GitTree, git_patch_check
from controller.changes.rules import check_diff
from controller.changes.tree import CheckOutcome, IndexEntry, PatchCheck
from controller.repo.baseline import Baseline


class _EarlyCheck:
    """A :data:`PatchCheck` started early: on the baseline entries of the names the diff's
    ``diff --git`` lines show, as soon as the tree's prefetch has them, while the diff is
    parsed. Its outcome is used only when the rules then ask for a check of the same diff
    on the same entries (the outcome depends on nothing else); otherwise the check runs
    again on theirs. Call :meth:`close` once the tree is closed."""

    def __init__(self, check: PatchCheck, raw: bytes) -> None:
        self._check = check
        self._raw = raw
        self._entries: frozenset[IndexEntry] = frozenset()
        self._finish: Callable[[], CheckOutcome] | None = None
        self._thread: threading.Thread | None = None

    def start(self, entries: list[IndexEntry]) -> None:
        """Called on the prefetch thread: starts the check on a thread of its own (its
        index is written while the prefetch reads the blobs)."""
        self._entries = frozenset(entries)
        self._thread = threading.Thread(target=self._run, args=(entries,), daemon=True)
        self._thread.start()

    def _run(self, entries: list[IndexEntry]) -> None:
        try:
            self._finish = self._check(self._raw, entries)
        except Exception:  # the check runs again when it is asked for
            self._finish = None

    def _take(self) -> Callable[[], CheckOutcome] | None:
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join()
        finish, self._finish = self._finish, None
        return finish

    def __call__(self, raw: bytes, entries: Sequence[IndexEntry]) -> Callable[[], CheckOutcome]:
        same = self._entries == frozenset(entries) and raw == self._raw
        finish = self._take()
        if finish is not None and same:
            return finish
        if finish is not None:
            finish()  # waits for it and removes its folder
        return self._check(raw, entries)

    def close(self) -> None:
        finish = self._take()
        if finish is not None:
            finish()


def _raw_or_none(diff: str | bytes) -> bytes | None:
    if isinstance(diff, bytes):
        return diff
    try:
        return diff.encode("utf-8")
    except UnicodeEncodeError:
        return None  # check_diff refuses it


def prepare_changeset(  # noqa: PLR0913 - the diff and keyword-only rule inputs
    baseline: Baseline,
    diff: str | bytes,
    *,
    allowed_paths: Sequence[str] | None = None,
    extra_protected: Sequence[str] = (),
    limits: ChangesetLimits | None = None,
    work_tree: Path | None = None,
) -> Prepared:
    """:func:`check_diff` on the job's baseline tree in the private git dir, with the git
    patch check (started on the prefetched entries while the diff is parsed, and used when
    they are the entries of the diff's old files). ``work_tree``, when given, is read for
    baseline contents it holds unchanged (same git blob id) instead of git. Raises
    :class:`ChangesetInvalidError`, or ``GitError`` when git fails."""
    git_dir = Path(baseline.private_git_dir)
    raw = _raw_or_none(diff)
    early = None if raw is None else _EarlyCheck(git_patch_check(git_dir), raw)
    try:
        on_entries = None if early is None else early.start
        with GitTree(git_dir, baseline.tree, on_entries, work_tree) as tree:
            return check_diff(
                diff,
                tree,
                allowed_paths=allowed_paths,
                extra_protected=extra_protected,
                limits=limits,
                patch_check=early or git_patch_check(git_dir),
                baseline_tree=baseline.tree,
            )
    finally:
        if early is not None:
            early.close()


def validate_changeset(
    baseline: Baseline,
    diff: str | bytes,
    *,
    allowed_paths: Sequence[str] | None = None,
    extra_protected: Sequence[str] = (),
    limits: ChangesetLimits | None = None,
) -> ChangeSet:
    """The summary of a diff that passes every change-set rule on the job's baseline;
    raises :class:`ChangesetInvalidError` otherwise."""
    return prepare_changeset(
        baseline,
        diff,
        allowed_paths=allowed_paths,
        extra_protected=extra_protected,
        limits=limits,
    ).changeset
