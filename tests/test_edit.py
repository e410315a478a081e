"""replace_text on the agent (over pipes, no Docker): exactly one match, atomic, restorable."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from controller.errors import ErrorCode, ToolError
from controller.sandbox.local import LocalSandbox


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    (root / "src").mkdir(parents=True)
    (root / "src" / "a.py").write_text("def f(text):\n    return text.split(',')\n\nx = 'aaa'\n")
    (root / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (root / "run.sh").chmod(0o755)
    (root / "crlf.txt").write_bytes(b"one\r\ntwo\r\n")
    (root / "latin1.txt").write_bytes(b"caf\xe9\n")
    (root / ".env").write_text("A=1\n")
    (tmp_path / "outside.txt").write_text("secret\n")
    (root / "link.txt").symlink_to(tmp_path / "outside.txt")
    os.mkfifo(root / "fifo")
    return root


@pytest.fixture
def box(ws: Path) -> Iterator[LocalSandbox]:
    with LocalSandbox(ws) as sandbox:
        yield sandbox


def _snapshot(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.is_symlink() and p.name != "fifo"
    }


def test_exact_replacement_is_atomic_and_keeps_the_mode(box: LocalSandbox, ws: Path) -> None:
    target = ws / "src" / "a.py"
    before = target.read_bytes()
    inode = target.stat().st_ino
    res = box.replace_text(
        "src/a.py", "    return text.split(',')", "    return text.split(',') if text else []"
    )
    after = target.read_bytes()
    assert after == before.replace(b"split(',')\n", b"split(',') if text else []\n")
    assert (res.line, res.removedLines, res.addedLines) == (2, 1, 1)
    assert res.sha256Before == hashlib.sha256(before).hexdigest()
    assert res.sha256After == hashlib.sha256(after).hexdigest()
    assert target.stat().st_ino != inode, "written through a temp file and a rename"
    assert not list(ws.rglob(".patchbox-tmp-*"))
    box.replace_text("run.sh", "echo hi", "echo hello")
    assert (ws / "run.sh").stat().st_mode & 0o777 == 0o755


@pytest.mark.parametrize(
    ("path", "old", "new", "message"),
    [
        ("src/a.py", "not there", "x", "not found"),
        ("src/a.py", "text", "txt", "more than once"),
        ("src/a.py", "aa", "b", "more than once"),  # overlapping occurrences in 'aaa'
        ("src/a.py", "x = 'aaa'", "x = 'aaa'   ", "trailing whitespace"),
        ("src/a.py", "    return", " \treturn", "space before tab"),
    ],
)
def test_rejections_leave_the_workspace_unchanged(
    box: LocalSandbox, ws: Path, path: str, old: str, new: str, message: str
) -> None:
    before = _snapshot(ws)
    with pytest.raises(ToolError, match=message) as info:
        box.replace_text(path, old, new)
    assert info.value.code is ErrorCode.PATCH_REJECTED
    assert _snapshot(ws) == before
    assert not list(ws.rglob(".patchbox-tmp-*"))


@pytest.mark.parametrize(
    "path",
    ["link.txt", ".env", "fifo", "latin1.txt", "src", "missing.py", "../outside.txt", "/etc/hosts"],
)
def test_denied_paths(box: LocalSandbox, ws: Path, path: str) -> None:
    before = _snapshot(ws)
    with pytest.raises(ToolError) as info:
        box.replace_text(path, "secret", "public")
    assert info.value.code is ErrorCode.TOOL_PATH_DENIED
    assert _snapshot(ws) == before
    assert (ws.parent / "outside.txt").read_text() == "secret\n"


def test_crlf_is_preserved(box: LocalSandbox, ws: Path) -> None:
    box.replace_text("crlf.txt", "two\r\n", "2\r\n")
    assert (ws / "crlf.txt").read_bytes() == b"one\r\n2\r\n"


def test_identical_texts_are_invalid_arguments(box: LocalSandbox) -> None:
    with pytest.raises(ToolError) as info:
        box.session.call("replace_text", {"path": "src/a.py", "oldText": "x", "newText": "x"}, 10)
    assert info.value.code is ErrorCode.TOOL_ARGUMENTS_INVALID


def test_an_edit_makes_a_new_version(box: LocalSandbox) -> None:
    first = box.search_text("split")
    res = box.replace_text("src/a.py", "split(',')", "split(';')")
    assert res.version > first.version
    after = box.search_text("split")
    assert after.cached is False
    assert after.hits[0].text == "    return text.split(';')"
