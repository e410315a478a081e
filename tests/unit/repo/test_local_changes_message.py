"""The refusal of a work tree with local changes names its first files, in order, every
character a terminal would act on shown as an escape, then how many more."""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.errors import ErrorCode, PatchboxError
from controller.repo.baseline import build_baseline, named_files
from tests.support.baseline import isolate
from tests.support.jobs import make_repo


def test_named_files_shows_five_then_counts() -> None:
    paths = [f"f{n}.py" for n in (3, 1, 7, 2, 6, 5, 4)]
    assert named_files(paths) == "f1.py, f2.py, f3.py, f4.py, f5.py and 2 more"
    assert named_files(["b", "a"]) == "a, b"
    assert named_files(["x" * 500]) == "x" * 120


def test_a_dirty_work_tree_names_its_first_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    isolate(tmp_path, monkeypatch)
    repo = make_repo(tmp_path / "repo")
    (repo / "app.py").write_text("# changed\n")
    for n in range(7):
        (repo / f"new{n}.txt").write_text(f"{n}\n")
    (repo / "evil\x1b[2J\u202ename.txt").write_text("x\n")
    with pytest.raises(PatchboxError) as caught:
        build_baseline(repo)
    assert caught.value.code is ErrorCode.CONSENT_REQUIRED
    message = caught.value.message
    assert "(0 staged, 1 unstaged, 8 untracked: " in message
    assert "app.py, evil\\x1b[2J\\u202ename.txt, new0.txt, new1.txt, new2.txt and 4 more)" in (
        message
    )
    assert "\x1b" not in message
    assert "\u202e" not in message


def test_protected_files_are_counted_never_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The refusal may reach a model (an MCP session's first call): a changed ``.env`` or
    key is counted, its name never shown."""
    assert named_files(["a.py", ".env", "id_ed25519"]) == "a.py, 2 protected files"
    isolate(tmp_path, monkeypatch)
    repo = make_repo(tmp_path / "repo")
    (repo / ".env.prod").write_text("TOKEN=x\n")
    (repo / "notes.txt").write_text("n\n")
    with pytest.raises(PatchboxError) as caught:
        build_baseline(repo)
    message = caught.value.message
    assert "untracked: notes.txt, 1 protected file)" in message
    assert ".env" not in message
