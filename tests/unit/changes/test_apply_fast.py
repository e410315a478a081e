"""The short cuts that make an apply fast give the answers of the long way.

- The parser's one-step reading of a hunk (``diffs._whole_run``) against the line-by-line
  reading, on the same diffs and on many broken copies of them: same patches, or the same
  reason and message.
- The ASCII short cuts of the name rules against the Unicode tables, for every character.
- The index written in Python against ``git update-index --index-info`` (sha1 and sha256).
- The prefetch from the folders' tree objects against lookups folder by folder.
- The patch check started early is used only for the entries the rules ask for.
- The persistent I/O threads raise the first error after every job ran.
"""

from __future__ import annotations

import random
import threading
import unicodedata
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from controller.changes import validate, worktree
from controller.changes.gittree import GitTree, index_file
from controller.changes.tree import CheckOutcome, IndexEntry, TreeEntry
from patchbox_agent import diffs, hunks, names
from tests.support.git import git, init, make_diff

BEFORE = {
    "a.txt": b"".join(b"line %d\n" % i for i in range(40)),
    "b.txt": b"one\ntwo\nthree",
    "c.txt": b"x\r\ny\r\nz\r\n",
    "gone.txt": b"bye\nnow\n",
    "old.py": b"keep = 1\nmore = 2\n",
}
AFTER = {
    "a.txt": b"".join(b"LINE %d\n" % i if i % 7 == 0 else b"line %d\n" % i for i in range(41)),
    "b.txt": b"one\nTWO\nthree\nfour",
    "c.txt": b"x\r\nY\r\nz\r\n",
    "new.py": b"keep = 1\nmore = 2\nnew = 3\n",
    "fresh.txt": b"no newline",
}


def _outcome(text: str) -> object:
    try:
        return diffs.parse(text)
    except diffs.DiffError as exc:
        return (exc.reason, exc.message)


def _line_by_line(text: str, monkeypatch: pytest.MonkeyPatch) -> object:
    with monkeypatch.context() as m:
        m.setattr(hunks, "_whole_run", lambda *_: None)
        return _outcome(text)


def _mutants(text: str, rng: random.Random, count: int) -> list[str]:
    lines = text.split("\n")
    hunk_lines = [i for i, line in enumerate(lines) if line[:1] in (" ", "-", "+", "\\")]
    edits: list[Callable[[list[str], int], object]] = [
        lambda ls, i: ls.pop(i),
        lambda ls, i: ls.insert(i, ls[i]),
        lambda ls, i: ls.insert(i, "\\ No newline at end of file"),
        lambda ls, i: ls.insert(i, "\\ something else"),
        lambda ls, i: ls.__setitem__(i, "+" + ls[i][1:]),
        lambda ls, i: ls.__setitem__(i, "-" + ls[i][1:]),
        lambda ls, i: ls.__setitem__(i, " " + ls[i][1:]),
        lambda ls, i: ls.__setitem__(i, ""),
        lambda ls, i: ls.__setitem__(i, "?" + ls[i][1:]),
        lambda ls, i: ls.__setitem__(i, ls[i] + "\r"),
    ]
    out = []
    for _ in range(count):
        copy = list(lines)
        for _ in range(rng.randint(1, 2)):
            rng.choice(edits)(copy, rng.choice(hunk_lines))
        out.append("\n".join(copy))
    return out


def test_the_one_step_hunk_reading_gives_what_the_line_by_line_one_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = make_diff(tmp_path, BEFORE, AFTER)
    assert "\\ No newline at end of file" in text
    fast = _outcome(text)
    assert isinstance(fast, list)
    assert fast == _line_by_line(text, monkeypatch)
    rng = random.Random(7)  # noqa: S311 - reproducible test data
    refused = 0
    for mutant in _mutants(text, rng, 600):
        expected = _line_by_line(mutant, monkeypatch)
        assert _outcome(mutant) == expected, mutant
        refused += isinstance(expected, tuple)
    assert refused > 300  # most copies are broken, and broken the same way


def test_a_marker_in_the_middle_of_a_hunk(monkeypatch: pytest.MonkeyPatch) -> None:
    text = (
        "diff --git a/f b/f\n--- a/f\n+++ b/f\n@@ -1,2 +1,2 @@\n a\n-b\n"
        "\\ No newline at end of file\n+B\n"
    )
    patches = _outcome(text)
    assert isinstance(patches, list)
    assert patches[0].hunks[0].old_no_eol
    assert not patches[0].hunks[0].new_no_eol
    assert patches == _line_by_line(text, monkeypatch)


def test_the_ascii_short_cuts_of_the_name_rules_hold_for_every_ascii_character() -> None:
    for code in range(128):
        ch = chr(code)
        control = unicodedata.category(ch) in names._BAD_CATEGORIES
        assert (names._ASCII_CONTROL.search(f"a{ch}b") is not None) == control
        for form in ("NFC", "NFKC"):
            slow = unicodedata.normalize(form, unicodedata.normalize(form, ch).casefold())
            assert slow == ch.lower()
    assert names.fold("Src/Caf\u00e9.PY") == "src/caf\u00e9.py"
    assert names.fold("README.md") == "readme.md"


@pytest.mark.parametrize("object_format", ["sha1", "sha256"])
def test_the_index_file_is_the_one_git_writes(tmp_path: Path, object_format: str) -> None:
    repo = init(
        tmp_path / "r",
        {"a.txt": b"a\n", "d/e/b.txt": b"b\n", "\u00fc x.sh": (0o755, b"#!/bin/sh\n")},
        f"--object-format={object_format}",
    )
    entries = []
    for line in repo.git("ls-files", "-s", "-z").split("\0"):
        if not line:
            continue
        meta, path = line.split("\t")
        mode, oid, _ = meta.split()
        entries.append(IndexEntry(mode, oid, path))
    entries.append(IndexEntry("100644", entries[0].oid, "z" * 5000))
    info = b"".join(f"{e.mode} blob {e.oid}\t{e.path}".encode() + b"\0" for e in entries)
    index = tmp_path / "index"
    env = {**repo.env, "GIT_INDEX_FILE": str(index)}
    git(repo.path, "update-index", "-z", "--index-info", stdin=info, env=env)
    assert index_file(list(reversed(entries))) == index.read_bytes()


def test_the_prefetch_finds_what_the_folder_walk_finds(tmp_path: Path) -> None:
    files: dict[str, bytes | tuple[int, bytes]] = {
        "top.txt": b"t\n",
        "run.sh": (0o755, b"#!/bin/sh\n"),
        "d/a b.txt": b"space\n",
        "d/e/deep.txt": b"deep\n",
        "file/x": b"under a folder named file\n",
    }
    repo = init(tmp_path / "r", files, symlinks={"link": "d", "d/l.txt": "../top.txt"})
    tree = repo.git("rev-parse", "HEAD^{tree}").strip()
    git_dir = repo.path / ".git"
    names = [
        *files,
        "link",
        "link/a b.txt",
        "d/l.txt",
        "d/e",
        "missing.txt",
        "d/missing/x",
        "top.txt/under",
        "d/./e/deep.txt",
        "../top.txt",
        "d//a b.txt",
        "",
    ]
    seen: list[list[IndexEntry]] = []
    with GitTree(git_dir, tree, seen.append) as fast:
        fast.prefetch(names)
        found = [fast.lookup(n) for n in names if n]
        blobs = fast.read_all([TreeEntry(*fast.lookup(n).entry) for n in files])  # type: ignore[misc]
    with GitTree(git_dir, tree) as slow:
        assert found == [slow.lookup(n) for n in names if n]
    assert blobs == [v[1] if isinstance(v, tuple) else v for v in files.values()]
    assert len(seen) == 1
    assert sorted(e.path for e in seen[0]) == sorted(files)


class _Checks:
    """A PatchCheck that records the entries each check was started with."""

    def __init__(self) -> None:
        self.started: list[frozenset[IndexEntry]] = []
        self.finished = 0
        self.lock = threading.Lock()

    def __call__(self, _raw: bytes, entries: Sequence[IndexEntry]) -> Callable[[], CheckOutcome]:
        with self.lock:
            self.started.append(frozenset(entries))

        def finish() -> CheckOutcome:
            with self.lock:
                self.finished += 1
            return CheckOutcome(ok=True, message="", numstat=[])

        return finish


def _started(early: validate._EarlyCheck, entries: list[IndexEntry]) -> None:
    early.start(entries)


def test_the_early_patch_check_is_used_for_the_same_entries_only() -> None:
    one = IndexEntry("100644", "a" * 40, "a.txt")
    two = IndexEntry("100644", "b" * 40, "b.txt")
    checks = _Checks()
    early = validate._EarlyCheck(checks, b"diff")
    _started(early, [one, two])
    early(b"diff", [two, one])()
    early.close()
    assert checks.started == [frozenset({one, two})]
    assert checks.finished == 1

    checks = _Checks()
    early = validate._EarlyCheck(checks, b"diff")
    _started(early, [one, two])
    early(b"diff", [one])()
    early.close()
    assert checks.started == [frozenset({one, two}), frozenset({one})]
    assert checks.finished == 2  # the early one was waited for too

    checks = _Checks()
    early = validate._EarlyCheck(checks, b"diff")
    _started(early, [one])
    early.close()  # the rules refused the diff: nothing asked for the check
    assert checks.finished == 1


def test_the_io_threads_raise_the_first_error_after_every_job() -> None:
    done: list[int] = []
    lock = threading.Lock()

    def job(n: int) -> None:
        with lock:
            done.append(n)
        if n in (3, 5):
            raise OSError(n, "failed")

    with pytest.raises(OSError, match="failed") as info:
        worktree._in_threads(job, list(range(40)))
    assert info.value.errno == 3
    assert sorted(done) == list(range(40))


def test_baseline_contents_come_from_the_work_tree_only_when_unchanged(tmp_path: Path) -> None:
    files: dict[str, bytes | tuple[int, bytes]] = {
        "same.txt": b"same\n",
        "edited.txt": b"baseline\n",
        "swapped.txt": b"a file in the baseline\n",
        "gone.txt": b"removed from the work tree\n",
    }
    repo = init(tmp_path / "r", files)
    tree = repo.git("rev-parse", "HEAD^{tree}").strip()
    (repo.path / "edited.txt").write_bytes(b"the user's edit\n")
    (repo.path / "swapped.txt").unlink()
    (repo.path / "swapped.txt").symlink_to("same.txt")
    (repo.path / "gone.txt").unlink()
    with GitTree(repo.path / ".git", tree, work_tree=repo.path) as fast:
        fast.prefetch(list(files))
        entries = [fast.lookup(n).entry for n in files]
        assert all(e is not None for e in entries)
        blobs = fast.read_all([e for e in entries if e is not None])
    assert blobs == list(files.values())
