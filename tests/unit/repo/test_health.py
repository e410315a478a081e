"""The health gate on real repositories: every blocked state with its exact reason
codes, exact counts, and every repository layout patchbox accepts or refuses."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from controller.errors import ErrorCode, NotARepositoryError, PatchboxError, RepoBlockedError
from controller.repo.baseline import build_baseline
from controller.repo.health import HealthReport, SnapshotLimits, check_health
from controller.repo.layout import locate
from tests.support.baseline import archive_files, isolate, leftovers, work_tree_files
from tests.support.git import Repo, init

BASE: dict[str, bytes | str] = {
    "a.txt": "one\ntwo\nthree\n",
    "b.txt": "b\n",
    ".gitignore": "*.log\nignored/\n",
}


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    yield isolate(tmp_path, monkeypatch)
    assert not leftovers(tmp_path)


@pytest.fixture
def repo(tmp_path: Path, env: dict[str, str]) -> Repo:
    return init(tmp_path / "repo", BASE, env=env)


def codes(report: HealthReport) -> list[str]:
    return [r.code for r in report.reasons]


def fails(repo: Repo, *args: str, stdin: bytes | None = None) -> None:
    proc = repo.run(*args, stdin=stdin)
    assert proc.returncode != 0, f"git {' '.join(args)} was expected to stop"


def diverge(repo: Repo) -> None:
    """Branch ``topic`` and ``main`` change the same line of a.txt."""
    repo.git("checkout", "-q", "-b", "topic")
    repo.write("a.txt", "one\nTOPIC\nthree\n")
    repo.commit("topic")
    repo.git("checkout", "-q", "main")
    repo.write("a.txt", "one\nMAIN\nthree\n")
    repo.commit("main")


def merge(repo: Repo) -> None:
    diverge(repo)
    fails(repo, "merge", "topic")
    assert (repo.git_dir / "MERGE_HEAD").is_file()


def rebase_merge(repo: Repo) -> None:
    diverge(repo)
    repo.git("checkout", "-q", "topic")
    fails(repo, "rebase", "--merge", "main")
    assert (repo.git_dir / "rebase-merge").is_dir()


def rebase_stopped(repo: Repo) -> None:
    """An interactive-style rebase stopped by a failing ``exec`` line: no conflict."""
    repo.write("c.txt", "c\n")
    repo.commit("c")
    fails(repo, "rebase", "-x", "false", "HEAD~1")
    assert (repo.git_dir / "rebase-merge").is_dir()


def rebase_apply(repo: Repo) -> None:
    diverge(repo)
    repo.git("checkout", "-q", "topic")
    fails(repo, "rebase", "--apply", "main")
    assert (repo.git_dir / "rebase-apply" / "rebasing").exists()


def am(repo: Repo) -> None:
    diverge(repo)
    patch = repo.run("format-patch", "-1", "--stdout", "topic").stdout
    fails(repo, "am", stdin=patch)
    assert (repo.git_dir / "rebase-apply" / "applying").exists()


def cherry_pick(repo: Repo) -> None:
    diverge(repo)
    fails(repo, "cherry-pick", "topic")
    assert (repo.git_dir / "CHERRY_PICK_HEAD").is_file()


def revert(repo: Repo) -> None:
    repo.write("a.txt", "one\nX\nthree\n")
    repo.commit("x")
    repo.write("a.txt", "one\nY\nthree\n")
    repo.commit("y")
    fails(repo, "revert", "--no-edit", "HEAD~1")
    assert (repo.git_dir / "REVERT_HEAD").is_file()


def bisect(repo: Repo) -> None:
    repo.git("bisect", "start")


def index_lock(repo: Repo) -> None:
    (repo.git_dir / "index.lock").write_bytes(b"")


def untracked_symlink(repo: Repo) -> None:
    (repo.path / "link").symlink_to("a.txt")


def untracked_fifo(repo: Repo) -> None:
    (repo.path / "pipes").mkdir()
    os.mkfifo(repo.path / "pipes" / "fifo")


def nested_repo(repo: Repo) -> None:
    init(repo.path / "nested", {"n.txt": "n\n"}, env=repo.env)


def garbage_head(repo: Repo) -> None:
    (repo.git_dir / "HEAD").write_bytes(b"garbage\n")


def head_missing_object(repo: Repo) -> None:
    (repo.git_dir / "HEAD").write_bytes(b"0123456789" * 4 + b"\n")


def head_is_a_blob(repo: Repo) -> None:
    blob = repo.git("rev-parse", "HEAD:b.txt")
    (repo.git_dir / "HEAD").write_text(f"{blob}\n")


def branch_without_commit(repo: Repo) -> None:
    (repo.git_dir / "HEAD").write_text("ref: refs/heads/nothing-yet\n")


def sparse(repo: Repo) -> None:
    repo.write("d1/x.txt", "x\n")
    repo.write("d2/y.txt", "y\n")
    repo.commit("dirs")
    repo.git("sparse-checkout", "set", "d1")
    assert not (repo.path / "d2").exists()


def sparse_old_style(repo: Repo) -> None:
    repo.git("config", "core.sparseCheckout", "true")


BLOCKED: list[tuple[Callable[[Repo], None], list[str]]] = [
    (merge, ["MERGE_IN_PROGRESS", "UNMERGED_PATHS"]),
    (rebase_merge, ["REBASE_IN_PROGRESS", "UNMERGED_PATHS"]),
    (rebase_stopped, ["REBASE_IN_PROGRESS"]),
    (rebase_apply, ["REBASE_IN_PROGRESS", "UNMERGED_PATHS"]),
    (am, ["AM_IN_PROGRESS"]),
    (cherry_pick, ["CHERRY_PICK_IN_PROGRESS", "UNMERGED_PATHS"]),
    (revert, ["REVERT_IN_PROGRESS", "UNMERGED_PATHS"]),
    (bisect, ["BISECT_IN_PROGRESS"]),
    (index_lock, ["INDEX_LOCKED"]),
    (untracked_symlink, ["UNTRACKED_SYMLINK"]),
    (untracked_fifo, ["UNTRACKED_NOT_REGULAR"]),
    (nested_repo, ["UNTRACKED_NOT_REGULAR"]),
    (garbage_head, ["HEAD_UNRESOLVABLE"]),
    (head_missing_object, ["HEAD_UNRESOLVABLE"]),
    (head_is_a_blob, ["HEAD_UNRESOLVABLE"]),
    (branch_without_commit, ["HEAD_UNBORN"]),
    (sparse, ["SPARSE_CHECKOUT"]),
    (sparse_old_style, ["SPARSE_CHECKOUT"]),
]


def test_clean_repository_is_ok(repo: Repo) -> None:
    report = check_health(repo.path)
    assert report.ok
    assert report.reasons == []
    assert report.kind == "repository"
    assert report.head == repo.head()
    assert report.counts.model_dump() == {
        "staged_files": 0,
        "unstaged_files": 0,
        "untracked_files": 0,
        "changed_files": 0,
        "local_bytes": 0,
    }
    assert not report.dirty
    assert not report.converting
    baseline, _ = build_baseline(repo.path)
    assert baseline.head == repo.head()
    assert baseline.commit == repo.head()


@pytest.mark.parametrize(("make", "expected"), BLOCKED, ids=[m.__name__ for m, _ in BLOCKED])
def test_blocked_state_has_its_reason_codes(
    repo: Repo, make: Callable[[Repo], None], expected: list[str]
) -> None:
    make(repo)
    report = check_health(repo.path)
    assert codes(report) == expected
    assert not report.ok
    for mode in ("require-clean", "include-local-changes"):
        with pytest.raises(RepoBlockedError) as caught:
            build_baseline(repo.path, mode)
        assert caught.value.code == ErrorCode.REPO_BLOCKED
        assert [r.code for r in caught.value.reasons] == expected


def test_unborn_head_of_a_new_repository(tmp_path: Path, env: dict[str, str]) -> None:
    repo = init(tmp_path / "new", env=env)
    repo.write("a.txt", "a\n")
    assert codes(check_health(repo.path)) == ["HEAD_UNBORN"]
    with pytest.raises(RepoBlockedError) as caught:
        build_baseline(repo.path, "include-local-changes")
    assert [r.code for r in caught.value.reasons] == ["HEAD_UNBORN"]


@pytest.mark.parametrize(
    ("limits", "expected"),
    [
        (SnapshotLimits(max_files=3, max_bytes=100), []),
        (SnapshotLimits(max_files=2, max_bytes=100), ["LOCAL_CHANGES_TOO_MANY_FILES"]),
        (SnapshotLimits(max_files=3, max_bytes=29), ["LOCAL_CHANGES_TOO_LARGE"]),
        (
            SnapshotLimits(max_files=0, max_bytes=0),
            ["LOCAL_CHANGES_TOO_MANY_FILES", "LOCAL_CHANGES_TOO_LARGE"],
        ),
    ],
)
def test_local_changes_over_the_limits(
    repo: Repo, limits: SnapshotLimits, expected: list[str]
) -> None:
    repo.write("a.txt", "0123456789")  # unstaged, 10 bytes
    repo.write("new.txt", "0123456789")  # untracked, 10 bytes
    repo.write("sub/new.txt", "0123456789")  # untracked, 10 bytes
    repo.write("skip.log", "x" * 1000)  # ignored: counts nothing
    report = check_health(repo.path, limits)
    assert codes(report) == expected
    assert (report.counts.changed_files, report.counts.local_bytes) == (3, 30)
    if expected:
        with pytest.raises(RepoBlockedError) as caught:
            build_baseline(repo.path, "include-local-changes", limits)
        assert [r.code for r in caught.value.reasons] == expected
    else:
        baseline, _ = build_baseline(repo.path, "include-local-changes", limits)
        assert baseline.counts == report.counts


def test_counts_of_a_mixed_tree(repo: Repo) -> None:
    for name in ("c.txt", "d.txt", "e.txt", "f.txt"):
        repo.write(name, f"{name}\n")
    repo.commit("more")
    repo.write("a.txt", "staged\n")  # 7 bytes
    repo.git("add", "a.txt")
    repo.write("b.txt", "unstaged\n")  # 9 bytes
    repo.write("c.txt", "c staged\n")
    repo.git("add", "c.txt")
    repo.write("c.txt", "c staged, then changed\n")  # both, 23 bytes
    repo.git("rm", "-q", "d.txt")  # staged deletion
    (repo.path / "e.txt").unlink()  # unstaged deletion
    repo.git("mv", "f.txt", "g.txt")  # staged deletion + staged addition, 6 bytes
    repo.write("new.txt", "new\n")  # untracked, 4 bytes
    repo.write("dir/deep/u.txt", "")  # untracked, empty
    repo.write("skip.log", "ignored\n")
    repo.write("ignored/x.txt", "ignored\n")
    (repo.path / "ignored" / "link").symlink_to("../a.txt")  # ignored: not a reason
    os.mkfifo(repo.path / "ignored" / "fifo")  # ignored: not a reason
    report = check_health(repo.path)
    assert report.ok, report.reasons
    assert report.counts.model_dump() == {
        "staged_files": 5,  # a c d f g
        "unstaged_files": 3,  # b c e
        "untracked_files": 2,  # new.txt dir/deep/u.txt
        "changed_files": 9,
        "local_bytes": 7 + 9 + 23 + 6 + 4 + 0,
    }
    assert report.dirty
    with pytest.raises(PatchboxError) as caught:
        build_baseline(repo.path)
    assert caught.value.code == ErrorCode.CONSENT_REQUIRED
    baseline, _ = build_baseline(repo.path, "include-local-changes")
    assert baseline.counts == report.counts


@pytest.mark.parametrize(
    "make",
    [
        lambda r: r.write("new.txt", "new\n"),
        lambda r: r.write("a.txt", "changed\n"),
        lambda r: (r.path / "b.txt").unlink(),
        lambda r: r.git("rm", "-q", "--cached", "b.txt"),
        lambda r: (r.path / "b.txt").chmod(0o755),
    ],
    ids=["untracked", "unstaged", "deleted", "staged-deletion", "mode"],
)
def test_require_clean_refuses_any_local_change(repo: Repo, make: Callable[[Repo], object]) -> None:
    make(repo)
    assert check_health(repo.path).dirty
    with pytest.raises(PatchboxError) as caught:
        build_baseline(repo.path, "require-clean")
    assert caught.value.code == ErrorCode.CONSENT_REQUIRED


def test_ignored_and_tracked_special_files_do_not_block(repo: Repo) -> None:
    (repo.path / "tracked-link").symlink_to("a.txt")
    repo.commit("link")
    repo.write("build.log", "x\n")
    report = check_health(repo.path)
    assert report.ok, report.reasons
    assert not report.dirty


def test_linked_worktree_has_its_own_head(tmp_path: Path, repo: Repo) -> None:
    main_head = repo.head()
    repo.git("worktree", "add", "-q", "-b", "side", str(tmp_path / "wt"))
    wt = Repo(tmp_path / "wt", repo.env)
    wt.write("a.txt", "worktree\n")
    wt_head = wt.commit("in the worktree")
    assert locate(wt.path).kind == "linked-worktree"
    report = check_health(wt.path)
    assert report.ok, report.reasons
    assert (report.kind, report.head) == ("linked-worktree", wt_head)
    baseline, _ = build_baseline(wt.path)
    assert (baseline.head, baseline.commit) == (wt_head, wt_head)
    assert baseline.tree == wt.git("rev-parse", "HEAD^{tree}")
    files, _ = archive_files(baseline)
    assert files["a.txt"] == (b"worktree\n", False)
    assert check_health(repo.path).head == main_head

    wt.write("untracked.txt", "u\n")
    baseline, report = build_baseline(wt.path, "include-local-changes")
    assert report.counts.untracked_files == 1
    assert archive_files(baseline)[0] == work_tree_files(wt.path)


def test_worktree_in_progress_state_is_its_own(tmp_path: Path, repo: Repo) -> None:
    repo.git("worktree", "add", "-q", "-b", "side", str(tmp_path / "wt"))
    wt = Repo(tmp_path / "wt", repo.env)
    wt.git("bisect", "start")
    assert codes(check_health(wt.path)) == ["BISECT_IN_PROGRESS"]
    assert codes(check_health(repo.path)) == []


def test_separate_git_dir(tmp_path: Path, env: dict[str, str]) -> None:
    repo = init(tmp_path / "wt", BASE, "--separate-git-dir", str(tmp_path / "store.git"), env=env)
    assert (repo.path / ".git").is_file()
    report = check_health(repo.path)
    assert report.ok, report.reasons
    assert (report.kind, report.head) == ("gitdir-file", repo.head())
    repo.write("b.txt", "changed\n")
    baseline, _ = build_baseline(repo.path, "include-local-changes")
    assert archive_files(baseline)[0] == work_tree_files(repo.path)


def test_bare_repository(tmp_path: Path, env: dict[str, str]) -> None:
    init(tmp_path / "src", BASE, env=env)
    bare = tmp_path / "repo.git"
    Repo(tmp_path, env).git("clone", "-q", "--bare", str(tmp_path / "src"), str(bare))
    assert codes(check_health(bare)) == ["BARE_REPOSITORY"]
    with pytest.raises(NotARepositoryError) as caught:
        build_baseline(bare)
    assert caught.value.code == ErrorCode.NOT_A_REPOSITORY


@pytest.mark.parametrize("name", ["plain", "bare-looking-name"])
def test_plain_folder(tmp_path: Path, env: dict[str, str], name: str) -> None:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "file.txt").write_text("x\n")
    assert codes(check_health(folder)) == ["NOT_A_REPOSITORY"]
    assert codes(check_health(tmp_path / "missing")) == ["NOT_A_REPOSITORY"]
    with pytest.raises(NotARepositoryError) as caught:
        build_baseline(folder)
    assert caught.value.code == ErrorCode.NOT_A_REPOSITORY


def test_subfolder_of_a_repository(repo: Repo) -> None:
    sub = repo.write("pkg/mod.py", "x = 1\n").parent
    repo.commit("pkg")
    report = check_health(sub)
    assert codes(report) == ["NOT_TOP_LEVEL"]
    with pytest.raises(RepoBlockedError) as caught:
        build_baseline(sub)
    assert caught.value.code == ErrorCode.NOT_A_REPOSITORY
    assert [r.code for r in caught.value.reasons] == ["NOT_TOP_LEVEL"]


def test_submodule_is_listed_and_not_entered(tmp_path: Path, env: dict[str, str]) -> None:
    lib = init(tmp_path / "lib", {"lib.txt": "library\n"}, env=env)
    repo = init(tmp_path / "repo", BASE, env=env)
    repo.git(
        "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(lib.path), "vendor/lib"
    )
    repo.commit("submodule")
    assert (repo.path / "vendor" / "lib" / "lib.txt").is_file()
    (repo.path / "vendor" / "lib" / "lib.txt").write_text("changed inside the submodule\n")
    report = check_health(repo.path)
    assert report.ok, report.reasons
    assert report.submodules == ["vendor/lib"]
    assert not report.dirty
    baseline, _ = build_baseline(repo.path)
    files, folders = archive_files(baseline)
    assert "vendor/lib" in folders
    assert not [name for name in files if name.startswith("vendor/lib/")]
    assert set(files) == {*BASE, ".gitmodules"}

    repo.write("a.txt", "local\n")
    baseline, _ = build_baseline(repo.path, "include-local-changes")
    files, folders = archive_files(baseline)
    assert "vendor/lib" in folders
    assert files["a.txt"] == (b"local\n", False)
    assert not [name for name in files if name.startswith("vendor/lib/")]
