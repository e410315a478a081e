"""The one set of name rules of a diff: how a name is unquoted, checked and compared.

The agent's ``apply_patch``, the controller's check of a call's patch and its validation of
the final change set all call :func:`check_path` (through :func:`patchbox_agent.diffs.parse`),
so they refuse the same names for the same reason; the reason codes are listed in
:mod:`patchbox_agent.diffs`, which also exports this module's public names. Names are
C-unquoted before they are checked, and compared after Unicode NFC and case folding
(``.git`` also after NFKC, so ``\uff0egit`` is ``.git``).

Pure and standard-library only (python >= 3.9), like the parser and the applier.
"""

from __future__ import annotations

import functools
import re
import unicodedata

from .jail import escape_name  # one spelling of a name in messages, the agent's too
from .patch import DiffError, FilePatch

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable

MAX_PATH_BYTES = 4096
MAX_COMPONENTS = 128


_ESCAPES = {"a": 7, "b": 8, "t": 9, "n": 10, "v": 11, "f": 12, "r": 13, '"': 34, "\\": 92}
_OCTAL = "01234567"
_PERCENT_RE = re.compile(r"%[0-9A-Fa-f]{2}")
_BAD_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
_ASCII_CONTROL = re.compile("[\x00-\x1f\x7f]")
# Look-alikes of "/" and "." that NFKC leaves alone (those it maps to "/", "." or "\\", such
# as the fullwidth forms and the one dot leader, are found through NFKC).
_SLASH_LOOKALIKES = frozenset(
    "\u2215\u2044\u29f8\u29f5\u29f9\u2216\u2571\u2572\u27cb\u27cd\u1735\u3033\u2cc6\u2f03"
)
_DOT_LOOKALIKES = frozenset("\u3002\uff61\u06d4\u0701\u0702\ua4f8\u2e3c\u0589\u2e33")
_ASCII_PUNCT = frozenset("./\\")


def fold(name: str) -> str:
    """The comparison key of a name: Unicode NFC and case folding."""
    if name.isascii():  # NFC leaves ASCII alone, and it folds to lower case
        return name.lower()
    return unicodedata.normalize("NFC", unicodedata.normalize("NFC", name).casefold())


def _unescape(text: str, i: int, end: int) -> tuple[int, int]:
    """The byte of the escape after the backslash at ``i - 1`` and the index after it."""
    ch = text[i]
    if ch in _ESCAPES:
        return _ESCAPES[ch], i + 1
    digits = text[i : i + 3]
    if i + 3 <= end and ch in "0123" and all(d in _OCTAL for d in digits):
        return int(digits, 8), i + 3
    raise DiffError("bad_quote", "invalid escape in a quoted name")


def unquote(text: str) -> str:
    """Git's C-style quoted name (``"a/\\303\\251"``) to a str; the whole text must be one
    quoted string whose bytes are UTF-8."""
    if len(text) < 2 or text[0] != '"' or text[-1] != '"':
        raise DiffError("bad_quote", "not a quoted name")
    out = bytearray()
    i, end = 1, len(text) - 1
    while i < end:
        ch = text[i]
        if ch == '"':
            raise DiffError("bad_quote", "unescaped quote in a quoted name")
        if ch != "\\":
            out += ch.encode("utf-8")
            i += 1
            continue
        if i + 1 >= end:
            raise DiffError("bad_quote", "dangling backslash in a quoted name")
        byte, i = _unescape(text, i + 1, end)
        out.append(byte)
    try:
        return out.decode("utf-8")
    except UnicodeDecodeError:
        name = escape_name(bytes(out))
        raise DiffError("not_text", f"a quoted name is not UTF-8: {name[:200]}") from None


def _quoted_end(text: str) -> int:
    """The index after the closing quote of the quoted string that starts ``text``."""
    i = 1
    while i < len(text):
        if text[i] == "\\":
            i += 2
            continue
        if text[i] == '"':
            return i + 1
        i += 1
    raise DiffError("bad_quote", "unterminated quoted name")


def _check_chars(path: str) -> None:
    if "\x00" in path:
        raise DiffError("nul", "NUL in a path")
    if path.isascii():  # the only ASCII characters of those categories are the C0 and DEL
        bad = _ASCII_CONTROL.search(path) is not None
    else:
        bad = any(unicodedata.category(ch) in _BAD_CATEGORIES for ch in path)
    if bad:
        raise DiffError("control_char", "control character in a path")
    if "\\" in path:
        raise DiffError("backslash", "backslash in a path")
    if path.startswith("/"):
        raise DiffError("absolute_path", "absolute path")
    if _PERCENT_RE.search(path):
        raise DiffError("percent_escape", "percent-escape in a path")
    if len(path.encode("utf-8")) > MAX_PATH_BYTES:
        raise DiffError("bad_path", "path too long")
    if path.count("/") >= MAX_COMPONENTS:
        raise DiffError("bad_path", f"more than {MAX_COMPONENTS} components in a path")


def _is_git_dir(part: str) -> bool:
    """Whether a component names ``.git`` to git or to some file system: after NFKC (so
    fullwidth and small dots and letters count) and case folding, and with the trailing dots
    and spaces Windows drops, or as its 8.3 short name."""
    if part.isascii():  # NFKC leaves ASCII alone, and it folds to lower case
        key = part.lower()
    else:
        key = unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", part).casefold())
    return key.rstrip(". ") == ".git" or key == "git~1"


def _lookalike(ch: str) -> bool:
    if ch in _SLASH_LOOKALIKES or ch in _DOT_LOOKALIKES:
        return True
    return ch not in _ASCII_PUNCT and bool(_ASCII_PUNCT & set(unicodedata.normalize("NFKC", ch)))


def check_path(path: str) -> None:
    """Refuses a name that is not a plain relative path inside the tree, or touches ``.git``.

    The checks run in a fixed order and the first failing one names the reason: characters
    of the whole path (``nul``, ``control_char``, ``backslash``, ``absolute_path``,
    ``percent_escape``, ``bad_path`` for the length), then per component ``dotdot``,
    ``bad_path``, ``git_dir``, ``lookalike``, ``trailing_dot_space``."""
    _check_path(path)


@functools.lru_cache(maxsize=1024)
def _check_path(path: str) -> None:
    """:func:`check_path`; a name that passes is remembered (a diff names most files four
    times), one that fails is checked again each time, so it raises the same error."""
    if not path:
        raise DiffError("bad_path", "empty path")
    _check_chars(path)
    for part in path.split("/"):
        if part == "..":
            raise DiffError("dotdot", "'..' component in a path")
        if part in ("", "."):
            raise DiffError("bad_path", "empty or '.' component in a path")
        if _is_git_dir(part):
            raise DiffError("git_dir", "path inside .git")
        if not part.isascii() and any(_lookalike(ch) for ch in part):
            raise DiffError("lookalike", "a look-alike of '.', '/' or '\\' in a name")
        if part.endswith((".", " ")):
            raise DiffError("trailing_dot_space", "a name ends in a dot or a space")


def label(value: str, prefix: str, lineno: int) -> str | None:
    """The path of a ``---``/``+++`` label (None for /dev/null); git appends a tab to a
    label that contains a space."""
    if value.endswith("\t"):
        value = value[:-1]
        if " " not in value:
            raise DiffError("bad_header", f"tab after a file name on line {lineno}")
    if value == "/dev/null":
        return None
    name = unquote(value) if value.startswith('"') else value
    if name.startswith("/"):
        check_path(name)  # refused as an absolute path, not as a missing prefix
    if not name.startswith(prefix):
        raise DiffError("header_mismatch", f"file name without '{prefix}' on line {lineno}")
    name = name[len(prefix) :]
    check_path(name)
    return name


def plain_name(value: str) -> str:
    name = unquote(value) if value.startswith('"') else value
    check_path(name)
    return name


def _git_line_sides(rest: str, lineno: int) -> tuple[str, str] | None:
    """The two names of a ``diff --git`` line when quoting makes the split unambiguous;
    None when both are unquoted (they then contain no quote, since git would quote it)."""
    if rest.startswith('"'):
        end = _quoted_end(rest)
        first, tail = unquote(rest[:end]), rest[end:]
    elif '"' in rest:
        q = rest.index('"')
        first, tail = rest[: q - 1], rest[q - 1 :]
    else:
        return None
    if not tail.startswith(" "):
        raise DiffError("bad_header", f"malformed diff --git line {lineno}")
    second = tail[1:]
    return first, unquote(second) if second.startswith('"') else second


def git_line_names(rest: str, expected: tuple[str, str] | None, lineno: int) -> tuple[str, str]:
    """The (old, new) names of a ``diff --git a/P b/Q`` line, which must equal ``expected``
    when other headers name the files, and must name one file twice otherwise."""
    sides = _git_line_sides(rest, lineno)
    if sides is None and expected is not None:
        if rest != f"a/{expected[0]} b/{expected[1]}":
            raise DiffError("header_mismatch", f"diff --git names disagree on line {lineno}")
        return expected
    if sides is None:
        half = (len(rest) - 5) // 2
        sides = (rest[: half + 2], rest[half + 3 :])
        if rest != f"{sides[0]} {sides[1]}" or sides[0][2:] != sides[1][2:]:
            raise DiffError("header_mismatch", f"diff --git names disagree on line {lineno}")
    first, second = sides
    if not (first.startswith("a/") and second.startswith("b/")):
        if first.startswith("/") or second.startswith("/"):
            raise DiffError("absolute_path", f"absolute path on line {lineno}")
        raise DiffError("header_mismatch", f"diff --git names lack a/ b/ on line {lineno}")
    names = (first[2:], second[2:])
    if expected is not None and names != expected:
        raise DiffError("header_mismatch", f"diff --git names disagree on line {lineno}")
    return names


def touched_paths(patch: FilePatch) -> list[str]:
    return sorted({p for p in (patch.old_path, patch.new_path) if p is not None})


def check_collisions(patches: Iterable[FilePatch]) -> None:
    """No path in two sections, and no two different names that fold to one."""
    seen: dict[str, str] = {}
    for patch in patches:
        local: dict[str, str] = {}
        for name in touched_paths(patch):
            if local.setdefault(fold(name), name) != name:
                raise DiffError("case_collision", f"{name!r} collides with another name")
        for key, name in local.items():
            other = seen.get(key)
            if other == name:
                raise DiffError("duplicate_file", f"{name!r} in two sections")
            if other is not None:
                raise DiffError("case_collision", f"{name!r} collides with {other!r}")
        seen.update(local)
