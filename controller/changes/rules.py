"""The rules on a job's diff: :func:`check_diff` is the whole rule set over a
:class:`~controller.changes.tree.BaselineTree` (a Protocol; the in-memory
:class:`~controller.changes.tree.MemoryTree` ships for tests; the rules are in
docs/architecture.md, "The job"). It parses the diff with the strict parser of
:mod:`patchbox_agent.diffs`, applies the path rules, compares every touched path with the
baseline, computes every new file content in memory and checks that the stats of the diff
match the patched tree; a patch check given by the caller (git's, in
:mod:`controller.changes.validate`) runs meanwhile and must agree.

Any failure raises :class:`ChangesetInvalidError` (``CHANGESET_INVALID``) with every reason
found (a stable ``code`` and the path when it is known); a failing file fails the whole set.
Reason codes are those of :data:`patchbox_agent.diffs.REASONS` (the parser and applier, with
every rule on names: the agent refuses the same names for the same reasons) and:

- ``protected_path``, ``config_path``, ``not_allowed``: the protected paths via
  :func:`controller.tools.policy.write_denial` (a config path needs ``allowed_paths`` to name it);
- ``submodule``: ``.gitmodules``, or a path at or inside a submodule of the baseline;
  ``symlink_path``: a path at or through a symlink of the baseline;
- ``mode_mismatch``: a stated old mode that is not the baseline's; ``mode_escalation``: an
  executable bit the file did not have in the baseline (a created file is ``100644``);
  clearing the bit is allowed;
- ``file_too_large``: one file's section of the diff or its new content over the limits;
- ``patch_check``: ``git apply --check`` refuses the diff on the baseline;
  ``stats_mismatch``: git's reading of the diff, or the patched tree, disagrees with the
  parsed stats.

:func:`control_lines` names the added lines a reviewer is warned about
(:attr:`~controller.changes.changeset.ChangeSet.control_characters`).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from controller.changes.changeset import (
    MAX_CONTROL_LINES,
    ChangeSet,
    ChangesetLimits,
    ControlLine,
    FileChange,
    FileMode,
    PathChange,
    Prepared,
)
from controller.changes.tree import (
    MESSAGE_LIMIT,
    MODE_EXEC,
    MODE_FILE,
    MODE_GITLINK,
    MODE_SYMLINK,
    MODE_TREE,
    BaselineTree,
    CheckOutcome,
    IndexEntry,
    Lookup,
    PatchCheck,
    TreeEntry,
)
from controller.errors import ChangesetInvalidError
from controller.reasons import ChangesetReason
from controller.text import has_hidden, hidden_characters
from controller.tools import policy
from patchbox_agent import diffs
from patchbox_agent.globs import Glob

_DIFF_GIT_A = "diff --git a/"


def _reason(code: str, path: str | None, message: str) -> ChangesetReason:
    return ChangesetReason(code=code, path=path, message=message[:MESSAGE_LIMIT])


def _inside(path: str, allowed: Iterable[str]) -> bool:
    folded = policy.fold(path)
    for entry in allowed:
        e = policy.fold(entry).rstrip("/")
        if folded == e or folded.startswith(e + "/"):
            return True
    return False


def policy_reason(
    path: str, allowed_paths: Sequence[str] | None, extra_protected: Sequence[str] = ()
) -> ChangesetReason | None:
    """The protected-path verdict on writing ``path``
    (:func:`controller.tools.policy.write_denial`), named by a reason code; ``.gitmodules`` is
    refused whatever the task allows."""
    if policy.fold(path).rsplit("/", 1)[-1] == ".gitmodules":
        return _reason("submodule", path, ".gitmodules defines submodules")
    allowed = list(allowed_paths) if allowed_paths is not None else None
    denial = policy.write_denial(path, allowed, extra_protected)
    if denial is None:
        return None
    folded = policy.fold(path)
    if policy.never_touch(path) or any(Glob(policy.fold(g))(folded) for g in extra_protected):
        return _reason("protected_path", path, "a protected path")
    if allowed is not None and not _inside(path, allowed):
        return _reason("not_allowed", path, "outside the task's allowed_paths")
    return _reason("config_path", path, denial)


def _entry_reason(path: str, entry: TreeEntry, what: str) -> ChangesetReason:
    if entry.mode == MODE_SYMLINK:
        return _reason("symlink_path", path, f"{what} is a symlink in the baseline")
    if entry.mode == MODE_GITLINK:
        return _reason("submodule", path, f"{what} is a submodule in the baseline")
    if entry.mode == MODE_TREE:
        return _reason("path_conflict", path, f"{what} is a folder in the baseline")
    return _reason("path_conflict", path, f"{what} is a file in the baseline")


def _blocked(path: str, lookup: Lookup) -> ChangesetReason | None:
    if lookup.blocker is None:
        return None
    return _entry_reason(path, lookup.blocker[1], "a parent folder")


def _case_reason(path: str, tree: BaselineTree) -> ChangesetReason | None:
    """A created name, or one of its folders, that differs from a baseline name only by
    case or Unicode normal form."""
    folder = ""
    for part in path.split("/"):
        names = tree.names(folder)
        if not names:
            return None
        if part not in names:
            key = diffs.fold(part)
            if any(diffs.fold(name) == key for name in names):
                return _reason("case_collision", path, "collides with a baseline name")
            return None
        folder = f"{folder}/{part}" if folder else part
    return None


@dataclass
class _Old:
    entry: TreeEntry
    mode: FileMode


def _old_side(
    patch: diffs.FilePatch, tree: BaselineTree, found: list[ChangesetReason]
) -> _Old | None:
    path = patch.old_path
    if path is None:
        return None
    lookup = tree.lookup(path)
    blocked = _blocked(path, lookup)
    if blocked is not None:
        found.append(blocked)
        return None
    entry = lookup.entry
    if entry is None:
        found.append(_reason("missing", path, "not in the baseline"))
        return None
    if entry.mode not in (MODE_FILE, MODE_EXEC):
        found.append(_entry_reason(path, entry, "the path"))
        return None
    mode: FileMode = MODE_EXEC if entry.mode == MODE_EXEC else MODE_FILE
    if patch.old_mode is not None and patch.old_mode != mode:
        found.append(_reason("mode_mismatch", path, f"the baseline mode is {mode}"))
    return _Old(entry, mode)


def _new_side(patch: diffs.FilePatch, tree: BaselineTree, found: list[ChangesetReason]) -> None:
    if patch.kind not in ("create", "rename") or patch.new_path is None:
        return
    path = patch.new_path
    lookup = tree.lookup(path)
    blocked = _blocked(path, lookup)
    if blocked is not None:
        found.append(blocked)
    elif lookup.entry is not None:
        if lookup.entry.mode in (MODE_FILE, MODE_EXEC):
            found.append(_reason("exists", path, "already in the baseline"))
        else:
            found.append(_entry_reason(path, lookup.entry, "the path"))
    elif (collision := _case_reason(path, tree)) is not None:
        found.append(collision)


def _mode_after(patch: diffs.FilePatch, old: _Old | None) -> FileMode | None:
    if patch.kind == "delete":
        return None
    if patch.new_mode is not None:
        return MODE_EXEC if patch.new_mode == MODE_EXEC else MODE_FILE
    return old.mode if old is not None else MODE_FILE


def _section_sizes(text: str) -> list[int]:
    """UTF-8 size of each ``diff --git`` section, in order."""
    starts = [m.start() for m in re.finditer(r"^diff --git ", text, re.MULTILINE)]
    ends = [*starts[1:], len(text)]
    return [len(text[s:e].encode("utf-8")) for s, e in zip(starts, ends, strict=True)]


def _old_names(text: str) -> list[str]:
    """The plain old names a diff seems to touch, read from its ``diff --git`` lines before
    it is parsed (a hint only: a wrong name costs a lookup, nothing else)."""
    names: dict[str, None] = {}
    pos = 0 if text.startswith(_DIFF_GIT_A) else text.find("\n" + _DIFF_GIT_A)
    while pos >= 0:
        start = text.find(_DIFF_GIT_A, pos) + len(_DIFF_GIT_A)
        end = text.find("\n", start)
        line = text[start : end if end >= 0 else len(text)]
        name, sep, _ = line.partition(" b/")
        if sep and '"' not in name:
            names[name] = None
        pos = text.find("\n" + _DIFF_GIT_A, start)
    return list(names)


def _decode(diff: str | bytes) -> tuple[str, bytes]:
    if isinstance(diff, str):
        try:
            return diff, diff.encode("utf-8")
        except UnicodeEncodeError:
            raise ChangesetInvalidError(
                [_reason("not_text", None, "the diff is not valid UTF-8 text")]
            ) from None
    try:
        return diff.decode("utf-8"), diff
    except UnicodeDecodeError:
        raise ChangesetInvalidError(
            [_reason("not_text", None, "the diff is not valid UTF-8 text")]
        ) from None


def _parse(text: str, raw: bytes, limits: ChangesetLimits) -> list[diffs.FilePatch]:
    if len(raw) > limits.max_diff_bytes:
        raise ChangesetInvalidError(
            [_reason("too_large", None, f"the diff is over {limits.max_diff_bytes} bytes")]
        )
    try:
        patches = diffs.parse(text, max_files=limits.max_files, max_bytes=limits.max_diff_bytes)
    except diffs.DiffError as exc:
        raise ChangesetInvalidError([_reason(exc.reason, None, exc.message)]) from None
    if len(raw) <= limits.max_file_diff_bytes:
        return patches
    big = [
        _reason("file_too_large", p.path, f"its section is over {limits.max_file_diff_bytes} B")
        for p, size in zip(patches, _section_sizes(text), strict=True)
        if size > limits.max_file_diff_bytes
    ]
    if big:
        raise ChangesetInvalidError(big)
    return patches


def _rules(
    patches: Sequence[diffs.FilePatch],
    tree: BaselineTree,
    allowed_paths: Sequence[str] | None,
    extra_protected: Sequence[str],
) -> tuple[list[ChangesetReason], list[_Old | None]]:
    found: list[ChangesetReason] = []
    olds: list[_Old | None] = []
    for patch in patches:
        for name in dict.fromkeys(p for p in (patch.old_path, patch.new_path) if p):
            verdict = policy_reason(name, allowed_paths, extra_protected)
            if verdict is not None:
                found.append(verdict)
        old = _old_side(patch, tree, found)
        _new_side(patch, tree, found)
        lied = old is not None and patch.old_mode not in (None, old.mode)
        after = _mode_after(patch, old)
        if after == MODE_EXEC and not lied and (old is None or old.mode != MODE_EXEC):
            found.append(_reason("mode_escalation", patch.path, "would become executable"))
        olds.append(old)
    return found, olds


def _line_count(data: bytes) -> int:
    return data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)


def _sha(data: bytes | None) -> str | None:
    return None if data is None else hashlib.sha256(data).hexdigest()


def _compute(
    patches: Sequence[diffs.FilePatch],
    olds: Sequence[_Old | None],
    tree: BaselineTree,
    limits: ChangesetLimits,
) -> tuple[list[FileChange], list[PathChange]]:
    reads = [
        (patch.old_path, old.entry)
        for patch, old in zip(patches, olds, strict=True)
        if old is not None and patch.old_path is not None
    ]
    blobs = tree.read_all([entry for _, entry in reads])
    contents = {path: blob for (path, _), blob in zip(reads, blobs, strict=True)}
    try:
        result = diffs.apply(
            patches, contents.get, check_index=True, object_format=tree.object_format
        )
    except diffs.DiffError as exc:
        raise ChangesetInvalidError([_reason(exc.reason, None, exc.message)]) from None
    files: list[FileChange] = []
    changes: list[PathChange] = []
    problems: list[ChangesetReason] = []
    for patch, old in zip(patches, olds, strict=True):
        before = contents.get(patch.old_path) if patch.old_path else None
        after = result.get(patch.path)
        mode_before = old.mode if old is not None else None
        mode_after = _mode_after(patch, old)
        sha_before, sha_after = _sha(before), _sha(after)
        if max(len(before or b""), len(after or b"")) > limits.max_file_bytes:
            problems.append(_reason("file_too_large", patch.path, "the content is too large"))
        delta = _line_count(after or b"") - _line_count(before or b"")
        unchanged = patch.kind == "modify" and before == after and mode_before == mode_after
        added, removed = patch.added, patch.removed
        if delta != added - removed or unchanged:
            problems.append(_reason("stats_mismatch", patch.path, "stats disagree with the tree"))
        files.append(
            FileChange(
                path=patch.path,
                old_path=patch.old_path if patch.kind == "rename" else None,
                kind=patch.kind,
                added=added,
                removed=removed,
                sha256_before=sha_before,
                sha256_after=sha_after,
                mode_before=mode_before,
                mode_after=mode_after,
            )
        )
        if patch.kind == "rename" and patch.old_path is not None:
            changes.append(
                PathChange(
                    patch.path, None, after, None, mode_after, None, sha_after, patch.old_path
                )
            )
            changes.append(
                PathChange(patch.old_path, before, None, mode_before, None, sha_before, None)
            )
        else:
            changes.append(
                PathChange(
                    patch.path, before, after, mode_before, mode_after, sha_before, sha_after
                )
            )
    if problems:
        raise ChangesetInvalidError(problems)
    return files, changes


def _flagged(patches: Sequence[diffs.FilePatch]) -> list[ControlLine]:
    found: list[ControlLine] = []
    for patch in patches:
        for hunk in patch.hunks:
            number = hunk.new_start
            for op, text in hunk.lines:
                if op == "-":
                    continue
                if op == "+":
                    chars = hidden_characters(text.removesuffix("\r"))
                    if chars:
                        found.append(ControlLine(path=patch.path, line=number, characters=chars))
                        if len(found) >= MAX_CONTROL_LINES:
                            return found
                number += 1
    return found


def _control_lines(text: str, patches: Sequence[diffs.FilePatch]) -> list[ControlLine]:
    if not has_hidden(text):  # most diffs: one scan, no line walked
        return []
    return _flagged(patches)


def control_lines(diff: str, limits: ChangesetLimits | None = None) -> list[ControlLine]:
    """The added lines of ``diff`` that hold :data:`controller.text.HIDDEN` characters
    (at most :data:`MAX_CONTROL_LINES`), for a diff whether or not it passes the rules;
    empty when it does not parse (nothing then locates a line)."""
    limits = limits or ChangesetLimits()
    if not has_hidden(diff):
        return []
    try:
        patches = diffs.parse(diff, max_files=limits.max_files, max_bytes=limits.max_diff_bytes)
    except diffs.DiffError:
        return []
    return _flagged(patches)


def _compare_numstat(
    files: Sequence[FileChange], numstat: Sequence[tuple[str, int, int]]
) -> list[ChangesetReason]:
    ours = sorted((f.path, f.added, f.removed) for f in files)
    theirs = sorted(numstat)
    if ours == theirs:
        return []
    differ = sorted({p for p, _, _ in set(ours) ^ set(theirs)})
    return [_reason("stats_mismatch", p, "git reads other line counts or files") for p in differ]


def check_diff(  # noqa: PLR0913 - the diff, the tree and keyword-only rule inputs
    diff: str | bytes,
    tree: BaselineTree,
    *,
    allowed_paths: Sequence[str] | None = None,
    extra_protected: Sequence[str] = (),
    limits: ChangesetLimits | None = None,
    patch_check: PatchCheck | None = None,
    baseline_tree: str | None = None,
) -> Prepared:
    """Validates ``diff`` against ``tree`` and computes every new content.

    ``allowed_paths`` is the task's (None: no restriction beyond policy);
    ``extra_protected`` are the operator's protected globs. ``patch_check``, when given,
    runs while the contents are computed, and must pass with the same stats. Raises
    :class:`ChangesetInvalidError` with every reason found; returns only when all hold."""
    limits = limits or ChangesetLimits()
    text, raw = _decode(diff)
    if len(raw) <= limits.max_diff_bytes:
        tree.prefetch(_old_names(text)[: 2 * limits.max_files])
    patches = _parse(text, raw, limits)
    found, olds = _rules(patches, tree, allowed_paths, extra_protected)
    if found:
        raise ChangesetInvalidError(found)
    outcome: Callable[[], CheckOutcome] | None = None
    if patch_check is not None:
        entries = [
            IndexEntry(old.entry.mode, old.entry.oid, patch.old_path)
            for patch, old in zip(patches, olds, strict=True)
            if old is not None and patch.old_path is not None
        ]
        outcome = patch_check(raw, entries)
    try:
        files, changes = _compute(patches, olds, tree, limits)
    except BaseException:
        if outcome is not None:
            outcome()
        raise
    checked = outcome() if outcome is not None else None
    if checked is not None:
        if not checked.ok:
            raise ChangesetInvalidError([_reason("patch_check", None, checked.message)])
        mismatch = _compare_numstat(files, checked.numstat)
        if mismatch:
            raise ChangesetInvalidError(mismatch)
    changeset = ChangeSet(
        files=files,
        added=sum(f.added for f in files),
        removed=sum(f.removed for f in files),
        diff_sha256=hashlib.sha256(raw).hexdigest(),
        baseline_tree=baseline_tree,
        control_characters=_control_lines(text, patches),
    )
    return Prepared(changeset=changeset, changes=tuple(changes), diff=raw)
