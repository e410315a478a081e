"""Hiding a change from the agent's change detection.

A check runs repository code as the agent's own uid. Everything the agent's ignore filter
reads must therefore be out of that uid's reach (a read-only git dir of the image, no git
config or excludes file in a writable place, only the baseline's ``.gitignore`` files), no
name may be hidden just because it looks like the agent's temp files, and on the host the
ledger is reconciled with the changes both ways, so a file an edit reported that vanished
from the changes fails the job by name.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from patchbox_agent import ignore
from tests.support.git import git, git_env

# -- the exclude file the agent hands git equals git's own reading of .gitignore files -----

_DIRS = ["", "a", "a/b", "c", "a/b/d", "sp ace", "br[ack]et", "st*r", "a/fo", "c/build", "x/b"]
_NAMES = ["x.log", "keep.log", "bar.o", "keep.txt", "z", "#hash", "trailing ", "foo"]
_PATTERNS = [
    "*.log", "!keep.log", "/foo", "foo/", "b/", "**/bar.o", "a/**", "*.o", "build/",
    "!*.txt", "x*", "\\#hash", "trailing\\ ", "trailing  ", "d/foo", "/b/", "**/d", "# c",
    "", "\r", "[fk]oo", "*", "!foo", "b/**/z", "!b/", "d", "/*", "!/a", "**", "z\r",
    "*/foo", "foo/**", "!**/keep*", "\\!x", "a/b/", "!d/", "/", "b/d/**", "!b/d/x.log",
    "**/b/", "!**/b/", "?.log", "[!k]*.log", "c/*", "!c/build/", "*/", "x.lo[g]", "\\*",
    "/sp ace/", "st\\*r/",
]  # fmt: skip
_GIT_ENV = git_env() | {"GIT_LITERAL_PATHSPECS": "1"}


def _ignored(git_dir: Path, work: Path, *args: str) -> set[str]:
    listing = ("ls-files", "-z", "-o", "-i", *args)
    out = git(Path("/"), f"--git-dir={git_dir}", f"--work-tree={work}", *listing, env=_GIT_ENV)
    return {p for p in out.split("\0") if p}


@pytest.mark.parametrize("seed", range(40))
def test_rewritten_patterns_ignore_exactly_what_git_ignores(tmp_path: Path, seed: int) -> None:
    """Random trees and .gitignore files (BOM, CR, comments, escapes, negations, anchors,
    folder-only rules, odd folder names): the one exclude file ignores the same files as
    git reading the .gitignore files itself, over the whole tree and by pathspec."""
    rnd = random.Random(seed)  # noqa: S311 - reproducible test data, not a secret
    work, git_dir = tmp_path / "w", tmp_path / "g"
    git(Path("/"), "init", "-q", "--bare", "--template=", str(git_dir), env=_GIT_ENV)
    rules: dict[str, bytes] = {}
    for d in _DIRS:
        (work / d).mkdir(parents=True, exist_ok=True)
        for name in rnd.sample(_NAMES, 5):
            (work / d / name).touch()
    for d in _DIRS:
        if rnd.random() < 0.5:
            lines = rnd.sample(_PATTERNS, rnd.randint(1, 5))
            data = ("\n".join(lines) + ("\n" if rnd.random() < 0.7 else "")).encode()
            data = b"\xef\xbb\xbf" + data if rnd.random() < 0.2 else data
            (work / d / ".gitignore").write_bytes(data)
            rules[d] = data
    native = _ignored(git_dir, work, "--exclude-standard")
    excludes = tmp_path / "excludes"
    excludes.write_bytes(ignore.patterns(rules))
    ours = _ignored(git_dir, work, f"--exclude-from={excludes}") if rules else set()
    assert ours == native
    if rules:  # the same asked of a few paths, as a refresh does
        every = sorted(_ignored(git_dir, work, "--exclude=*"))
        sample = rnd.sample(every, min(8, len(every)))
        by_path = _ignored(git_dir, work, f"--exclude-from={excludes}", "--", *sample)
        assert by_path == native & set(sample)
