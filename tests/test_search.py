"""list_files / search_text on the agent (over pipes, no Docker): visibility, bounds, cache."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from controller.errors import ErrorCode, ToolError
from controller.sandbox.local import LocalSandbox
from patchbox_agent.globs import Glob, GlobError


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    (root / "src" / "pkg").mkdir(parents=True)
    (root / "build").mkdir()
    (root / "src" / "a.py").write_text("import os\n\ndef needle():\n    return 'needle'\n")
    (root / "src" / "pkg" / "b.py").write_text("x = 1\ny = 'needle'\n")
    (root / "src" / "crlf.txt").write_bytes(b"one\r\nneedle here\r\n")
    (root / "README.md").write_text("no match\n")
    (root / "bin.dat").write_bytes(b"\x00needle\x00")
    (root / "latin1.txt").write_bytes(b"caf\xe9 needle\n")
    (root / ".env").write_text("needle=secret\n")
    (root / "build" / "out.py").write_text("needle\n")
    (root / "debug.log").write_text("needle\n")
    (root / ".gitignore").write_text("build/\n*.log\n")
    (tmp_path / "outside.txt").write_text("needle\n")
    (root / "link.txt").symlink_to(tmp_path / "outside.txt")
    (root / "linkdir").symlink_to(tmp_path)
    return root


@pytest.fixture
def box(ws: Path) -> Iterator[LocalSandbox]:
    with LocalSandbox(ws, env={"PATCHBOX_REGEX_SECONDS": "2"}) as sandbox:
        yield sandbox


def test_listing_hides_ignored_protected_and_linked(box: LocalSandbox) -> None:
    assert box.list_files().files == [
        ".gitignore",
        "README.md",
        "bin.dat",
        "latin1.txt",
        "src/a.py",
        "src/crlf.txt",
        "src/pkg/b.py",
    ]
    assert box.list_files(glob="*.py").files == ["src/a.py", "src/pkg/b.py"]
    assert box.list_files(glob="src/*.py").files == ["src/a.py"]
    assert box.list_files(glob="src/**").files == ["src/a.py", "src/crlf.txt", "src/pkg/b.py"]


def test_literal_search_hits_text_only(box: LocalSandbox) -> None:
    res = box.search_text("needle")
    found = [(h.path, h.line, h.text) for h in res.hits]
    assert found == [
        ("src/a.py", 3, "def needle():"),
        ("src/a.py", 4, "    return 'needle'"),
        ("src/crlf.txt", 2, "needle here"),
        ("src/pkg/b.py", 2, "y = 'needle'"),
    ]
    assert res.truncated is False


def test_search_bounds_and_glob(box: LocalSandbox) -> None:
    res = box.search_text("needle", max_results=2)
    assert len(res.hits) == 2
    assert res.truncated is True
    only = box.search_text("needle", glob="src/pkg/*")
    assert [h.path for h in only.hits] == ["src/pkg/b.py"]


def test_long_lines_are_cut(box: LocalSandbox, ws: Path) -> None:
    (ws / "long.txt").write_text("x" * 5000 + "needle" + "y" * 5000 + "\n")
    box.run(["true"], timeout=10)  # a run may change files: the index is rebuilt after it
    hit = next(h for h in box.search_text("needle").hits if h.path == "long.txt")
    assert len(hit.text) == 500


def test_cache_is_per_workspace_version(box: LocalSandbox, ws: Path) -> None:
    first = box.search_text("needle")
    again = box.search_text("needle")
    assert (first.cached, again.cached) == (False, True)
    assert again.version == first.version
    assert again.hits == first.hits
    res = box.run([sys.executable, "-c", "open('src/new.py', 'w').write('needle\\n')"], timeout=20)
    assert res.exitCode == 0
    after = box.search_text("needle")
    assert after.cached is False
    assert after.version > first.version
    assert "src/new.py" in [h.path for h in after.hits]
    assert (ws / "src" / "new.py").exists()


def test_regex_search_and_its_time_bound(box: LocalSandbox, ws: Path) -> None:
    res = box.search_text(r"def \w+\(", regex=True)
    assert [(h.path, h.line) for h in res.hits] == [("src/a.py", 3)]
    with pytest.raises(ToolError) as info:
        box.search_text("(unclosed", regex=True)
    assert info.value.code is ErrorCode.TOOL_ARGUMENTS_INVALID
    (ws / "evil.txt").write_text("a" * 40 + "!\n")
    box.run(["true"], timeout=10)
    started = time.monotonic()
    with pytest.raises(ToolError, match="ran out of time") as info:
        box.search_text("(a+)+$", regex=True)
    assert info.value.code is ErrorCode.TOOL_ARGUMENTS_INVALID
    assert time.monotonic() - started < 6
    assert box.search_text("needle").hits  # the agent is still fine


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
