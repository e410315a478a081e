"""The traditional unified diff (what ``diff -u`` writes, and ``patch -p1`` and ``git apply``
take) turned into the canonical git form, so that one strict parser judges both.

A traditional diff is a list of file sections, each a ``--- OLD`` line, a ``+++ NEW`` line
and its ``@@`` hunks, with no ``diff --git`` line. A name is ``/dev/null`` (a created or a
deleted file), or a path, with ``a/`` and ``b/`` taken as prefixes when every name of the
section carries its own (``--- a/x`` and ``+++ b/x``; ``--- x`` and ``+++ x`` are taken as
they are); what follows a tab on a name line (a timestamp) is dropped. Each section becomes
``diff --git a/OLD b/NEW``, a ``new file mode 100644`` or ``deleted file mode`` line where a
side is ``/dev/null``, the two name lines with their prefixes, and the hunks unchanged.

Nothing is checked here that :func:`patchbox_agent.diffs.parse` checks: names that disagree,
paths with ``..``, absolute paths, ``.git``, malformed hunks all reach the parser as they were
written and are refused there for the same reason as in a git diff. This module only finds
where each section ends (by the hunks' counts, so a removed line ``--- x`` inside a hunk is
not taken for a new section) and refuses text that is no section at all.

Pure and standard-library only (python >= 3.9).
"""

from __future__ import annotations

import re

from .hunks import DIFF_GIT, leftover, no_cr
from .names import unquote
from .patch import MODE_FILE, DiffError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Optional

_HUNK_RE = re.compile(r"@@ -[0-9]{1,9}(?:,([0-9]{1,9}))? \+[0-9]{1,9}(?:,([0-9]{1,9}))? @@.*")
_NULL = "/dev/null"


def is_traditional(text: str) -> bool:
    """True for a diff that starts with a ``---`` line (a git diff starts with ``diff --git``)."""
    return text.startswith("--- ")


def canonical(text: str, mode_of: Optional[Callable[[str], Optional[str]]] = None) -> str:
    """``text`` in the canonical git form when it is a traditional unified diff, else
    ``text`` unchanged. ``mode_of(path)`` is the mode (``100644``/``100755``) of a file a
    section deletes, stated on its ``deleted file mode`` line (100644 when not given or
    None). Raises :class:`DiffError` for text that is not a list of sections."""
    if not is_traditional(text):
        return text
    if not text.endswith("\n"):
        raise DiffError("truncated", "the diff does not end with a newline")
    lines = text.split("\n")
    lines.pop()
    out: list[str] = []
    i = 0
    while i < len(lines):
        i = _section(lines, i, out, mode_of)
    return "\n".join(out) + "\n"


def _name(value: str, lineno: int) -> Optional[str]:
    """The name of a ``---``/``+++`` line's value: None for /dev/null, unquoted, without
    what follows a tab."""
    no_cr(value, lineno)
    value = value.split("\t", 1)[0]
    if value == _NULL:
        return None
    return unquote(value) if value.startswith('"') else value


def _quoted(name: str) -> str:
    """``name`` as git writes it on a header line: C-quoted when it holds a quote, a
    backslash or a control character (the parser refuses the last two anyway)."""
    if not any(ch in '"\\' or ord(ch) < 0x20 or ord(ch) == 0x7F for ch in name):
        return name
    body = "".join(
        "\\" + ch
        if ch in '"\\'
        else "".join(f"\\{b:03o}" for b in ch.encode("utf-8", "surrogatepass"))
        if ord(ch) < 0x20 or ord(ch) == 0x7F
        else ch
        for ch in name
    )
    return f'"{body}"'


def _side(prefix: str, name: Optional[str]) -> str:
    return _NULL if name is None else _quoted(prefix + name)


def _section(
    lines: list[str], i: int, out: list[str], mode_of: Optional[Callable[[str], Optional[str]]]
) -> int:
    """Converts the section at ``lines[i]`` into ``out``; returns the index after it."""
    if not lines[i].startswith("--- "):
        if lines[i].startswith(DIFF_GIT):
            raise DiffError("garbage", f"a 'diff --git' section after '---' ones on line {i + 1}")
        raise leftover(lines[i], i + 1)
    if i + 1 >= len(lines) or not lines[i + 1].startswith("+++ "):
        raise DiffError("bad_header", f"'---' without '+++' on line {i + 1}")
    old, new = _name(lines[i][4:], i + 1), _name(lines[i + 1][4:], i + 2)
    named = [n for n in (old, new) if n is not None]
    if not named:
        raise DiffError("header_mismatch", f"'---' and '+++' both /dev/null on line {i + 1}")
    if (old is None or old.startswith("a/")) and (new is None or new.startswith("b/")) and named:
        old = None if old is None else old[2:]
        new = None if new is None else new[2:]
    first, second = old if old is not None else new, new if new is not None else old
    out.append(f"diff --git {_quoted('a/' + (first or ''))} {_quoted('b/' + (second or ''))}")
    if old is None:
        out.append(f"new file mode {MODE_FILE}")
    elif new is None:
        mode = mode_of(old) if mode_of is not None else None
        out.append(f"deleted file mode {mode or MODE_FILE}")
    out.append(f"--- {_side('a/', old)}")
    out.append(f"+++ {_side('b/', new)}")
    i += 2
    if i >= len(lines) or not lines[i].startswith("@@"):
        raise DiffError("bad_hunk", f"file names without hunks on line {i - 1}")
    while i < len(lines) and lines[i].startswith("@@"):
        i = _hunk(lines, i, out)
    return i


def _hunk(lines: list[str], i: int, out: list[str]) -> int:
    """Copies the hunk at ``lines[i]`` (its header's counts of lines, with their ``\\``
    markers) into ``out``; returns the index after it. A line the counts do not allow ends
    the hunk, and the rest of the text is copied as it is: the parser then says what is
    wrong with that line."""
    m = _HUNK_RE.fullmatch(lines[i])
    if m is None:
        raise DiffError("bad_hunk", f"malformed hunk header on line {i + 1}")
    old_left = 1 if m.group(1) is None else int(m.group(1))
    new_left = 1 if m.group(2) is None else int(m.group(2))
    out.append(lines[i])
    i += 1
    while i < len(lines) and (old_left or new_left):
        op = lines[i][:1]
        if op == " " and old_left and new_left:
            old_left, new_left = old_left - 1, new_left - 1
        elif op == "-" and old_left:
            old_left -= 1
        elif op == "+" and new_left:
            new_left -= 1
        elif op != "\\":
            out.extend(lines[i:])
            return len(lines)
        out.append(lines[i])
        i += 1
    if i < len(lines) and lines[i].startswith("\\"):
        out.append(lines[i])
        i += 1
    return i
