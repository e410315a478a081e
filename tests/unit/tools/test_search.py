"""list_files / search_text on the real agent (over pipes and in a container)."""

from __future__ import annotations

import time

import pytest

from patchbox_agent.globs import Glob, GlobError


@pytest.mark.parametrize(
    ("pattern", "path", "expected"),
    [
        ("*.py", "a.py", True),
        ("*.py", "deep/er/a.py", True),
        ("src/*.py", "src/x/a.py", False),
        ("src/**/*.py", "src/a.py", True),
        ("src/**/*.py", "src/x/y/a.py", True),
        ("a?c", "a/c", False),
        ("[!ab].txt", "c.txt", True),
        ("[a-c].txt", "d.txt", False),
        ("docs/*", "docs/a/b", False),
    ],
)
def test_glob_semantics(pattern: str, path: str, expected: bool) -> None:
    assert Glob(pattern)(path) is expected


def test_hostile_globs_are_bounded() -> None:
    hostile = Glob("*" * 250 + "b")
    started = time.monotonic()
    assert hostile("a" * 4000) is False
    assert time.monotonic() - started < 2
    for bad in ("", "x" * 513, "[abc"):
        with pytest.raises(GlobError):
            Glob(bad)
