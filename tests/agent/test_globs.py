"""Which folders an operator glob protects whole: those whose every path below matches, so
the folder's own name is refused too and its existence never shows."""

from __future__ import annotations

import pytest

from patchbox_agent.globs import Glob


@pytest.mark.parametrize(
    ("pattern", "folder", "covered"),
    [
        ("secrets/**", "secrets", True),
        ("secrets/**", "secrets/sub", True),
        ("secrets/**", "secretsx", False),
        ("secrets/**", "x/secrets", False),  # anchored at the top: x/secrets/a is allowed
        ("**/secrets/**", "x/secrets", True),
        ("deep/*/keys/**", "deep/a/keys", True),
        ("deep/*/keys/**", "deep/a", False),
        ("deep/*/keys/**", "deep", False),
        ("*.pem", "certs", False),  # only some files below: the folder is not protected
        ("secrets/*", "secrets", False),  # secrets/a/b is not matched
        ("**", "anything", True),
        ("a/**/b/**", "a/x/y/b", True),
        ("a/**/b/**", "a/x", False),
    ],
)
def test_covers_below(pattern: str, folder: str, covered: bool) -> None:
    glob = Glob(pattern)
    assert glob.covers_below(folder) is covered
    if covered:  # the property it stands for: every path below matches
        for below in ("f", "d/f", "x.pem", ".hidden/deeper/z"):
            assert glob(f"{folder}/{below}")
