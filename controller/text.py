"""Making untrusted output safe to show: ANSI/OSC sequences and control characters removed."""

from __future__ import annotations

import re

_OSC = re.compile(r"\x1b\][^\x07\x1b]{0,4096}(?:\x07|\x1b\\)?")
_CSI = re.compile(r"(?:\x1b\[|\x9b)[0-?]{0,64}[ -/]{0,16}[@-~]?")
_ESC = re.compile(r"\x1b[ -/]{0,8}[0-~]?")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def strip_control(text: str) -> str:
    """Removes terminal escape sequences and every control character but newline and tab."""
    text = text.replace("\r\n", "\n")
    text = _OSC.sub("", text)
    text = _CSI.sub("", text)
    text = _ESC.sub("", text)
    return _CONTROL.sub("", text)
