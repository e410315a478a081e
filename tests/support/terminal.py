"""Helpers of tests/unit/cli/test_terminal.py and tests/docker/cli/test_terminal.py."""

from __future__ import annotations

import os
import subprocess
import sys
import unicodedata

from controller.text import escape
from tests.support.paths import REPO_ROOT

ROOT = REPO_ROOT

ATTACKS = {
    "erase line": ("\x1b[2K", "\\x1b[2K"),
    "cursor up": ("\x1b[1A", "\\x1b[1A"),
    "carriage return": ("\r", "\\x0d"),
    "OSC 0 title": ("\x1b]0;pwned\x07", "\\x1b]0;pwned\\x07"),
    "OSC 52 clipboard": ("\x1b]52;c;cm0gLXJmIH4=\x07", "\\x1b]52;c;cm0gLXJmIH4=\\x07"),
    "clear screen": ("\x1b[2J", "\\x1b[2J"),
    "right-to-left override": ("\u202e", "\\u202e"),
    "C1 CSI": ("\x9b31m", "\\x9b31m"),
    "OSC with ST": ("\x1b]8;;http://x\x1b\\", "\\x1b]8;;http://x\\x1b\\"),
    "DEL and NUL": ("\x7f\x00", "\\x7f\\x00"),
    "line separator": ("\u2028", "\\u2028"),
    "zero width space": ("\u200b", "\\u200b"),
    "byte order mark": ("\ufeff", "\\ufeff"),
    "not UTF-8 (surrogateescape)": ("\udc9b", "\\udc9b"),
    "tag character": ("\U000e0041", "\\U000e0041"),
    "Hangul filler": ("\u3164", "\\u3164"),
}
SHOWN_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})


def is_safe(text: str) -> bool:
    """No character a terminal acts on or hides (by the Unicode database, not by the rule
    under test): only newline and tab of the controls."""
    return not any(unicodedata.category(ch) in SHOWN_CATEGORIES and ch not in "\n\t" for ch in text)


def terminal_safe(raw: bytes) -> str:
    """``raw`` as UTF-8 (it must be) after checking it holds no ESC, C0 (but newline and
    tab), DEL, C1 or bidi control; the text."""
    assert not any(b < 0x20 and b not in b"\n\t" for b in raw), raw[:400]
    assert b"\x7f" not in raw
    text = raw.decode("utf-8")  # strict: a lone surrogate could not have been written
    assert is_safe(text), [escape(ch) for ch in text if not is_safe(ch)]
    return text


def raw_patchbox(
    *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[bytes]:
    """``python3 -m controller ARGS`` with the output as bytes (text mode would turn a
    carriage return into a newline)."""
    return subprocess.run(
        [sys.executable, "-m", "controller", *args],
        capture_output=True,
        env={**os.environ, **(env or {})},
        cwd=ROOT,
        timeout=300,
        check=False,
    )
