"""Glob matching in linear-bounded time: O(len(pattern) * len(path)), whatever the pattern.

``*`` matches within one path component, ``**`` across components (``**/`` also matches
nothing), ``?`` one character other than ``/``, ``[abc]`` / ``[a-z]`` / ``[!a]`` one
character of a class. A pattern without ``/`` matches the file name at any depth (as in
``.gitignore``). Everything else is literal. No regular expressions are built, so no
pattern can backtrack catastrophically.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import List, Tuple, Union

    # A token: a literal character, "*", "**", "?", or a class (negated, ranges).
    Token = Union[str, Tuple[bool, Tuple[Tuple[str, str], ...]]]

MAX_PATTERN = 512


class GlobError(ValueError):
    pass


def _parse_class(pattern: str, i: int) -> tuple[Token, int]:
    j = i + 1
    negate = j < len(pattern) and pattern[j] in "!^"
    if negate:
        j += 1
    ranges: list[tuple[str, str]] = []
    first = True
    while j < len(pattern) and (pattern[j] != "]" or first):
        first = False
        lo = pattern[j]
        if j + 2 < len(pattern) and pattern[j + 1] == "-" and pattern[j + 2] != "]":
            ranges.append((lo, pattern[j + 2]))
            j += 3
        else:
            ranges.append((lo, lo))
            j += 1
    if j >= len(pattern):
        raise GlobError("unclosed [ in glob")
    return (negate, tuple(ranges)), j + 1


def compile_glob(pattern: str) -> list[Token]:
    if not 0 < len(pattern) <= MAX_PATTERN:
        raise GlobError("glob must have 1 to 512 characters")
    if "/" not in pattern.rstrip("/"):
        pattern = "**/" + pattern
    tokens: list[Token] = []
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if pattern.startswith("**/", i):
            tokens.append("**/")
            i += 3
        elif pattern.startswith("**", i):
            tokens.append("**")
            i += 2
        elif ch == "[":
            tok, i = _parse_class(pattern, i)
            tokens.append(tok)
        else:
            tokens.append(ch)
            i += 1
    return tokens


def _one(tok: Token, ch: str) -> bool:
    if isinstance(tok, tuple):
        negate, ranges = tok
        hit = any(lo <= ch <= hi for lo, hi in ranges)
        return ch != "/" and hit != negate
    if tok == "?":
        return ch != "/"
    return tok == ch


class Glob:
    """A compiled glob with a cheap literal-suffix pre-check before the full match."""

    def __init__(self, pattern: str) -> None:
        self.tokens = compile_glob(pattern)
        tail: list[str] = []
        for tok in reversed(self.tokens):
            if not isinstance(tok, str) or tok in ("*", "**", "**/", "?"):
                break
            tail.append(tok)
        self.suffix = "".join(reversed(tail))

    def __call__(self, path: str) -> bool:
        return path.endswith(self.suffix) and match(self.tokens, path)

    def covers_below(self, path: str) -> bool:
        """Whether the pattern matches every path below the folder ``path`` (``secrets/**``
        for ``secrets``): then the folder holds nothing but protected paths, and its own
        name is as protected as they are."""
        return covers_below(self.tokens, path + "/")


def _step(tok: Token, reach: List[bool], path: str) -> List[bool]:
    """Positions reachable after ``tok``, given the positions reachable before it."""
    n = len(path)
    nxt = [False] * (n + 1)
    if tok == "*":
        for k in range(n + 1):
            nxt[k] = reach[k] or (k > 0 and nxt[k - 1] and path[k - 1] != "/")
    elif tok == "**":
        for k in range(n + 1):
            nxt[k] = reach[k] or (k > 0 and nxt[k - 1])
    elif tok == "**/":
        # nothing, or any run of characters that ends with "/"
        seen = False
        for k in range(n + 1):
            nxt[k] = reach[k] or (seen and path[k - 1] == "/")
            seen = seen or reach[k]
    else:
        for k in range(1, n + 1):
            nxt[k] = reach[k - 1] and _one(tok, path[k - 1])
    return nxt


def match(tokens: List[Token], path: str) -> bool:
    """Whether ``path`` matches: a dynamic programme over (token, position), so the cost is
    at most len(tokens) * len(path) steps."""
    reach = [False] * (len(path) + 1)
    reach[0] = True
    for tok in tokens:
        reach = _step(tok, reach, path)
        if not any(reach):
            return False
    return reach[-1]


def covers_below(tokens: List[Token], prefix: str) -> bool:
    """Whether ``tokens`` match ``prefix`` followed by anything at all: the first ``i``
    tokens match ``prefix`` exactly, and the rest are ``**`` only, or (none left) the
    ``i``-th was a ``**`` that goes on matching whatever follows."""
    end = len(prefix)
    reach = [False] * (end + 1)
    reach[0] = True
    for i in range(len(tokens) + 1):
        rest = tokens[i:]
        if reach[end] and all(t == "**" for t in rest) and (rest or tokens[i - 1] == "**"):
            return True
        if i == len(tokens):
            return False
        reach = _step(tokens[i], reach, prefix)
        if not any(reach):
            return False
    return False
