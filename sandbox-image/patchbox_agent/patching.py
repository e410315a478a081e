"""Exact application of parsed diffs to file contents, all or nothing.

No I/O: file contents are ``bytes`` given by a ``read`` callable, and the result is the new
content of every touched path. Every hunk must match exactly at its stated position: no
offset search, no fuzz. :mod:`patchbox_agent.diffs` exports the public names and lists the
reason codes (``missing``, ``exists``, ``context_mismatch``, ``index_mismatch``,
``path_conflict``, ``line_ending``, and ``not_text`` for a file's content).

Pure and standard-library only (python >= 3.9), like the parser and the name rules.
"""

from __future__ import annotations

import hashlib

from .names import check_collisions, fold, touched_paths
from .patch import DiffError, FilePatch, Hunk

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence


def lines_before(start: int, length: int) -> int:
    """How many lines of the file precede the hunk on that side."""
    return start - 1 if length else start


def blob_id(data: bytes, object_format: str = "sha1") -> str:
    """Git's blob id of ``data`` (``sha1`` or ``sha256`` object format)."""
    header = b"blob %d\x00" % len(data)
    return hashlib.new(object_format, header + data, usedforsecurity=False).hexdigest()


def _text_lines(data: bytes, path: str) -> tuple[list[str], bool]:
    """The lines of a file without their newlines, and whether it ends with one. They are
    compared and joined as text: UTF-8 maps strings one to one onto valid byte strings, and
    a newline byte is never part of another character, so the lines are those of the bytes."""
    if b"\x00" in data:
        raise DiffError("not_text", f"{path} is binary")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise DiffError("not_text", f"{path} is not UTF-8 text") from None
    if not text:
        return [], True
    lines = text.split("\n")
    if text.endswith("\n"):
        lines.pop()
        return lines, True
    return lines, False


def _side(hunk: Hunk, skip: str) -> list[str]:
    return [text for op, text in hunk.lines if op != skip]


def _check_hunk(hunk: Hunk, lines: list[str], eol: bool, where: str) -> bool:
    """Checks that the hunk matches exactly at its position; returns whether it reaches the
    end of the file."""
    pos = lines_before(hunk.old_start, hunk.old_len)
    end = pos + hunk.old_len
    at_end = end == len(lines)
    if end > len(lines) or lines[pos:end] != _side(hunk, "+"):
        raise DiffError("context_mismatch", f"{where} does not match at its position")
    if (hunk.old_no_eol or hunk.new_no_eol) and not at_end:
        raise DiffError("context_mismatch", f"{where}: no-newline marker before the end")
    if at_end and lines and eol == hunk.old_no_eol:
        raise DiffError("context_mismatch", f"{where}: newline at end of file differs")
    return at_end


def patch_bytes(data: bytes, hunks: Sequence[Hunk], path: str = "file") -> bytes:
    """Applies the hunks of one file at exactly their stated positions."""
    lines, eol = _text_lines(data, path)
    out: list[str] = []
    cursor = 0
    for number, hunk in enumerate(hunks, 1):
        pos = lines_before(hunk.old_start, hunk.old_len)
        if pos < cursor:
            raise DiffError("bad_hunk", f"{path} hunk {number} out of order")
        if _check_hunk(hunk, lines, eol, f"{path} hunk {number}"):
            eol = not hunk.new_no_eol
        out.extend(lines[cursor:pos])
        out.extend(_side(hunk, "-"))
        cursor = pos + hunk.old_len
    out.extend(lines[cursor:])
    if not out:
        return b""
    return ("\n".join(out) + ("\n" if eol else "")).encode("utf-8")


def _check_blob(expected: str | None, data: bytes, path: str, object_format: str) -> None:
    if expected is not None and not blob_id(data, object_format).startswith(expected):
        raise DiffError("index_mismatch", f"{path} does not match the index line")


def _old_content(patch: FilePatch, read: Callable[[str], bytes | None]) -> bytes:
    if patch.kind == "create":
        if read(patch.path) is not None:
            raise DiffError("exists", f"{patch.path} already exists")
        return b""
    old_path = patch.old_path or patch.path
    data = read(old_path)
    if data is None:
        raise DiffError("missing", f"{old_path} does not exist")
    if patch.kind == "rename" and read(patch.path) is not None:
        raise DiffError("exists", f"{patch.path} already exists")
    return data


def _added_lines(patch: FilePatch) -> list[str]:
    """The added lines that end in a newline (a last line marked ``\\ No newline`` has no
    line ending to check)."""
    out: list[str] = []
    for hunk in patch.hunks:
        added = [text for op, text in hunk.lines if op == "+"]
        if hunk.new_no_eol and hunk.lines and hunk.lines[-1][0] == "+":
            added.pop()
        out += added
    return out


def _check_endings(patch: FilePatch, old: bytes) -> None:
    """Added lines end the way the file's lines do: CR LF only where the file has CR LF
    lines, LF only where it has LF lines (a file with neither, such as a new one, takes
    either, but not both). A canonical git diff of a CR LF file has a CR at the end of
    every line, so it passes; a diff whose lines a mail client or editor wrapped in CR LF
    does not patch an LF file into mixed endings."""
    added = _added_lines(patch)
    crlf = sum(1 for text in added if text.endswith("\r"))
    if not added or patch.kind == "delete":
        return
    lines = old.count(b"\n")
    old_crlf = old.count(b"\r\n")
    has_crlf, has_lf = old_crlf > 0, lines > old_crlf
    if not has_crlf and not has_lf:
        if 0 < crlf < len(added):
            raise DiffError("line_ending", f"{patch.path}: added lines end in CR LF and in LF")
        return
    if crlf and not has_crlf:
        raise DiffError("line_ending", f"{patch.path}: added lines end in CR LF, the file's in LF")
    if crlf < len(added) and not has_lf:
        raise DiffError("line_ending", f"{patch.path}: added lines end in LF, the file's in CR LF")


def _apply_one(
    patch: FilePatch,
    read: Callable[[str], bytes | None],
    check_index: bool,
    object_format: str,
    same_endings: bool = False,
) -> dict[str, bytes | None]:
    old = _old_content(patch, read)
    new = patch_bytes(old, patch.hunks, patch.path)
    if same_endings:  # after the exact match: a context line in CR LF is a context_mismatch
        _check_endings(patch, old)
    if check_index:
        _check_blob(patch.index_old, old, patch.old_path or patch.path, object_format)
        _check_blob(patch.index_new, new, patch.path, object_format)
    if patch.kind == "delete":
        if new:
            raise DiffError("context_mismatch", f"{patch.path} has more than the hunks remove")
        return {patch.path: None}
    if patch.kind == "rename" and patch.old_path is not None:
        return {patch.old_path: None, patch.path: new}
    return {patch.path: new}


def _check_tree(patches: Sequence[FilePatch], tree_paths: Iterable[str]) -> set[str]:
    """Untouched baseline paths (folded); a created name may not fold onto one of them."""
    touched = {name for patch in patches for name in touched_paths(patch)}
    untouched = {fold(p): p for p in tree_paths if p not in touched}
    for patch in patches:
        other = untouched.get(fold(patch.path))
        if patch.kind not in ("create", "rename") or other is None:
            continue
        if other == patch.path:
            raise DiffError("exists", f"{patch.path} already exists")
        raise DiffError("case_collision", f"{patch.path} collides with {other}")
    return set(untouched)


def _check_layout(files: set[str], created: set[str]) -> None:
    """No created file where a directory is needed, or the reverse (names folded)."""
    for key in created:
        parts = key.split("/")
        if any("/".join(parts[:n]) in files for n in range(1, len(parts))):
            raise DiffError("path_conflict", "a file stands where a directory is needed")
    dirs = tuple(key + "/" for key in created)
    if dirs and any(key.startswith(dirs) for key in files):
        raise DiffError("path_conflict", "a created file stands where a directory is")


def apply(  # noqa: PLR0913 - the patches, their reader and keyword-only options
    patches: Iterable[FilePatch],
    read: Callable[[str], bytes | None],
    *,
    tree_paths: Iterable[str] | None = None,
    check_index: bool = True,
    object_format: str = "sha1",
    same_endings: bool = False,
) -> dict[str, bytes | None]:
    """New content per touched path (None = deleted), all or nothing. ``read(path)`` gives
    the current bytes or None. ``tree_paths``, when given, lists the baseline's files for
    case-collision and file/directory checks. ``check_index`` checks the ``index`` line's
    blob ids against the old and new content. ``same_endings`` refuses added lines whose
    ending (CR LF or LF) the file does not use (``line_ending``): the rule for a patch a
    model sends, where mixed endings are a mangled diff; a change set made from the files
    themselves (a check may rewrite endings) is taken as it is."""
    items = list(patches)
    check_collisions(items)
    result: dict[str, bytes | None] = {}
    for patch in items:
        result.update(_apply_one(patch, read, check_index, object_format, same_endings))
    remaining = set() if tree_paths is None else _check_tree(items, tree_paths)
    created = {fold(p.path) for p in items if p.kind in ("create", "rename")}
    _check_layout(remaining | {fold(p) for p, data in result.items() if data is not None}, created)
    return result
