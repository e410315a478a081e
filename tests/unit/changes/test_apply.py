"""apply: the validated diff applied to, and reverted from, a real user repository.

The repository has staged, unstaged and untracked work; after apply and after revert every
byte of it (files, modes, folders, the index file, HEAD, ``git status``) is compared exactly.
"""

from __future__ import annotations

import errno
import os
from dataclasses import replace
from pathlib import Path

import pytest

import controller.changes.apply as apply_module
from controller.changes import transaction, worktree
from controller.changes.apply import apply_changeset, job_state, recover, revert_changeset
from controller.changes.journal import Journal
from controller.errors import (
    ApplyConflictError,
    ChangesetInvalidError,
    ErrorCode,
    RevertConflictError,
)
from controller.repo.baseline import Baseline, build_baseline
from tests.support.git import Content, git, init, make_diff, status
from tests.support.worktree import Snapshot, snapshot

CAFE = "\u00e9t\u00e9/caf\u00e9.txt"
HEAD_FILES: dict[str, Content] = {
    "f.txt": b"a\nb\nc\n",
    "src/m.py": b"x = 1\ny = 2\n",
    "src/old.py": b"old = 1\nkeep = 2\n",
    "run.sh": (0o755, b"#!/bin/sh\necho hi\n"),
    "crlf.txt": b"one\r\ntwo\r\nthree\r\n",
    "noeol.txt": b"first\nlast",
    CAFE: "caf\u00e9\n".encode(),
    "docs/readme.md": b"# doc\n",
    "group.txt": (0o640, b"g\n"),
    "gone.txt": b"bye\n",
    "untouched.txt": b"same\n",
}
# The user's work before the job: staged, staged then edited again, unstaged, untracked.
STAGED = {"docs/readme.md": b"# doc\nstaged\n", "f.txt": b"a\nb\nc\nd\n"}
UNSTAGED = {"f.txt": b"a\nb\nc\nd\ne\n", "src/m.py": b"x = 1\ny = 2\nz = 3\n"}
UNTRACKED = {"notes.txt": b"my notes\n", "scratch/tmp.txt": b"t\n"}

BEFORE: dict[str, Content] = {  # the baseline content of every path the diff touches
    "f.txt": UNSTAGED["f.txt"],
    "src/m.py": UNSTAGED["src/m.py"],
    "src/old.py": HEAD_FILES["src/old.py"],
    "run.sh": HEAD_FILES["run.sh"],
    "crlf.txt": HEAD_FILES["crlf.txt"],
    "noeol.txt": HEAD_FILES["noeol.txt"],
    CAFE: HEAD_FILES[CAFE],
    "docs/readme.md": STAGED["docs/readme.md"],
    "group.txt": HEAD_FILES["group.txt"],
    "gone.txt": HEAD_FILES["gone.txt"],
}
AFTER: dict[str, Content] = {
    "f.txt": b"a\nB\nc\nd\ne\n",
    "src/m.py": b"x = 1\ny = 20\nz = 3\n",
    "src/new.py": b"old = 1\nkeep = 2\nnew = 3\n",
    "run.sh": (0o755, b"#!/bin/sh\necho ho\n"),
    "crlf.txt": b"one\r\nTWO\r\nthree\r\n",
    "noeol.txt": b"first\nlast changed",
    CAFE: "caf\u00e9 cr\u00e8me\n".encode(),
    "docs/readme.md": b"# doc\nstaged\nand agent\n",
    "group.txt": (0o640, b"G\n"),
    "new/deep/n.py": b"print('n')\n",
}


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    path = init(tmp_path / "repo", HEAD_FILES, message="init").path
    for name, data in STAGED.items():
        (path / name).write_bytes(data)
    git(path, "add", *STAGED)
    for name, data in {**UNSTAGED, **UNTRACKED}.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_bytes(data)
    return path


@pytest.fixture
def baseline(repo: Path) -> Baseline:
    return build_baseline(repo, "include-local-changes")[0]


@pytest.fixture
def diff(tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_diff(tmp_path_factory.getbasetemp(), BEFORE, AFTER)


@pytest.fixture
def journal(tmp_path: Path) -> Journal:
    return Journal(tmp_path / "journal")


def expected_after(before: Snapshot) -> Snapshot:
    files = dict(before.files)
    for name in ("gone.txt", "src/old.py"):
        del files[name]
    for name, value in AFTER.items():
        data = value[1] if isinstance(value, tuple) else value
        mode = files[name][0] if name in files else None
        if name == "src/new.py":
            mode = before.files["src/old.py"][0]
        files[name] = (mode if mode is not None else 0o666 & ~_umask(), data)
    return replace(before, files=files, folders=before.folders | {"new", "new/deep"})


def test_apply_then_revert_keeps_every_byte_of_the_users_work(
    repo: Path, baseline: Baseline, diff: str, journal: Journal
) -> None:
    original, original_status = snapshot(repo), status(repo)
    assert original.files["group.txt"][0] == 0o640
    result = apply_changeset(baseline, diff, job_id="job-1", journal=journal)
    applied = snapshot(repo)
    assert applied == expected_after(original)
    assert applied.index == original.index
    assert applied.files["run.sh"][0] == 0o755
    assert applied.files["group.txt"][0] == 0o640
    assert applied.files["crlf.txt"][1] == b"one\r\nTWO\r\nthree\r\n"
    assert applied.files["noeol.txt"][1] == b"first\nlast changed"
    assert sorted((f.path, f.change) for f in result.files) == [
        ("crlf.txt", "modify"),
        ("docs/readme.md", "modify"),
        ("f.txt", "modify"),
        ("gone.txt", "delete"),
        ("group.txt", "modify"),
        ("new/deep/n.py", "create"),
        ("noeol.txt", "modify"),
        ("run.sh", "modify"),
        ("src/m.py", "modify"),
        ("src/new.py", "create"),
        ("src/old.py", "delete"),
        (CAFE, "modify"),
    ]
    assert result.merged == []
    assert job_state("job-1", journal=journal).state == "applied"

    reverted = revert_changeset("job-1", journal=journal)
    assert snapshot(repo) == original
    assert status(repo) == original_status
    assert sorted(f.path for f in reverted.files) == sorted(f.path for f in result.files)
    assert job_state("job-1", journal=journal).state == "not_applied"
    assert recover(journal) == [
        apply_module.Recovery(job_id="job-1", state="not_applied", action="none")
    ]


def test_the_index_is_never_opened_for_writing(
    repo: Path, baseline: Baseline, diff: str, journal: Journal
) -> None:
    index = repo / ".git" / "index"
    os.utime(index, (1_000_000_000, 1_000_000_000))
    before = index.stat()
    apply_changeset(baseline, diff, job_id="j", journal=journal)
    revert_changeset("j", journal=journal)
    after = index.stat()
    assert (after.st_mtime_ns, after.st_ino, after.st_size) == (
        before.st_mtime_ns,
        before.st_ino,
        before.st_size,
    )
    assert not (repo / ".git" / "index.lock").exists()


def test_a_user_edit_after_apply_makes_revert_refuse(
    repo: Path, baseline: Baseline, diff: str, journal: Journal
) -> None:
    original = snapshot(repo)
    apply_changeset(baseline, diff, job_id="j", journal=journal)
    (repo / "src" / "m.py").write_bytes(b"user edit\n")
    edited = snapshot(repo)
    with pytest.raises(RevertConflictError) as info:
        revert_changeset("j", journal=journal)
    assert info.value.code == ErrorCode.REVERT_CONFLICT
    assert [(c.code, c.path) for c in info.value.conflicts] == [("changed", "src/m.py")]
    assert snapshot(repo) == edited
    assert job_state("j", journal=journal).state == "applied"
    (repo / "src" / "m.py").write_bytes(b"x = 1\ny = 20\nz = 3\n")
    revert_changeset("j", journal=journal)
    assert snapshot(repo) == original


def test_a_created_file_removed_by_the_user_makes_revert_refuse(
    repo: Path, baseline: Baseline, diff: str, journal: Journal
) -> None:
    apply_changeset(baseline, diff, job_id="j", journal=journal)
    (repo / "new" / "deep" / "n.py").unlink()
    (repo / "gone.txt").write_bytes(b"user's own new file\n")
    with pytest.raises(RevertConflictError) as info:
        revert_changeset("j", journal=journal)
    assert sorted((c.code, c.path) for c in info.value.conflicts) == [
        ("exists", "gone.txt"),
        ("missing", "new/deep/n.py"),
    ]
    assert (repo / "gone.txt").read_bytes() == b"user's own new file\n"


def test_head_moved_with_the_touched_paths_as_they_were_is_no_conflict(
    repo: Path, baseline: Baseline, diff: str, journal: Journal
) -> None:
    old_head = git(repo, "rev-parse", "HEAD")
    git(repo, "commit", "-qm", "user commit")  # the staged work: the work tree is as it was
    assert git(repo, "rev-parse", "HEAD") != old_head
    before = snapshot(repo)
    apply_changeset(baseline, diff, job_id="j", journal=journal)
    after = snapshot(repo)
    assert after == expected_after(before)
    assert after.index == before.index
    revert_changeset("j", journal=journal)
    assert snapshot(repo) == before


def test_a_merge_started_during_the_job_blocks_apply(
    repo: Path, baseline: Baseline, diff: str, journal: Journal
) -> None:
    git(repo, "stash", "-u", "-q")
    git(repo, "checkout", "-q", "-b", "other")
    (repo / "other.txt").write_bytes(b"other\n")
    git(repo, "add", "other.txt")
    git(repo, "commit", "-qm", "other")
    git(repo, "checkout", "-q", "main")
    git(repo, "merge", "-q", "--no-ff", "--no-commit", "other")
    git(repo, "stash", "pop", "-q")
    assert (repo / ".git" / "MERGE_HEAD").exists()
    before = snapshot(repo)
    with pytest.raises(ApplyConflictError) as info:
        apply_changeset(baseline, diff, job_id="j", journal=journal)
    assert [c.code for c in info.value.conflicts] == ["operation_in_progress"]
    assert "MERGE_IN_PROGRESS" in info.value.conflicts[0].message
    assert snapshot(repo) == before


def test_an_index_lock_blocks_apply(
    repo: Path, baseline: Baseline, diff: str, journal: Journal
) -> None:
    (repo / ".git" / "index.lock").write_bytes(b"")
    with pytest.raises(ApplyConflictError) as info:
        apply_changeset(baseline, diff, job_id="j", journal=journal)
    assert [c.code for c in info.value.conflicts] == ["operation_in_progress"]


def test_a_changed_touched_path_is_a_conflict_and_nothing_is_written(
    repo: Path, baseline: Baseline, diff: str, journal: Journal
) -> None:
    (repo / "src" / "m.py").write_bytes(b"changed meanwhile\n")
    (repo / "new" / "deep").mkdir(parents=True)
    (repo / "new" / "deep" / "n.py").write_bytes(b"mine\n")
    (repo / "untouched.txt").write_bytes(b"changes freely\n")
    before = snapshot(repo)
    with pytest.raises(ApplyConflictError) as info:
        apply_changeset(baseline, diff, job_id="j", journal=journal)
    assert sorted((c.code, c.path) for c in info.value.conflicts) == [
        ("changed", "src/m.py"),
        ("exists", "new/deep/n.py"),
    ]
    assert snapshot(repo) == before
    assert journal.phase("j") == "none"


def test_a_symlink_swapped_in_is_never_followed(
    repo: Path, baseline: Baseline, diff: str, journal: Journal, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    for name in ("m.py", "old.py"):
        (outside / name).write_bytes((repo / "src" / name).read_bytes())
    (repo / "src" / "m.py").unlink()
    (repo / "src" / "old.py").unlink()
    (repo / "src").rmdir()
    (repo / "src").symlink_to(outside)
    (repo / "docs" / "readme.md").unlink()
    (repo / "docs" / "readme.md").symlink_to(outside / "m.py")
    with pytest.raises(ApplyConflictError) as info:
        apply_changeset(baseline, diff, job_id="j", journal=journal)
    assert sorted((c.code, c.path) for c in info.value.conflicts) == [
        ("not_regular", "docs/readme.md"),
        ("not_regular", "src/m.py"),
        ("not_regular", "src/new.py"),
        ("not_regular", "src/old.py"),
    ]
    assert (outside / "m.py").read_bytes() == UNSTAGED["src/m.py"]
    assert sorted(p.name for p in outside.iterdir()) == ["m.py", "old.py"]


def test_an_invalid_diff_writes_nothing(repo: Path, baseline: Baseline, journal: Journal) -> None:
    before = snapshot(repo)
    bad = "diff --git a/.env b/.env\nnew file mode 100644\n--- /dev/null\n+++ b/.env\n@@ -0,0 +1 @@\n+X=1\n"
    with pytest.raises(ChangesetInvalidError):
        apply_changeset(baseline, bad, job_id="j", journal=journal)
    assert snapshot(repo) == before
    assert journal.jobs() == []


def test_apply_twice_revert_twice_and_apply_again(
    repo: Path, baseline: Baseline, diff: str, journal: Journal
) -> None:
    original = snapshot(repo)
    apply_changeset(baseline, diff, job_id="j", journal=journal)
    with pytest.raises(ApplyConflictError) as info:
        apply_changeset(baseline, diff, job_id="j", journal=journal)
    assert [c.code for c in info.value.conflicts] == ["already_applied"]
    revert_changeset("j", journal=journal)
    with pytest.raises(RevertConflictError) as again:
        revert_changeset("j", journal=journal)
    assert [c.code for c in again.value.conflicts] == ["not_applied"]
    with pytest.raises(RevertConflictError):
        revert_changeset("never-applied", journal=journal)
    apply_changeset(baseline, diff, job_id="j", journal=journal)
    assert snapshot(repo) == expected_after(original)
    revert_changeset("j", journal=journal)
    assert snapshot(repo) == original


def test_clearing_the_exec_bit_and_reverting_it(
    repo: Path, baseline: Baseline, journal: Journal, tmp_path: Path
) -> None:
    diff = make_diff(
        tmp_path, {"run.sh": HEAD_FILES["run.sh"]}, {"run.sh": (0o644, b"#!/bin/sh\necho hi\n")}
    )
    assert "old mode 100755" in diff
    apply_changeset(baseline, diff, job_id="j", journal=journal)
    assert (repo / "run.sh").stat().st_mode & 0o777 == 0o644
    revert_changeset("j", journal=journal)
    assert (repo / "run.sh").stat().st_mode & 0o777 == 0o755


def test_a_path_changed_during_the_write_rolls_the_apply_back(
    repo: Path, baseline: Baseline, diff: str, journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = snapshot(repo)

    def user_edits(step: str) -> None:
        if step == "apply.write.2":
            (repo / "src" / "m.py").write_bytes(b"typed during the apply\n")

    monkeypatch.setattr(transaction, "fault_point", user_edits)
    with pytest.raises(ApplyConflictError) as info:
        apply_changeset(baseline, diff, job_id="j", journal=journal)
    assert [(c.code, c.path) for c in info.value.conflicts] == [("changed", "src/m.py")]
    files = dict(original.files)
    files["src/m.py"] = (files["src/m.py"][0], b"typed during the apply\n")
    assert snapshot(repo) == replace(original, files=files)
    assert journal.phase("j") == "rolled_back"
    assert not list(repo.rglob(".patchbox-*"))


# --------------------------------------------------------------------------------------
# Three-way merge (never the default)

MERGE_BASE = {"m.txt": b"one\ntwo\nthree\nfour\nfive\n"}


@pytest.fixture
def merge_repo(tmp_path: Path) -> tuple[Path, Baseline, str]:
    path = init(tmp_path / "mrepo", MERGE_BASE, message="init").path
    base = build_baseline(path)[0]
    diff = make_diff(tmp_path, MERGE_BASE, {"m.txt": b"one\ntwo\nthree\nfour\nFIVE\n"})
    return path, base, diff


def test_merge_of_a_non_overlapping_concurrent_change(
    merge_repo: tuple[Path, Baseline, str], journal: Journal
) -> None:
    path, base, diff = merge_repo
    (path / "m.txt").write_bytes(b"ONE\ntwo\nthree\nfour\nfive\n")
    with pytest.raises(ApplyConflictError):
        apply_changeset(base, diff, job_id="plain", journal=journal)
    result = apply_changeset(base, diff, job_id="j", journal=journal, merge=True)
    assert result.merged == ["m.txt"]
    assert (path / "m.txt").read_bytes() == b"ONE\ntwo\nthree\nfour\nFIVE\n"
    revert_changeset("j", journal=journal)
    assert (path / "m.txt").read_bytes() == b"ONE\ntwo\nthree\nfour\nfive\n"


def test_merge_of_an_overlapping_change_stays_a_conflict(
    merge_repo: tuple[Path, Baseline, str], journal: Journal
) -> None:
    path, base, diff = merge_repo
    (path / "m.txt").write_bytes(b"one\ntwo\nthree\nfour\nfive!\n")
    with pytest.raises(ApplyConflictError) as info:
        apply_changeset(base, diff, job_id="j", journal=journal, merge=True)
    (conflict,) = info.value.conflicts
    assert (conflict.code, conflict.path) == ("merge_conflict", "m.txt")
    assert conflict.detail is not None
    assert "<<<<<<< work tree" in conflict.detail
    assert ">>>>>>> change set" in conflict.detail
    assert (path / "m.txt").read_bytes() == b"one\ntwo\nthree\nfour\nfive!\n"
    assert journal.jobs() == []


def test_a_failed_write_rolls_the_apply_back(
    repo: Path, baseline: Baseline, diff: str, journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = snapshot(repo)
    renames: list[str] = []
    real_replace = worktree.WorkTree.replace

    def replace_until_disk_full(self: worktree.WorkTree, path: str, temp: str) -> None:
        renames.append(path)
        if len(renames) == 4:  # the fourth rename of the apply; the undo's go through
            raise OSError(errno.ENOSPC, "No space left on device")
        real_replace(self, path, temp)

    monkeypatch.setattr(worktree.WorkTree, "replace", replace_until_disk_full)
    with pytest.raises(ApplyConflictError) as info:
        apply_changeset(baseline, diff, job_id="j", journal=journal)
    assert [c.code for c in info.value.conflicts] == ["write_failed"]
    assert "No space left" in info.value.conflicts[0].message
    assert len(renames) == 4 + 4  # back: the three replaced and the one removed (gone.txt)
    assert snapshot(repo) == original
    assert journal.phase("j") == "rolled_back"
    monkeypatch.undo()
    apply_changeset(baseline, diff, job_id="j", journal=journal)
    assert snapshot(repo) == expected_after(original)


def test_a_temp_file_that_cannot_be_written_writes_nothing(
    repo: Path, baseline: Baseline, diff: str, journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = snapshot(repo)

    def no_permission(folder_fd: int, temp: str, data: bytes, mode: int) -> None:
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(worktree, "_write_temp", no_permission)
    with pytest.raises(ApplyConflictError) as info:
        apply_changeset(baseline, diff, job_id="j", journal=journal)
    assert [c.code for c in info.value.conflicts] == ["write_failed"]
    assert snapshot(repo) == original


def test_a_repository_that_converts_line_endings_keeps_its_bytes(
    tmp_path: Path, journal: Journal
) -> None:
    path = init(tmp_path / "crlf", {"f.txt": b"a\nb\nc\n"}, message="init").path
    git(path, "config", "core.autocrlf", "true")
    (path / "f.txt").unlink()
    git(path, "checkout", "--", "f.txt")
    assert (path / "f.txt").read_bytes() == b"a\r\nb\r\nc\r\n"
    assert status(path) == b""
    original = snapshot(path)
    base = build_baseline(path)[0]
    diff = make_diff(tmp_path, {"f.txt": b"a\r\nb\r\nc\r\n"}, {"f.txt": b"a\r\nB\r\nc\r\n"})
    apply_changeset(base, diff, job_id="j", journal=journal)
    assert (path / "f.txt").read_bytes() == b"a\r\nB\r\nc\r\n"
    revert_changeset("j", journal=journal)
    assert snapshot(path) == original
