"""Strict parser and exact applier for canonical git unified diffs.

Pure and standard-library only (python >= 3.9): used by the in-container agent for
``apply_patch`` and by the host controller to validate the final change set. No I/O: the
diff is a ``str``, file contents are ``bytes`` given by a ``read`` callable.

This module holds the parser of sections and headers, and exports the whole family: the
data it builds lives in :mod:`patchbox_agent.patch`, the hunk grammar in
:mod:`patchbox_agent.hunks`, the name rules in :mod:`patchbox_agent.names` and the applier
in :mod:`patchbox_agent.patching`; callers import their public names from here. The list of
reason codes below is its contract.

``parse(text)`` returns one ``FilePatch`` per ``diff --git`` section or raises
``DiffError(reason, message)``; ``parse_patch(text)`` (what a model's ``apply_patch`` goes
through) also takes a traditional unified diff, turned into that form first
(:mod:`patchbox_agent.unified`) and then held to the same rules. ``apply(patches, read)``
returns the new content of every touched path (``None`` = deleted), all or nothing; by
default it also checks the ``index`` line's blob ids against the old and new content.
``stats(patches)`` counts lines.
``check_path``, ``unquote``, ``fold`` and ``blob_id`` are the building blocks, public for
callers that check names or contents themselves.

The name rules are the only ones: the agent's ``apply_patch``, the controller's check
of a call's patch and its validation of the final change set all call :func:`check_path`
(through :func:`parse`), so they refuse the same names for the same reason.

It does not rely on ``git apply`` for anything (docs/architecture.md, "apply_patch"): no
leading or trailing text, no offset search or fuzz, the ``diff --git``, ``---``/``+++`` and
``rename from/to`` names must agree, names are C-unquoted before they are checked, and
compared after Unicode NFC and case folding (``.git`` also after NFKC, so ``\uff0egit`` is
``.git``). It only knows ``.git``: other protected paths (``protected.py``),
``allowed_paths``, the files' current modes and the baseline's list of paths are the
caller's to check (``apply`` takes ``tree_paths`` for case collisions with untouched files).

Reason codes (``DiffError.reason``), a closed set (``REASONS``):

- text: ``empty`` (no sections, or a section that changes nothing), ``too_large``,
  ``too_many_files``, ``not_text`` (not UTF-8: the diff, a quoted name, or a file's content),
  ``nul`` (NUL anywhere), ``truncated`` (no newline at the end of the diff text);
- outside a file section: ``garbage`` (prose, a plain ``---`` diff given to ``parse``,
  trailing lines),
  ``fence`` (markdown fences), ``begin_patch`` (``*** Begin Patch`` style wrappers);
- headers: ``bad_header`` (malformed or repeated extended header, ``index`` line, mode
  lines without each other), ``header_mismatch`` (names or ``/dev/null`` that disagree),
  ``crlf_header`` (CR at the end of a header, hunk header or marker line), ``bad_quote``
  (invalid C-quoting);
- names: ``absolute_path``, ``dotdot``, ``bad_path`` (empty, ``.`` or empty component, too
  long, more than 128 components), ``backslash``, ``control_char`` (C0/C1 controls, DEL,
  format characters such as zero-width ones, line separators), ``percent_escape`` (``%2e``
  style), ``git_dir`` (a component folding to ``.git`` under NFKC and case folding, also
  ``.git.``/``.git ``/``git~1``), ``lookalike`` (a Unicode look-alike of ``.``, ``/`` or
  ``\\``: fullwidth, one dot leader, division slash, ideographic full stop, ...),
  ``trailing_dot_space`` (a component ending in a dot or a space, which other file systems
  drop), ``duplicate_file`` (two sections for one path), ``case_collision`` (two different
  names that fold to one);
- content kinds: ``binary``, ``symlink_mode`` (120000), ``gitlink`` (160000), ``bad_mode``
  (any other mode but 100644/100755), ``mode_change`` (``old mode``/``new mode`` that do not
  toggle 100644 <-> 100755), ``copy`` (``copy from/to``), ``dissimilarity`` (rewrites);
- hunks: ``bad_hunk`` (malformed header, out of order or overlapping, inconsistent new
  position, misplaced marker, a line that is not `` ``/``-``/``+``/``\\``),
  ``hunk_count_mismatch`` (fewer or more lines than the header counts);
- apply: ``missing`` (a modified, deleted or renamed file does not exist), ``exists`` (a
  created file or rename target exists), ``context_mismatch`` (a hunk does not match at its
  stated position, or a deleted file has more than the hunks remove), ``index_mismatch``
  (the ``index`` line's blob ids differ from the old or new content), ``path_conflict``
  (a file where the result needs a directory, or the reverse), ``line_ending`` (with
  ``same_endings``: an added line ending in CR LF where the file has only LF endings, or
  the reverse; a created file with both).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TypedDict

from .hunks import DIFF_GIT, leftover, no_cr, read_hunks, stray
from .names import (
    MAX_COMPONENTS,
    MAX_PATH_BYTES,
    check_collisions,
    check_path,
    fold,
    git_line_names,
    label,
    plain_name,
    unquote,
)
from .patch import MODE_EXEC, MODE_FILE, DiffError, FilePatch, Hunk, Kind
from .patching import apply, blob_id, patch_bytes
from .unified import canonical, is_traditional

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Optional

__all__ = [
    "MAX_BYTES",
    "MAX_COMPONENTS",
    "MAX_FILES",
    "MAX_PATH_BYTES",
    "MODE_EXEC",
    "MODE_FILE",
    "REASONS",
    "DiffError",
    "FilePatch",
    "FileStats",
    "Hunk",
    "Kind",
    "apply",
    "blob_id",
    "canonical",
    "check_collisions",
    "check_path",
    "fold",
    "parse",
    "parse_patch",
    "patch_bytes",
    "stats",
    "unquote",
]

MAX_BYTES = 8 * 1024 * 1024
MAX_FILES = 200

# Grouped as in the module docstring.
REASONS = frozenset(
    {
        *("empty", "too_large", "too_many_files", "not_text", "nul", "truncated"),
        *("garbage", "fence", "begin_patch"),
        *("bad_header", "header_mismatch", "crlf_header", "bad_quote"),
        *("absolute_path", "dotdot", "bad_path", "backslash", "control_char"),
        *("percent_escape", "git_dir", "lookalike", "trailing_dot_space"),
        *("duplicate_file", "case_collision"),
        *("binary", "symlink_mode", "gitlink", "bad_mode", "mode_change", "copy"),
        *("dissimilarity", "bad_hunk", "hunk_count_mismatch"),
        *("missing", "exists", "context_mismatch", "index_mismatch", "path_conflict"),
        "line_ending",
    }
)


class FileStats(TypedDict):
    path: str
    old_path: str | None
    kind: str
    added: int
    removed: int


# ---------------------------------------------------------------------------------------
# text and sections


_NEW_SECTION = "\n" + DIFF_GIT
_INDEX_RE = re.compile(r"([0-9a-f]{4,64})\.\.([0-9a-f]{4,64})(?: ([0-9]{6}))?")
_SIMILARITY_RE = re.compile(r"([0-9]{1,3})%")
_HEADERS = (
    ("old mode ", "old_mode"),
    ("new mode ", "new_mode"),
    ("new file mode ", "created"),
    ("deleted file mode ", "deleted"),
    ("similarity index ", "similarity"),
    ("rename from ", "rename_from"),
    ("rename to ", "rename_to"),
    ("index ", "index"),
)
_REFUSED_HEADERS = (
    ("copy from ", "copy"),
    ("copy to ", "copy"),
    ("dissimilarity index ", "dissimilarity"),
    ("GIT binary patch", "binary"),
    ("Binary files ", "binary"),
)


def _check_text(text: str, max_bytes: int) -> None:
    if len(text) > max_bytes:
        raise DiffError("too_large", f"diff over {max_bytes} bytes")
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise DiffError("not_text", "diff is not valid UTF-8 text") from None
    if size > max_bytes:
        raise DiffError("too_large", f"diff over {max_bytes} bytes")
    if not text.strip():
        raise DiffError("empty", "empty diff")
    if "\x00" in text:
        raise DiffError("nul", "NUL in the diff")


def _section_starts(text: str) -> list[int]:
    """Indexes of the lines (``text.split("\\n")``) that start with ``diff --git ``."""
    starts = [0] if text.startswith(DIFF_GIT) else []
    line, counted = 0, 0
    pos = text.find(_NEW_SECTION)
    while pos >= 0:
        line += text.count("\n", counted, pos + 1)
        counted = pos + 1
        starts.append(line)
        pos = text.find(_NEW_SECTION, counted)
    return starts


def _sections(text: str, lines: list[str], max_files: int) -> list[tuple[int, int]]:
    """(start, end) line indexes of the file sections; nothing may precede the first."""
    starts = _section_starts(text)
    first = starts[0] if starts else len(lines)
    for i in range(first):
        error = stray(lines[i], i + 1)
        if error.reason != "garbage":
            raise error
    if first:
        raise DiffError("garbage", "text before the first 'diff --git' line")
    if len(starts) > max_files:
        raise DiffError("too_many_files", f"more than {max_files} files")
    ends = [*starts[1:], len(lines)]
    return [(start, ends[k]) for k, start in enumerate(starts)]


# ---------------------------------------------------------------------------------------
# file sections


@dataclass
class _Head:
    lineno: int
    rest: str
    fields: dict[str, str] = field(default_factory=dict)
    labelled: bool = False
    minus: str | None = None
    plus: str | None = None


def _read_headers(sec: list[str], base: int) -> tuple[_Head, int]:
    no_cr(sec[0], base)
    head = _Head(base, sec[0][len(DIFF_GIT) :])
    i = 1
    while i < len(sec) and not sec[i].startswith(("--- ", "@@")):
        line, lineno = sec[i], base + i
        no_cr(line, lineno)
        for prefix, reason in _REFUSED_HEADERS:
            if line.startswith(prefix):
                raise DiffError(reason, f"refused header on line {lineno}")
        known = next(((p, k) for p, k in _HEADERS if line.startswith(p)), None)
        if known is None:
            raise stray(line, lineno)
        if known[1] in head.fields:
            raise DiffError("bad_header", f"repeated header on line {lineno}")
        head.fields[known[1]] = line[len(known[0]) :]
        i += 1
    if i < len(sec) and sec[i].startswith("--- "):
        i = _read_labels(sec, i, base, head)
    return head, i


def _read_labels(sec: list[str], i: int, base: int, head: _Head) -> int:
    no_cr(sec[i], base + i)
    if i + 1 >= len(sec) or not sec[i + 1].startswith("+++ "):
        raise DiffError("bad_header", f"'---' without '+++' on line {base + i}")
    no_cr(sec[i + 1], base + i + 1)
    head.labelled = True
    head.minus = label(sec[i][4:], "a/", base + i)
    head.plus = label(sec[i + 1][4:], "b/", base + i + 1)
    if i + 2 >= len(sec) or not sec[i + 2].startswith("@@"):
        raise DiffError("bad_hunk", f"file names without hunks on line {base + i}")
    return i + 2


def _kind(fields: dict[str, str], lineno: int) -> Kind:
    flags = ("created" in fields, "deleted" in fields, "rename_from" in fields)
    if ("rename_from" in fields) != ("rename_to" in fields):
        raise DiffError("bad_header", f"rename from/to without the other in section {lineno}")
    if sum(flags) > 1:
        raise DiffError("bad_header", f"conflicting headers in section {lineno}")
    if "similarity" in fields and not flags[2]:
        raise DiffError("bad_header", f"similarity index without rename in section {lineno}")
    if flags[0]:
        return "create"
    if flags[1]:
        return "delete"
    return "rename" if flags[2] else "modify"


def _check_mode(mode: str, lineno: int) -> str:
    if mode == "120000":
        raise DiffError("symlink_mode", f"symlink mode in section {lineno}")
    if mode == "160000":
        raise DiffError("gitlink", f"gitlink (submodule) mode in section {lineno}")
    if mode not in (MODE_FILE, MODE_EXEC):
        raise DiffError("bad_mode", f"mode other than {MODE_FILE}/{MODE_EXEC} in {lineno}")
    return mode


def _index(
    fields: dict[str, str], kind: Kind, lineno: int
) -> tuple[str | None, str | None, str | None]:
    """(old blob, new blob, mode) of the ``index`` line, None where absent or all zeros."""
    value = fields.get("index")
    if value is None:
        return None, None, None
    m = _INDEX_RE.fullmatch(value)
    if m is None:
        raise DiffError("bad_header", f"malformed index line in section {lineno}")
    old, new, mode = m.groups()
    old_zero, new_zero = not old.strip("0"), not new.strip("0")
    if old_zero != (kind == "create") or new_zero != (kind == "delete"):
        raise DiffError("header_mismatch", f"index line disagrees in section {lineno}")
    if mode is not None:
        _check_mode(mode, lineno)
    return (None if old_zero else old), (None if new_zero else new), mode


def _modes(
    fields: dict[str, str], kind: Kind, index_mode: str | None, lineno: int
) -> tuple[str | None, str | None]:
    for key in ("old_mode", "new_mode", "created", "deleted"):
        if key in fields:
            _check_mode(fields[key], lineno)
    old, new = fields.get("old_mode"), fields.get("new_mode")
    if old is None and new is None:
        given = fields.get("created") or fields.get("deleted") or index_mode
        if given is not None and index_mode not in (None, given):
            raise DiffError("header_mismatch", f"index mode disagrees in section {lineno}")
        return (None if kind == "create" else given), (None if kind == "delete" else given)
    if old is None or new is None or index_mode is not None or kind in ("create", "delete"):
        raise DiffError("bad_header", f"misplaced mode lines in section {lineno}")
    if old == new:
        raise DiffError("mode_change", f"not a 100644/100755 toggle in section {lineno}")
    return old, new


def _similarity(fields: dict[str, str], lineno: int) -> int | None:
    value = fields.get("similarity")
    if value is None:
        return None
    m = _SIMILARITY_RE.fullmatch(value)
    if m is None or int(m.group(1)) > 100:
        raise DiffError("bad_header", f"malformed similarity index in section {lineno}")
    return int(m.group(1))


def _label_name(head: _Head, kind: Kind) -> str:
    """The one file name of a labelled non-rename section."""
    minus, plus = head.minus, head.plus
    if kind == "create":
        if minus is not None or plus is None:
            raise DiffError("header_mismatch", f"created file not from /dev/null, {head.lineno}")
        return plus
    if kind == "delete":
        if plus is not None or minus is None:
            raise DiffError("header_mismatch", f"deleted file not to /dev/null, {head.lineno}")
        return minus
    if minus is None or plus is None or minus != plus:
        raise DiffError("header_mismatch", f"'---'/'+++' names disagree in {head.lineno}")
    return minus


def _names(head: _Head, kind: Kind) -> tuple[str | None, str | None]:
    expected: tuple[str, str] | None = None
    if kind == "rename":
        expected = (
            plain_name(head.fields["rename_from"]),
            plain_name(head.fields["rename_to"]),
        )
        if head.labelled and (head.minus, head.plus) != expected:
            raise DiffError("header_mismatch", f"rename names disagree in {head.lineno}")
        if expected[0] == expected[1]:
            raise DiffError("bad_header", f"rename to the same name in {head.lineno}")
    elif head.labelled:
        name = _label_name(head, kind)
        expected = (name, name)
    old, new = git_line_names(head.rest, expected, head.lineno)
    check_path(old)
    check_path(new)
    if kind != "rename" and old != new:
        raise DiffError("header_mismatch", f"diff --git names differ in {head.lineno}")
    return (None if kind == "create" else old), (None if kind == "delete" else new)


def _check_shape(patch: FilePatch, lineno: int) -> None:
    hunks = patch.hunks
    if patch.kind == "create" and hunks and (len(hunks) > 1 or hunks[0].old_len):
        raise DiffError("bad_hunk", f"created file with old lines in section {lineno}")
    if patch.kind == "delete" and hunks and (len(hunks) > 1 or hunks[0].new_len):
        raise DiffError("bad_hunk", f"deleted file with new lines in section {lineno}")
    if patch.kind == "delete" and hunks and hunks[0].old_start != 1:
        raise DiffError("bad_hunk", f"deleted file not from line 1 in section {lineno}")
    if patch.kind == "modify" and not hunks and patch.old_mode == patch.new_mode:
        raise DiffError("empty", f"section {lineno} changes nothing")


def _parse_section(sec: list[str], base: int) -> FilePatch:
    head, i = _read_headers(sec, base)
    hunks, i = read_hunks(sec, i, base)
    if i < len(sec):
        raise leftover(sec[i], base + i)
    if hunks and not head.labelled:
        raise DiffError("bad_header", f"hunks without '---'/'+++' lines in section {base}")
    kind = _kind(head.fields, base)
    old_path, new_path = _names(head, kind)
    index_old, index_new, index_mode = _index(head.fields, kind, base)
    old_mode, new_mode = _modes(head.fields, kind, index_mode, base)
    patch = FilePatch(
        old_path=old_path,
        new_path=new_path,
        kind=kind,
        old_mode=old_mode,
        new_mode=new_mode,
        index_old=index_old,
        index_new=index_new,
        hunks=tuple(hunks),
        similarity=_similarity(head.fields, base),
    )
    _check_shape(patch, base)
    return patch


def parse(text: str, *, max_files: int = MAX_FILES, max_bytes: int = MAX_BYTES) -> list[FilePatch]:
    """Parses a canonical git diff; raises DiffError for anything else."""
    _check_text(text, max_bytes)
    lines = text.split("\n")
    truncated = lines[-1] != ""
    if not truncated:
        lines.pop()
    sections = _sections(text, lines, max_files)
    if truncated:
        raise DiffError("truncated", "the diff does not end with a newline")
    patches = [_parse_section(lines[start:end], start + 1) for start, end in sections]
    check_collisions(patches)
    return patches


def parse_patch(
    text: str,
    mode_of: Optional[Callable[[str], Optional[str]]] = None,
    *,
    max_files: int = MAX_FILES,
    max_bytes: int = MAX_BYTES,
) -> list[FilePatch]:
    """A patch a model sent: a canonical git diff, or a traditional unified diff (``---``,
    ``+++`` and ``@@`` with no ``diff --git`` line) turned into one first
    (:func:`patchbox_agent.unified.canonical`, ``mode_of`` as there); then :func:`parse`
    with every rule. The line numbers of an error in a converted diff count its git form."""
    if not is_traditional(text):
        return parse(text, max_files=max_files, max_bytes=max_bytes)
    _check_text(text, max_bytes)
    converted = canonical(text, mode_of)
    try:
        return parse(converted, max_files=max_files, max_bytes=max_bytes)
    except DiffError as exc:
        if " line " not in exc.message:
            raise
        note = " (line numbers count the diff in git form: 'diff --git' and mode lines added)"
        raise DiffError(exc.reason, exc.message + note) from exc


def stats(patches: Iterable[FilePatch]) -> list[FileStats]:
    """Per file: path (the new one for a rename), old_path (renames only), kind, added and
    removed lines."""
    return [
        FileStats(
            path=p.path,
            old_path=p.old_path if p.kind == "rename" else None,
            kind=p.kind,
            added=p.added,
            removed=p.removed,
        )
        for p in patches
    ]
