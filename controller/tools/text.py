"""Making untrusted text safe to show or store: the one rule for control characters.

Everything that came from the sandbox, the model or a provider and is then shown (CLI
output, ``run --json``, ``show``, error messages, logs) or stored (the job record, the
evidence, the JUnit XML) passes :func:`strip_control`, directly or through
:class:`controller.logs.Scrubber`. See docs/architecture.md.
"""

from __future__ import annotations

import re

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


def strip_control(text: str) -> str:
    """Removes terminal escape sequences, every C0/C1 control character but newline and tab,
    and every bidirectional formatting character; ``\\r\\n`` becomes ``\\n``. Idempotent."""
    text = text.replace("\r\n", "\n")
    text = _OSC.sub("", text)
    text = _CSI.sub("", text)
    text = _ESC.sub("", text)
    return _CONTROL.sub("", text)
