"""Making untrusted text safe to show or store: the rules for control characters.

Everything that came from the sandbox, the model or a provider and is then stored (the job
record, the evidence, the JUnit XML) or shown in a message (``run --json``, ``show``, error
messages, logs) passes :func:`strip_control`, directly or through
:class:`controller.logs.Scrubber`. Text the CLI prints to a terminal passes :func:`visible`
last: what must stay exact (a diff) keeps its characters, and each control, format or
bidirectional character in it is shown as an escape instead of reaching the terminal.
See docs/architecture.md.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping

_OSC = re.compile(r"\x1b\][^\x07\x1b]{0,4096}(?:\x07|\x1b\\)?")
_CSI = re.compile(r"(?:\x1b\[|\x9b)[0-?]{0,64}[ -/]{0,16}[@-~]?")
_ESC = re.compile(r"\x1b[ -/]{0,8}[0-~]?")

BIDI_CONTROLS = (
    "\u061c"  # ARABIC LETTER MARK
    "\u200e\u200f"  # LEFT-TO-RIGHT and RIGHT-TO-LEFT MARK
    "\u202a\u202b\u202c\u202d\u202e"  # embeddings, pop, overrides (LRE RLE PDF LRO RLO)
    "\u2066\u2067\u2068\u2069"  # isolates (LRI RLI FSI PDI)
)
"""The Unicode bidirectional formatting characters. Shown text that holds them can read in
another order than it is (the "Trojan Source" trick), so they go with the C0/C1 controls."""

_CONTROL = re.compile(f"[\\x00-\\x08\\x0b-\\x1f\\x7f-\\x9f{BIDI_CONTROLS}]")
_ASCII_CONTROL = bytes([*range(0x09), *range(0x0B, 0x20), 0x7F])
"""The ASCII characters of :data:`_CONTROL` (carriage return and ESC among them)."""


def strip_control(text: str) -> str:
    """Removes terminal escape sequences, every C0/C1 control character but newline and tab,
    and every bidirectional formatting character; ``\\r\\n`` becomes ``\\n``. Idempotent."""
    if text.isascii():  # the common case, a tool's result among it: one pass in C
        raw = text.encode("ascii")
        if len(raw.translate(None, _ASCII_CONTROL)) == len(raw):
            return text
    text = text.replace("\r\n", "\n")
    text = _OSC.sub("", text)
    text = _CSI.sub("", text)
    text = _ESC.sub("", text)
    return _CONTROL.sub("", text)


_BMP_HIDDEN = (
    "\x00-\x08\x0b-\x1f\x7f-\x9f"  # C0 but tab and newline, DEL, C1
    "\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2"  # format (Cf)
    "\u115f\u1160\u180e\u200b-\u200f"  # Hangul fillers, Mongolian separator, zero widths, marks
    "\u2028-\u202e\u2060-\u2064\u2066-\u206f"  # separators, bidi, invisible operators
    "\u3164\ud800-\udfff\ufeff\uffa0\ufff9-\ufffb"  # filler, surrogates, BOM, annotation
)
HIDDEN = re.compile(
    f"[{_BMP_HIDDEN}"
    "\U000110bd\U000110cd\U00013430-\U0001343f\U0001bca0-\U0001bca3"
    "\U0001d173-\U0001d17a\U000e0001\U000e0020-\U000e007f"  # ..., tags
    "]"
)
"""Every character a terminal must not get as it is: the Unicode categories Cc (but tab and
newline), Cf (bidirectional controls, zero-width and other invisible format characters, tag
characters), Cs (lone surrogates: bytes that were not UTF-8, kept by ``surrogateescape``),
Zl and Zp, as the path rule of :mod:`patchbox_agent.names` counts them (with the format
controls Unicode 15 adds, U+13439-U+1343F), plus the Hangul fillers (letters that print as
blank space). ESC, CSI (``\\x9b``), OSC and every other
escape sequence start with one of them."""

_ASCII_HIDDEN = re.compile("[\x00-\x08\x0b-\x1f\x7f]")
_CANDIDATE = re.compile(f"[{_BMP_HIDDEN}\U00010000-\U0010ffff]")
"""What is looked at: :data:`HIDDEN` in ASCII text, and beyond it the characters of
:data:`HIDDEN`'s class in the Basic Multilingual Plane and every character above it, each
of those checked on its own (a class with the few ranges above the plane makes the scan of
every character several times slower)."""


def _scan(text: str) -> Iterator[str]:
    """The :data:`HIDDEN` characters of ``text``, in order."""
    if text.isascii():
        yield from _ASCII_HIDDEN.findall(text)
        return
    for found in _CANDIDATE.finditer(text):
        ch = found.group()
        if ch < "\U00010000" or HIDDEN.match(ch):
            yield ch


def has_hidden(text: str) -> bool:
    """Whether ``text`` holds a :data:`HIDDEN` character."""
    return next(_scan(text), None) is not None


def escape(ch: str) -> str:
    """``ch`` written as its code point: ``\\xNN`` below U+0100, ``\\uNNNN`` in the Basic
    Multilingual Plane, ``\\UNNNNNNNN`` above (as a Python string literal writes it)."""
    code = ord(ch)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def visible(text: str) -> str:
    """``text`` safe to print to a terminal, with nothing removed: every :data:`HIDDEN`
    character is replaced by its :func:`escape` (ESC ``[2K`` prints as ``\\x1b[2K``,
    U+202E as ``\\u202e``, a carriage return as ``\\x0d``); newline, tab and all other
    text stay."""
    if text.isascii():
        return _ASCII_HIDDEN.sub(lambda m: escape(m.group()), text)
    return _CANDIDATE.sub(lambda m: _shown(m.group()), text)


def _shown(ch: str) -> str:
    return escape(ch) if ch < "\U00010000" or HIDDEN.match(ch) else ch


def hidden_characters(text: str) -> list[str]:
    """The distinct :data:`HIDDEN` characters in ``text``, each as its :func:`escape`, in
    the order they first occur."""
    return list(dict.fromkeys(escape(ch) for ch in _scan(text)))


def flag_text(flags: Iterable[Mapping[str, object]]) -> list[str]:
    """The lines ``show`` prints for a diff's flagged lines (``{"path", "line",
    "characters"}`` each, as the job view holds them); none when there are none."""
    listed = []
    for flag in flags:
        chars = flag.get("characters")
        shown = " ".join(str(c) for c in chars) if isinstance(chars, list) else ""
        listed.append(f"  {flag.get('path')}:{flag.get('line')}: {shown}")
    if not listed:
        return []
    head = (
        f"warning: {len(listed)} added line(s) hold control, format or bidi characters, "
        "shown in the diff as \\xNN or \\uNNNN escapes:"
    )
    return [head, *listed]
