"""The one change set a job yields: its diff validated before anything uses it.

The rules are in docs/architecture.md ("The job").

:func:`check_diff` is the whole rule set over a :class:`BaselineTree` (a Protocol; the
in-memory :class:`MemoryTree` ships for tests): it parses the diff with the strict parser of
:mod:`patchbox_agent.diffs`, applies the path rules, compares every touched path with the
baseline, computes every new file content in memory and checks that the stats of the diff
match the patched tree. :func:`prepare_changeset` runs it against a job's baseline in the
controller's private git dir (:class:`GitTree`, one ``git cat-file --batch``) and adds the
patch check of ``git apply --check --cached`` on a private temporary index holding the
baseline entries of the touched paths (``git apply --cached`` consults nothing else), with
no work tree. git's own reading of the diff (``--numstat``) must give the same files and line
counts as ours.

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
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Annotated, Final, Literal, NamedTuple, Protocol, Self

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from controller.errors import ErrorCode, PatchboxError
from controller.paths import owned_temp_dir
from controller.repo.baseline import Baseline
from controller.repo.git import GitContext, GitError, git_argv, run_git
from controller.tools import policy
from patchbox_agent import diffs
from patchbox_agent.globs import Glob

OWN_REASONS = frozenset(
    {
        "protected_path",
        "config_path",
        "not_allowed",
        "submodule",
        "symlink_path",
        "mode_mismatch",
        "mode_escalation",
        "file_too_large",
        "patch_check",
        "stats_mismatch",
    }
)
REASONS = diffs.REASONS | OWN_REASONS
"""Every reason code a refusal may carry (closed set)."""

MODE_FILE: Final = "100644"
MODE_EXEC: Final = "100755"
MODE_SYMLINK = "120000"
MODE_GITLINK = "160000"
MODE_TREE = "040000"
FileMode = Literal["100644", "100755"]
Kind = Literal["create", "modify", "delete", "rename"]

_MESSAGE_LIMIT = 300


def _known(code: str) -> str:
    if code not in REASONS:
        msg = f"unknown reason code {code!r}"
        raise ValueError(msg)
    return code


class ChangesetLimits(BaseModel):
    """How large a change set may be."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    max_files: int = Field(default=diffs.MAX_FILES, ge=1, le=10_000)
    """File sections in the diff."""
    max_diff_bytes: int = Field(default=diffs.MAX_BYTES, ge=1, le=1 << 30)
    """The whole diff, UTF-8 bytes."""
    max_file_diff_bytes: int = Field(default=2 * 1024 * 1024, ge=1, le=1 << 30)
    """One file's section of the diff."""
    max_file_bytes: int = Field(default=16 * 1024 * 1024, ge=0, le=1 << 32)
    """One file's content, before or after the change."""


class ChangesetReason(BaseModel):
    """One reason a change set is refused. ``path`` is a name that passed the parser's
    character checks, or None when the reason is not about one file."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    code: Annotated[str, AfterValidator(_known)]
    path: str | None = None
    message: str


class ChangesetInvalidError(PatchboxError):
    """The diff of a job is refused (``CHANGESET_INVALID``); ``reasons`` lists why. Nothing
    was applied."""

    code = ErrorCode.CHANGESET_INVALID

    def __init__(self, reasons: Sequence[ChangesetReason]) -> None:
        listed = ", ".join(f"{r.code}" + (f" ({r.path})" if r.path else "") for r in reasons)
        super().__init__(f"the change set is invalid: {listed[:1000]}")
        self.reasons = list(reasons)


class FileChange(BaseModel):
    """One file of a change set. Hashes are SHA-256 of the content; modes are git modes."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str
    """The file's name after the change (the new name of a rename)."""
    old_path: str | None = None
    """The old name of a rename."""
    kind: Kind
    added: int
    removed: int
    sha256_before: str | None
    sha256_after: str | None
    mode_before: FileMode | None
    mode_after: FileMode | None


class ChangeSet(BaseModel):
    """The machine-readable summary of a validated diff."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    files: list[FileChange]
    added: int
    removed: int
    diff_sha256: str
    """SHA-256 of the diff's UTF-8 bytes."""
    baseline_tree: str | None = None
    """The baseline tree it was validated on (None for an in-memory tree)."""


@dataclass(frozen=True)
class PathChange:
    """What one path becomes: ``None`` content is an absent file; ``renamed_from`` names
    the source of a rename target."""

    path: str
    before: bytes | None
    after: bytes | None
    mode_before: FileMode | None
    mode_after: FileMode | None
    sha256_before: str | None
    sha256_after: str | None
    renamed_from: str | None = None


@dataclass(frozen=True)
class Prepared:
    """A validated change set with the contents it needs: one :class:`PathChange` per
    touched path (a rename gives two), in diff order."""

    changeset: ChangeSet
    changes: tuple[PathChange, ...]
    diff: bytes


# ---------------------------------------------------------------------------------------
# The baseline as the validator sees it


class TreeEntry(NamedTuple):
    mode: str
    """``100644``, ``100755``, ``120000`` (symlink), ``160000`` (submodule), ``040000``."""
    oid: str


class Lookup(NamedTuple):
    entry: TreeEntry | None
    """The entry at the path, None when there is none."""
    blocker: tuple[str, TreeEntry] | None
    """The first ancestor that is not a folder (a file, symlink or submodule)."""


class BaselineTree(Protocol):
    """Read access to one baseline tree."""

    @property
    def object_format(self) -> str: ...

    def lookup(self, path: str) -> Lookup: ...

    def names(self, folder: str) -> Collection[str]:
        """Entry names of a folder (``""`` is the root); empty when it is not a folder."""
        ...

    def read(self, entry: TreeEntry) -> bytes: ...

    def prefetch(self, paths: Sequence[str]) -> None:
        """A hint that these paths may be looked up and read (they may be wrong: only what
        :meth:`lookup` then returns counts)."""
        ...

    def read_all(self, entries: Sequence[TreeEntry]) -> list[bytes]: ...


class IndexEntry(NamedTuple):
    mode: str
    oid: str
    path: str


class CheckOutcome(NamedTuple):
    ok: bool
    message: str
    numstat: list[tuple[str, int, int]]
    """(path, added, removed) per file as git read the diff (the new name of a rename)."""


PatchCheck = Callable[[bytes, Sequence[IndexEntry]], Callable[[], CheckOutcome]]
"""Starts a patch check of the diff on an index of the given baseline entries and returns
the function that waits for its outcome (the check may run while the caller works)."""


def _parents(path: str) -> list[str]:
    parts = path.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


class MemoryTree:
    """A baseline tree in memory (for tests and callers without git). ``files`` maps a path
    to its content (mode ``100644``) or to ``(mode, content)``; a symlink's content is its
    target."""

    def __init__(
        self, files: Mapping[str, bytes | tuple[str, bytes]], object_format: str = "sha1"
    ) -> None:
        self._format = object_format
        self._files: dict[str, TreeEntry] = {}
        self._blobs: dict[str, bytes] = {}
        self._folders: dict[str, list[str]] = {"": []}
        for path, value in sorted(files.items()):
            mode, data = value if isinstance(value, tuple) else (MODE_FILE, value)
            entry = TreeEntry(mode, diffs.blob_id(data, object_format))
            self._files[path] = entry
            self._blobs[entry.oid] = data
            parts = path.split("/")
            for i, name in enumerate(parts):
                siblings = self._folders.setdefault("/".join(parts[:i]), [])
                if name not in siblings:
                    siblings.append(name)

    @property
    def object_format(self) -> str:
        return self._format

    def lookup(self, path: str) -> Lookup:
        for parent in _parents(path):
            if parent in self._files:
                return Lookup(None, (parent, self._files[parent]))
            if parent not in self._folders:
                return Lookup(None, None)
        if path in self._files:
            return Lookup(self._files[path], None)
        if path in self._folders:
            return Lookup(TreeEntry(MODE_TREE, ""), None)
        return Lookup(None, None)

    def names(self, folder: str) -> Collection[str]:
        return self._folders.get(folder, [])

    def read(self, entry: TreeEntry) -> bytes:
        return self._blobs[entry.oid]

    def prefetch(self, paths: Sequence[str]) -> None:
        pass

    def read_all(self, entries: Sequence[TreeEntry]) -> list[bytes]:
        return [self._blobs[e.oid] for e in entries]


# ---------------------------------------------------------------------------------------
# Pure rules


def _reason(code: str, path: str | None, message: str) -> ChangesetReason:
    return ChangesetReason(code=code, path=path, message=message[:_MESSAGE_LIMIT])


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
    )
    return Prepared(changeset=changeset, changes=tuple(changes), diff=raw)


# ---------------------------------------------------------------------------------------
# Against the private git dir

_TREE_ENTRY = re.compile(rb"([0-7]{5,6}) ([^\x00]*)\x00", re.DOTALL)
_ARGV_BUDGET = 64 * 1024
_DIFF_GIT_A = "diff --git a/"


class GitTree:
    """A baseline tree read in the private git dir: the entries of known paths from one
    ``git ls-tree`` (:meth:`prefetch`), blobs from one ``git cat-file --batch`` per batch
    (:meth:`read_all`), and any other folder through an interactive ``git cat-file
    --batch`` started when first needed. Use as a context manager; :meth:`close` ends it."""

    def __init__(self, git_dir: Path, tree: str) -> None:
        self._tree = tree
        self._format = "sha256" if len(tree) == 64 else "sha1"
        self._oid_len = 32 if self._format == "sha256" else 20
        self._ctx = GitContext(cwd=git_dir.parent, git_dir=git_dir, home=git_dir.parent)
        self._folders: dict[str, dict[str, TreeEntry] | None] = {}
        self._entries: dict[str, TreeEntry] = {}
        self._fetched: dict[str, TreeEntry] = {}
        self._contents: dict[str, bytes] = {}
        self._prefetch: threading.Thread | None = None
        self._failure: BaseException | None = None
        self._proc: subprocess.Popen[bytes] | None = None

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
        if self._prefetch is not None:
            self._prefetch.join()
            self._prefetch = None
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.stdin is not None:
            try:
                proc.stdin.close()
            except OSError:
                pass
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()

    @property
    def object_format(self) -> str:
        return self._format

    def prefetch(self, paths: Sequence[str]) -> None:
        """Starts looking ``paths`` up on a thread: their entries from ``git ls-tree`` and
        the content of those that are blobs from ``git cat-file --batch``. Lookups wait for
        it; a path it did not find as a file, symlink or submodule is looked up folder by
        folder."""
        if self._prefetch is None and paths:
            self._prefetch = threading.Thread(target=self._fetch, args=(list(paths),))
            self._prefetch.start()

    def _fetch(self, paths: list[str]) -> None:
        try:
            wanted = set(paths)
            batch: list[str] = []
            size = 0
            for path in sorted(wanted):
                batch.append(path)
                size += len(path) + 1
                if size > _ARGV_BUDGET:
                    self._ls_tree(batch, wanted)
                    batch, size = [], 0
            if batch:
                self._ls_tree(batch, wanted)
            blobs = sorted({e for e in self._fetched.values() if e.mode in (MODE_FILE, MODE_EXEC)})
            self._contents.update(zip((e.oid for e in blobs), self._cat(blobs), strict=True))
        except BaseException as exc:  # re-raised by the thread that waits for it
            self._failure = exc

    def _wait(self) -> None:
        thread, self._prefetch = self._prefetch, None
        if thread is not None:
            thread.join()
            self._entries.update(self._fetched)
        if self._failure is not None:
            failure, self._failure = self._failure, None
            raise failure

    def _ls_tree(self, paths: list[str], wanted: set[str]) -> None:
        args = ["ls-tree", "-z", "--full-tree", self._tree, "--", *paths]
        out = _git_to_file(self._ctx, ["--literal-pathspecs", *args], b"")
        for record in out.split(b"\0"):
            meta, _, name = record.partition(b"\t")
            fields = meta.split(b" ")
            path = name.decode("utf-8", "surrogateescape")
            if len(fields) == 3 and path in wanted and fields[1] != b"tree":
                self._fetched[path] = TreeEntry(fields[0].decode(), fields[2].decode())

    def read_all(self, entries: Sequence[TreeEntry]) -> list[bytes]:
        """The contents of the blobs, in order (those not prefetched from one ``git cat-file
        --batch``)."""
        self._wait()
        missing = sorted({e for e in entries if e.oid not in self._contents})
        self._contents.update(zip((e.oid for e in missing), self._cat(missing), strict=True))
        return [self._contents[e.oid] for e in entries]

    def _cat(self, entries: Sequence[TreeEntry]) -> list[bytes]:
        if not entries:
            return []
        requests = b"".join(e.oid.encode() + b"\n" for e in entries)
        out, pos, blobs = _git_to_file(self._ctx, ["cat-file", "--batch"], requests), 0, []
        for entry in entries:
            end = out.find(b"\n", pos)
            header = out[pos:end].split() if end >= 0 else []
            if len(header) != 3 or header[1] != b"blob" or header[0] != entry.oid.encode():
                raise GitError(f"git cat-file: {entry.oid} is not a blob")
            size = int(header[2])
            blobs.append(out[end + 1 : end + 1 + size])
            pos = end + 2 + size
        return blobs

    def _process(self) -> subprocess.Popen[bytes]:
        if self._proc is None:
            self._proc = subprocess.Popen(
                git_argv("cat-file", "--batch"),
                cwd=self._ctx.cwd,
                env=self._ctx.env(),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
            )
        return self._proc

    def _object(self, oid: str, kind: str) -> bytes:
        proc = self._process()
        stdin, stdout = proc.stdin, proc.stdout
        if stdin is None or stdout is None:  # pragma: no cover - Popen contract
            raise GitError("git cat-file is not running")
        try:
            stdin.write(oid.encode() + b"\n")
            stdin.flush()
            header = stdout.readline().split()
            if len(header) != 3 or header[1] != kind.encode():
                raise GitError(f"git cat-file: {oid} is not a {kind}")
            size = int(header[2])
            data = _read_exactly(stdout, size + 1)
        except (OSError, ValueError) as exc:
            raise GitError("git cat-file failed") from exc
        return data[:size]

    def _folder(self, path: str) -> dict[str, TreeEntry] | None:
        if path in self._folders:
            return self._folders[path]
        if path:
            parent, _, name = path.rpartition("/")
            listing = self._folder(parent)
            entry = listing.get(name) if listing is not None else None
            oid = entry.oid if entry is not None and entry.mode == MODE_TREE else None
        else:
            oid = self._tree
        folder = None if oid is None else self._parse_tree(self._object(oid, "tree"))
        self._folders[path] = folder
        return folder

    def _parse_tree(self, raw: bytes) -> dict[str, TreeEntry]:
        out: dict[str, TreeEntry] = {}
        pos, n = 0, self._oid_len
        while pos < len(raw):
            m = _TREE_ENTRY.match(raw, pos)
            if m is None or m.end() + n > len(raw):
                raise GitError("git cat-file: a malformed tree object")
            mode = m.group(1).decode().rjust(6, "0")
            name = m.group(2).decode("utf-8", "surrogateescape")
            out[name] = TreeEntry(mode, raw[m.end() : m.end() + n].hex())
            pos = m.end() + n
        return out

    def lookup(self, path: str) -> Lookup:
        self._wait()
        known = self._entries.get(path)
        if known is not None:
            return Lookup(known, None)
        folder = ""
        for parent in _parents(path):
            listing = self._folder(folder)
            entry = listing.get(parent.rsplit("/", 1)[-1]) if listing is not None else None
            if entry is None:
                return Lookup(None, None)
            if entry.mode != MODE_TREE:
                return Lookup(None, (parent, entry))
            folder = parent
        listing = self._folder(folder)
        return Lookup(listing.get(path.rsplit("/", 1)[-1]) if listing else None, None)

    def names(self, folder: str) -> Collection[str]:
        listing = self._folder(folder)
        return listing.keys() if listing is not None else ()

    def read(self, entry: TreeEntry) -> bytes:
        self._wait()
        known = self._contents.get(entry.oid)
        return known if known is not None else self._object(entry.oid, "blob")


def _git_to_file(ctx: GitContext, args: list[str], stdin: bytes) -> bytes:
    """Runs git with its input and output in anonymous temp files: the calling thread only
    waits for the process (no pipe to serve while another thread holds the interpreter)."""
    with tempfile.TemporaryFile() as source, tempfile.TemporaryFile() as sink:
        source.write(stdin)
        source.seek(0)
        try:
            proc = subprocess.run(
                git_argv(*args),
                cwd=ctx.cwd,
                env=ctx.env(),
                stdin=source,
                stdout=sink,
                stderr=subprocess.DEVNULL,
                check=False,
                timeout=600,
            )
        except subprocess.TimeoutExpired as exc:
            raise GitError(f"git {_command(args)} did not finish") from exc
        if proc.returncode != 0:
            raise GitError(f"git {_command(args)} failed with exit {proc.returncode}")
        sink.seek(0)
        return sink.read()


def _command(args: Sequence[str]) -> str:
    return next((a for a in args if not a.startswith("-")), "")


def _read_exactly(stream: IO[bytes], size: int) -> bytes:
    data = stream.read(size)
    if data is None or len(data) != size:
        raise GitError("git cat-file ended early")
    return data


def _parse_numstat(out: bytes) -> list[tuple[str, int, int]]:
    """``git apply --numstat -z``: ``A\\tR\\tPATH\\0``, or ``A\\tR\\t\\0OLD\\0NEW\\0`` for a
    rename; binary files count ``-``."""
    fields = out.split(b"\0")
    stats: list[tuple[str, int, int]] = []
    i = 0
    while i < len(fields) and fields[i]:
        added, removed, name = fields[i].split(b"\t", 2)
        if not name:
            name = fields[i + 2]
            i += 2
        count = [int(v) if v.isdigit() else -1 for v in (added, removed)]
        stats.append((name.decode("utf-8", "surrogateescape"), count[0], count[1]))
        i += 1
    return stats


def git_patch_check(git_dir: Path) -> PatchCheck:
    """The patch check on the private git dir: a temporary index (in a controller-owned
    folder) holding the baseline entries of the touched paths, then ``git apply --check
    --cached --numstat`` of the diff on it. Nothing of the user's repository is written."""

    def start(diff: bytes, entries: Sequence[IndexEntry]) -> Callable[[], CheckOutcome]:
        scratch = owned_temp_dir("check-")
        ctx = GitContext(cwd=scratch, git_dir=git_dir, index_file=scratch / "index", home=scratch)
        try:
            if entries:
                lines = b"".join(
                    f"{e.mode} blob {e.oid}\t{e.path}".encode("utf-8", "surrogateescape") + b"\0"
                    for e in entries
                )
                run_git(ctx, "update-index", "-z", "--index-info", stdin=lines)
            proc = subprocess.Popen(
                git_argv(
                    "apply",
                    "--check",
                    "--cached",
                    "--numstat",
                    "-z",
                    "-p1",
                    "--whitespace=nowarn",
                    "-",
                ),
                cwd=ctx.cwd,
                env=ctx.env(),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
        except BaseException:
            shutil.rmtree(scratch, ignore_errors=True)
            raise
        feeder = _Feeder(proc, diff)

        def finish() -> CheckOutcome:
            try:
                out, err = feeder.wait()
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
            if proc.returncode != 0:
                lines = err.decode("utf-8", "replace").strip().splitlines()
                detail = printable(lines[0] if lines else f"exit {proc.returncode}")
                return CheckOutcome(ok=False, message=f"git apply --check: {detail}", numstat=[])
            return CheckOutcome(ok=True, message="", numstat=_parse_numstat(out))

        return finish

    return start


def printable(text: str) -> str:
    """A line of git's output made safe to show: control characters dropped, bounded."""
    return "".join(ch for ch in text if ch.isprintable())[:_MESSAGE_LIMIT]


class _Feeder:
    """Writes the diff to a child's stdin on a thread and collects its output."""

    def __init__(self, proc: subprocess.Popen[bytes], data: bytes) -> None:
        self._proc = proc
        self._out = b""
        self._err = b""
        self._thread = threading.Thread(target=self._run, args=(data,), daemon=True)
        self._thread.start()

    def _run(self, data: bytes) -> None:
        try:
            self._out, self._err = self._proc.communicate(data, timeout=600)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._out, self._err = self._proc.communicate()

    def wait(self) -> tuple[bytes, bytes]:
        self._thread.join()
        return self._out, self._err


def prepare_changeset(
    baseline: Baseline,
    diff: str | bytes,
    *,
    allowed_paths: Sequence[str] | None = None,
    extra_protected: Sequence[str] = (),
    limits: ChangesetLimits | None = None,
) -> Prepared:
    """:func:`check_diff` on the job's baseline tree in the private git dir, with the git
    patch check. Raises :class:`ChangesetInvalidError`, or ``GitError`` when git fails."""
    git_dir = Path(baseline.private_git_dir)
    with GitTree(git_dir, baseline.tree) as tree:
        return check_diff(
            diff,
            tree,
            allowed_paths=allowed_paths,
            extra_protected=extra_protected,
            limits=limits,
            patch_check=git_patch_check(git_dir),
            baseline_tree=baseline.tree,
        )


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
