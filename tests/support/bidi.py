"""Helpers of tests/unit/jobs/test_bidi.py and tests/docker/jobs/test_bidi.py."""

from __future__ import annotations

ALL_BIDI = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
"""Every bidi control: ALM, LRM, RLM, LRE, RLE, PDF, LRO, RLO, LRI, RLI, FSI, PDI."""


def no_bidi(text: str) -> bool:
    return not any(ch in text for ch in ALL_BIDI)
