"""A job's diff carried onto the repository as it is now (``patchbox rebase``), on real
repositories: an unrelated commit, a commit to the same file in another hunk (merged
three-way), a conflicting one (refused naming the file and the lines, nothing written), and
the cases no merge can settle."""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.changes.carry import LineRange, carry, conflict_ranges
from controller.errors import ErrorCode, RebaseConflictError
from controller.repo.baseline import Baseline, build_baseline
from tests.support.git import Repo, init, status

LINES = "".join(f"line {i}\n" for i in range(1, 21))


def _job_diff(repo: Repo, files: dict[str, str | None]) -> str:
    """The diff a job would bring back: ``files`` written (None removes) on HEAD, diffed
    as a job's diff is (full index lines, no renames), then the work tree put back."""
    for name, text in files.items():
        if text is None:
            (repo.path / name).unlink()
        else:
            repo.write(name, text)
    repo.git("add", "-A")
    diff = repo.git("diff", "--cached", "--full-index", "--no-renames", "HEAD") + "\n"
    repo.git("reset", "-q", "--hard", "HEAD")
    return diff


def _result(repo: Repo, new: Baseline, diff: str, tmp: Path) -> dict[str, str]:
    """The files of ``new`` with ``diff`` applied by ``git apply`` in a scratch clone."""
    clone = tmp / "clone"
    repo.git("worktree", "add", "-q", "--detach", str(clone), new.commit)
    if diff:
        proc = Repo(clone, repo.env).run("apply", "--index", "-", stdin=diff.encode())
        assert proc.returncode == 0, proc.stderr.decode()
    out = {
        str(p.relative_to(clone)): p.read_text()
        for p in clone.rglob("*")
        if p.is_file() and ".git" not in p.parts
    }
    repo.git("worktree", "remove", "--force", str(clone))
    return out


@pytest.fixture
def repo(tmp_path: Path) -> Repo:
    return init(tmp_path / "repo", {"a.py": LINES, "b.py": "b\n", "gone.py": "g\n"})


def test_an_unrelated_commit_carries_the_diff_as_it_was(repo: Repo, tmp_path: Path) -> None:
    old = build_baseline(repo.path)[0]
    diff = _job_diff(repo, {"a.py": LINES.replace("line 3\n", "line three\n")})
    repo.write("c.py", "new upstream\n")
    repo.commit("unrelated")
    new = build_baseline(repo.path)[0]
    carried = carry(old, diff, new)
    assert carried.merged == []
    assert carried.collected.diff == diff.rstrip("\n") + "\n"
    files = _result(repo, new, carried.collected.diff, tmp_path)
    assert files["a.py"] == LINES.replace("line 3\n", "line three\n")
    assert files["c.py"] == "new upstream\n"


def test_another_hunk_of_the_same_file_is_merged(repo: Repo, tmp_path: Path) -> None:
    old = build_baseline(repo.path)[0]
    diff = _job_diff(repo, {"a.py": LINES.replace("line 3\n", "line three\n")})
    repo.write("a.py", LINES.replace("line 17\n", "line seventeen\n"))
    repo.commit("upstream edit, another hunk")
    new = build_baseline(repo.path)[0]
    carried = carry(old, diff, new)
    assert carried.merged == ["a.py"]
    [changed] = carried.collected.files
    assert (changed.path, changed.kind) == ("a.py", "modified")
    files = _result(repo, new, carried.collected.diff, tmp_path)
    want = LINES.replace("line 3\n", "line three\n").replace("line 17\n", "line seventeen\n")
    assert files["a.py"] == want
    assert "-line 17" not in carried.collected.diff  # relative to the new baseline


def test_a_conflict_names_the_file_and_the_lines_and_writes_nothing(repo: Repo) -> None:
    old = build_baseline(repo.path)[0]
    diff = _job_diff(repo, {"a.py": LINES.replace("line 5\n", "job's five\n")})
    repo.write("a.py", LINES.replace("line 5\n", "upstream five\n"))
    head = repo.commit("upstream edit, same line")
    before = status(repo.path)
    new = build_baseline(repo.path)[0]
    with pytest.raises(RebaseConflictError) as caught:
        carry(old, diff, new)
    err = caught.value
    assert err.code == ErrorCode.REBASE_CONFLICT
    [conflict] = err.conflicts
    assert (conflict.code, conflict.path) == ("merge_conflict", "a.py")
    assert "1 overlapping change(s) at line 5" in conflict.message
    assert conflict.detail is not None
    assert "upstream five" in conflict.detail
    assert "a.py (1 overlapping change(s) at line 5)" in err.message
    assert err.message.endswith("nothing was written")
    assert (repo.head(), status(repo.path)) == (head, before)
    assert (repo.path / "a.py").read_text() == LINES.replace("line 5\n", "upstream five\n")


def test_what_no_merge_settles_is_a_conflict_each(repo: Repo) -> None:
    old = build_baseline(repo.path)[0]
    diff = _job_diff(
        repo,
        {"b.py": "b changed\n", "gone.py": None, "new.py": "job's new\n"},
    )
    (repo.path / "b.py").unlink()
    repo.write("gone.py", "g changed upstream\n")
    repo.write("new.py", "upstream's new\n")
    repo.commit("upstream")
    new = build_baseline(repo.path)[0]
    with pytest.raises(RebaseConflictError) as caught:
        carry(old, diff, new)
    got = {c.path: c.code for c in caught.value.conflicts}
    assert got == {"b.py": "missing", "gone.py": "changed", "new.py": "exists"}
    assert "3 file(s) do not merge" in caught.value.message


def test_a_change_made_upstream_too_leaves_nothing_to_carry(repo: Repo) -> None:
    old = build_baseline(repo.path)[0]
    diff = _job_diff(repo, {"b.py": "b fixed\n", "new.py": "same\n", "gone.py": None})
    repo.write("b.py", "b fixed\n")
    repo.write("new.py", "same\n")
    (repo.path / "gone.py").unlink()
    repo.commit("upstream did the same")
    new = build_baseline(repo.path)[0]
    carried = carry(old, diff, new)
    assert carried.collected.diff == ""
    assert carried.collected.files == []


def test_created_and_removed_files_are_carried(repo: Repo, tmp_path: Path) -> None:
    old = build_baseline(repo.path)[0]
    diff = _job_diff(repo, {"tool.sh": "#!/bin/sh\necho hi\n", "gone.py": None, "b.py": "b\n"})
    repo.write("a.py", LINES + "line 21\n")
    repo.commit("unrelated")
    new = build_baseline(repo.path)[0]
    carried = carry(old, diff, new)
    kinds = {f.path: (f.kind, f.mode) for f in carried.collected.files}
    assert kinds == {"gone.py": ("removed", None), "tool.sh": ("added", "100644")}
    assert "new file mode 100644" in carried.collected.diff
    files = _result(repo, new, carried.collected.diff, tmp_path)
    assert "gone.py" not in files
    assert files["tool.sh"] == "#!/bin/sh\necho hi\n"


def test_conflict_ranges_are_lines_of_the_repository_s_version() -> None:
    merged = (
        b"one\n<<<<<<< now\ntwo\nthree\n=======\nTWO\n>>>>>>> job\nfour\n"
        b"<<<<<<< now\n||||||| base\nold\n=======\nadded\n>>>>>>> job\nfive\n"
    )
    assert conflict_ranges(merged) == [LineRange(2, 3), LineRange(5, 5)]
    assert [r.text() for r in conflict_ranges(merged)] == ["lines 2-3", "line 5"]
