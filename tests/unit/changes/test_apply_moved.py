"""apply after HEAD moved: commits and branch switches since the baseline do not stop an
apply while every path the diff touches still holds its baseline bytes; a touched file the
user changed is refused by name (with the ``--merge`` command), merged three-way with
``--merge`` (a conflict of any file writes nothing at all), and revert restores exactly
what the apply replaced. Real repositories, the real apply code, no Docker."""

from __future__ import annotations

import json
import uuid
from dataclasses import replace
from pathlib import Path

import pytest

from controller.changes.apply import apply_changeset, job_state, revert_changeset
from controller.changes.conflicts import NAMED_LIMIT
from controller.changes.journal import Journal
from controller.errorinfo import Hint
from controller.errors import ApplyConflictError, ErrorCode, RevertConflictError
from controller.jobs.records import JobRecord
from controller.jobs.store import JobStore
from controller.repo.baseline import Baseline, build_baseline
from tests.support.cli import patchbox
from tests.support.git import Repo, init, make_diff
from tests.support.worktree import Snapshot, snapshot


def lines(name: str, changed: dict[int, str] | None = None, count: int = 20) -> bytes:
    """``count`` numbered lines of ``name``, some replaced."""
    changed = changed or {}
    return "".join(changed.get(i, f"{name} line {i}") + "\n" for i in range(1, count + 1)).encode()


BASE: dict[str, bytes] = {
    "README.md": b"# project\n",
    "a.txt": lines("a"),
    "b.txt": lines("b"),
    "d.txt": lines("d"),
    "r_old.txt": lines("r"),
    "keep.txt": b"keep\n",
}
# The job: modifies a.txt and b.txt, deletes d.txt, renames r_old.txt (with a change) and
# creates a file in a new folder. README.md and keep.txt are not touched.
BEFORE = {name: BASE[name] for name in ("a.txt", "b.txt", "d.txt", "r_old.txt")}
AFTER = {
    "a.txt": lines("a", {15: "a line 15 by the job"}),
    "b.txt": lines("b", {10: "b line 10 by the job"}),
    "r_new.txt": lines("r", {18: "r line 18 by the job"}),
    "sub/new.txt": b"created by the job\n",
}


@pytest.fixture
def repo(tmp_path: Path) -> Repo:
    return init(tmp_path / "repo", BASE, message="base")


@pytest.fixture
def baseline(repo: Repo) -> Baseline:
    return build_baseline(repo.path)[0]


@pytest.fixture
def diff(tmp_path: Path) -> str:
    text = make_diff(tmp_path, BEFORE, AFTER)
    assert "rename from r_old.txt" in text
    return text


@pytest.fixture
def journal(tmp_path: Path) -> Journal:
    return Journal(tmp_path / "journal")


def applied(before: Snapshot, *, merged: dict[str, bytes] | None = None) -> Snapshot:
    """``before`` with the job's diff applied (``merged``: paths whose content is a merge)."""
    files = dict(before.files)
    mode_r = files["r_old.txt"][0]
    for name in ("d.txt", "r_old.txt"):
        del files[name]
    for name, data in {**AFTER, **(merged or {})}.items():
        mode = mode_r if name == "r_new.txt" else files.get(name, (0o644, b""))[0]
        files[name] = (mode, data)
    return replace(before, files=files, folders=before.folders | {"sub"})


def commit_readme(repo: Repo, text: bytes = b"# project\n\nmore words\n") -> str:
    repo.write("README.md", text)
    return repo.commit("readme only", "README.md")


def assert_nothing_written(repo: Repo, before: Snapshot, journal: Journal, job: str) -> None:
    assert snapshot(repo.path) == before
    assert journal.phase(job) == "none"
    assert not list(repo.path.rglob(".patchbox-*"))


# --------------------------------------------------------------------------------------
# HEAD moved, the touched paths did not


@pytest.mark.parametrize("merge", [False, True], ids=["plain", "merge"])
def test_an_unrelated_commit_does_not_stop_apply(
    repo: Repo, baseline: Baseline, diff: str, journal: Journal, merge: bool
) -> None:
    old_head = repo.head()
    assert commit_readme(repo) != old_head
    before = snapshot(repo.path)
    result = apply_changeset(baseline, diff, job_id="j", journal=journal, merge=merge)
    assert snapshot(repo.path) == applied(before)
    assert result.merged == []
    assert sorted((f.path, f.change) for f in result.files) == [
        ("a.txt", "modify"),
        ("b.txt", "modify"),
        ("d.txt", "delete"),
        ("r_new.txt", "create"),
        ("r_old.txt", "delete"),
        ("sub/new.txt", "create"),
    ]
    assert journal.read_record("j").record.head == old_head  # the baseline's, for the record
    revert_changeset("j", journal=journal)
    assert snapshot(repo.path) == before
    assert job_state("j", journal=journal).state == "not_applied"


def test_a_branch_switch_that_leaves_the_touched_paths_does_not_stop_apply(
    repo: Repo, baseline: Baseline, diff: str, journal: Journal
) -> None:
    repo.git("checkout", "-q", "-b", "other")
    commit_readme(repo)
    repo.write("other.txt", "only on the other branch\n")
    repo.commit("other")
    repo.git("checkout", "-q", "main")
    repo.git("checkout", "-q", "other")  # HEAD is now another branch, two commits ahead
    assert repo.git("symbolic-ref", "HEAD") == "refs/heads/other"
    before = snapshot(repo.path)
    apply_changeset(baseline, diff, job_id="j", journal=journal)
    assert snapshot(repo.path) == applied(before)
    repo.git("checkout", "-q", "--detach", "main")  # HEAD moves again: README.md only
    between = snapshot(repo.path)
    revert_changeset("j", journal=journal)
    restored = snapshot(repo.path)
    assert restored.files == {
        **{k: v for k, v in between.files.items() if k not in AFTER},
        **{k: (between.files["a.txt"][0], BASE[k]) for k in BEFORE},
    }
    assert "sub" not in restored.folders


def test_a_branch_switch_that_changes_a_touched_path_is_refused(
    repo: Repo, baseline: Baseline, diff: str, journal: Journal
) -> None:
    repo.git("checkout", "-q", "-b", "other")
    repo.write("b.txt", lines("b", {1: "b line 1 on the other branch"}))
    repo.commit("other b")
    before = snapshot(repo.path)
    with pytest.raises(ApplyConflictError) as info:
        apply_changeset(baseline, diff, job_id="j", journal=journal)
    assert [(c.code, c.path) for c in info.value.conflicts] == [("changed", "b.txt")]
    assert "b.txt (changed)" in info.value.message
    assert info.value.hint == Hint(option="merge", job_id="j")
    assert_nothing_written(repo, before, journal, "j")


# --------------------------------------------------------------------------------------
# A touched file the user changed: refused by name, or merged with --merge


def test_a_changed_touched_file_is_refused_by_name_with_the_merge_command(
    repo: Repo, baseline: Baseline, diff: str, journal: Journal
) -> None:
    commit_readme(repo)
    repo.write("a.txt", lines("a", {2: "a line 2 by the user"}))
    repo.commit("user edits a.txt")
    before = snapshot(repo.path)
    with pytest.raises(ApplyConflictError) as info:
        apply_changeset(baseline, diff, job_id="job-7", journal=journal)
    assert info.value.code == ErrorCode.APPLY_CONFLICT
    assert [(c.code, c.path) for c in info.value.conflicts] == [("changed", "a.txt")]
    message = info.value.message
    assert message.startswith("cannot apply: 1 file(s) the diff touches differ from the baseline")
    assert "a.txt (changed)" in message
    assert message.endswith("; nothing was written")
    assert info.value.hint == Hint(option="merge", job_id="job-7")
    assert "--merge" not in message  # the engine names the option; a front door says it
    assert "head" not in message.lower()
    assert "\n" not in message
    assert_nothing_written(repo, before, journal, "job-7")


def test_merge_of_a_non_overlapping_user_change_keeps_both(
    repo: Repo, baseline: Baseline, diff: str, journal: Journal
) -> None:
    commit_readme(repo)
    user_a = lines("a", {2: "a line 2 by the user"})
    repo.write("a.txt", user_a)
    repo.commit("user edits a.txt")
    repo.write("b.txt", lines("b", {20: "b line 20, not committed"}))  # unstaged
    before = snapshot(repo.path)
    result = apply_changeset(baseline, diff, job_id="j", journal=journal, merge=True)
    both_a = lines("a", {2: "a line 2 by the user", 15: "a line 15 by the job"})
    both_b = lines("b", {10: "b line 10 by the job", 20: "b line 20, not committed"})
    assert snapshot(repo.path) == applied(before, merged={"a.txt": both_a, "b.txt": both_b})
    assert result.merged == ["a.txt", "b.txt"]
    by_path = {f.path: f for f in result.files}
    assert by_path["a.txt"].merged
    assert not by_path["d.txt"].merged
    revert_changeset("j", journal=journal)
    assert snapshot(repo.path) == before
    assert (repo.path / "a.txt").read_bytes() == user_a


def test_merge_of_a_renamed_file_the_user_changed(
    repo: Repo, baseline: Baseline, diff: str, journal: Journal
) -> None:
    user_r = lines("r", {3: "r line 3 by the user"})
    repo.write("r_old.txt", user_r)
    before = snapshot(repo.path)
    with pytest.raises(ApplyConflictError) as info:
        apply_changeset(baseline, diff, job_id="j", journal=journal)
    assert [(c.code, c.path) for c in info.value.conflicts] == [("changed", "r_old.txt")]
    assert info.value.hint == Hint(option="merge", job_id="j")
    assert_nothing_written(repo, before, journal, "j")

    result = apply_changeset(baseline, diff, job_id="j", journal=journal, merge=True)
    both = lines("r", {3: "r line 3 by the user", 18: "r line 18 by the job"})
    assert snapshot(repo.path) == applied(before, merged={"r_new.txt": both})
    assert result.merged == ["r_new.txt", "r_old.txt"]
    revert_changeset("j", journal=journal)
    assert snapshot(repo.path) == before


def test_an_overlapping_change_is_a_conflict_of_that_file_and_nothing_is_written(
    repo: Repo, baseline: Baseline, diff: str, journal: Journal
) -> None:
    commit_readme(repo)
    repo.write("a.txt", lines("a", {15: "a line 15 by the user"}))  # overlaps the job's
    repo.write("b.txt", lines("b", {1: "b line 1 by the user"}))  # would merge cleanly
    repo.commit("user edits")
    before = snapshot(repo.path)
    with pytest.raises(ApplyConflictError) as info:
        apply_changeset(baseline, diff, job_id="j", journal=journal, merge=True)
    (conflict,) = info.value.conflicts
    assert (conflict.code, conflict.path) == ("merge_conflict", "a.txt")
    assert conflict.message == "1 overlapping change(s)"
    assert conflict.detail is not None
    assert "<<<<<<< work tree" in conflict.detail
    assert "a line 15 by the user" in conflict.detail
    assert "a line 15 by the job" in conflict.detail
    message = info.value.message
    assert "1 file(s) do not merge cleanly: a.txt (1 overlapping change(s))" in message
    assert "b.txt" not in message
    assert "--merge" not in message
    assert info.value.hint is None
    assert "nothing was written" in message
    # b.txt is not merged, d.txt not deleted, nothing created: no write at all
    assert_nothing_written(repo, before, journal, "j")


def test_every_file_that_does_not_merge_is_reported(
    repo: Repo, baseline: Baseline, diff: str, journal: Journal
) -> None:
    repo.write("a.txt", lines("a", {15: "a: the user's line 15"}))
    repo.write("b.txt", lines("b", {10: "b: the user's line 10"}))
    repo.write("r_old.txt", lines("r", {18: "r: the user's line 18"}))
    repo.write("d.txt", lines("d", {1: "the job deletes this; the user changed it"}))
    before = snapshot(repo.path)
    with pytest.raises(ApplyConflictError) as info:
        apply_changeset(baseline, diff, job_id="j", journal=journal, merge=True)
    assert sorted((c.code, c.path) for c in info.value.conflicts) == [
        ("changed", "d.txt"),
        ("merge_conflict", "a.txt"),
        ("merge_conflict", "b.txt"),
        ("merge_conflict", "r_old.txt"),
    ]
    message = info.value.message
    assert "1 file(s) the diff touches differ from the baseline: d.txt (changed)" in message
    assert "3 file(s) do not merge cleanly: " in message
    for name in ("a.txt", "b.txt", "r_old.txt"):
        assert f"{name} (1 overlapping change(s))" in message
    assert_nothing_written(repo, before, journal, "j")


def test_a_deleted_file_the_user_changed_is_not_merged_and_merge_is_not_suggested(
    repo: Repo, baseline: Baseline, diff: str, journal: Journal
) -> None:
    repo.write("d.txt", b"the user's own content\n")
    before = snapshot(repo.path)
    for merge in (False, True):
        with pytest.raises(ApplyConflictError) as info:
            apply_changeset(baseline, diff, job_id="j", journal=journal, merge=merge)
        assert [(c.code, c.path) for c in info.value.conflicts] == [("changed", "d.txt")]
        assert "d.txt (changed)" in info.value.message
        assert "--merge" not in info.value.message
        assert info.value.hint is None
    assert_nothing_written(repo, before, journal, "j")


def test_the_message_names_a_bounded_number_of_files(tmp_path: Path, journal: Journal) -> None:
    names = [f"f{i:02}.txt" for i in range(NAMED_LIMIT + 4)]
    repo = init(tmp_path / "many", {n: lines(n) for n in names}, message="base")
    base = build_baseline(repo.path)[0]
    diff = make_diff(
        tmp_path, {n: lines(n) for n in names}, {n: lines(n, {5: "job"}) for n in names}
    )
    for name in names:
        repo.write(name, lines(name, {1: "user"}))
    repo.commit("user")
    with pytest.raises(ApplyConflictError) as info:
        apply_changeset(base, diff, job_id="j", journal=journal)
    assert len(info.value.conflicts) == len(names)
    message = info.value.message
    assert f"{len(names)} file(s) the diff touches differ" in message
    assert all(f"{n} (changed)" in message for n in names[:NAMED_LIMIT])
    assert not any(n in message for n in names[NAMED_LIMIT:])
    assert "and 4 more" in message
    before = snapshot(repo.path)
    result = apply_changeset(base, diff, job_id="j", journal=journal, merge=True)
    assert result.merged == names
    assert all((repo.path / n).read_bytes() == lines(n, {1: "user", 5: "job"}) for n in names)
    revert_changeset("j", journal=journal)
    assert snapshot(repo.path) == before


# --------------------------------------------------------------------------------------
# Still refused: a git operation in progress


def test_a_merge_in_progress_after_new_commits_is_refused(
    repo: Repo, baseline: Baseline, diff: str, journal: Journal
) -> None:
    repo.git("checkout", "-q", "-b", "other")
    commit_readme(repo, b"# other\n")
    repo.git("checkout", "-q", "main")
    commit_readme(repo, b"# main\n")
    assert repo.run("merge", "-q", "other").returncode != 0  # README.md conflicts
    assert (repo.git_dir / "MERGE_HEAD").exists()
    before = snapshot(repo.path)
    for merge in (False, True):
        with pytest.raises(ApplyConflictError) as info:
            apply_changeset(baseline, diff, job_id="j", journal=journal, merge=merge)
        assert [c.code for c in info.value.conflicts] == ["operation_in_progress"]
        assert "MERGE_IN_PROGRESS" in info.value.message
        assert "finish or abort it" in info.value.message
    assert_nothing_written(repo, before, journal, "j")


def test_a_rebase_stopped_on_a_conflict_is_refused(
    repo: Repo, baseline: Baseline, diff: str, journal: Journal
) -> None:
    repo.git("checkout", "-q", "-b", "other")
    commit_readme(repo, b"# other\n")
    repo.git("checkout", "-q", "main")
    commit_readme(repo, b"# main\n")
    assert repo.run("rebase", "other").returncode != 0
    before = snapshot(repo.path)
    with pytest.raises(ApplyConflictError) as info:
        apply_changeset(baseline, diff, job_id="j", journal=journal, merge=True)
    assert [c.code for c in info.value.conflicts] == ["operation_in_progress"]
    assert "REBASE_IN_PROGRESS" in info.value.message
    assert_nothing_written(repo, before, journal, "j")


# --------------------------------------------------------------------------------------
# Revert of an apply made after HEAD moved


def test_revert_refuses_when_a_merged_file_changed_after_the_apply(
    repo: Repo, baseline: Baseline, diff: str, journal: Journal
) -> None:
    commit_readme(repo)
    user_a = lines("a", {2: "a line 2 by the user"})
    repo.write("a.txt", user_a)
    repo.commit("user edits a.txt")
    before = snapshot(repo.path)
    apply_changeset(baseline, diff, job_id="j", journal=journal, merge=True)
    repo.commit("the user commits the applied job")  # HEAD moves again; bytes unchanged
    repo.write("a.txt", b"edited after the apply\n")
    edited = snapshot(repo.path)
    with pytest.raises(RevertConflictError) as info:
        revert_changeset("j", journal=journal)
    assert [(c.code, c.path) for c in info.value.conflicts] == [("changed", "a.txt")]
    assert snapshot(repo.path) == edited
    assert job_state("j", journal=journal).state == "applied"
    merged_a = lines("a", {2: "a line 2 by the user", 15: "a line 15 by the job"})
    repo.write("a.txt", merged_a)
    revert_changeset("j", journal=journal)
    reverted = snapshot(repo.path)
    assert reverted.files == before.files
    assert reverted.folders == before.folders


def test_revert_refuses_during_a_git_operation(
    repo: Repo, baseline: Baseline, diff: str, journal: Journal
) -> None:
    commit_readme(repo)
    apply_changeset(baseline, diff, job_id="j", journal=journal)
    (repo.git_dir / "index.lock").write_bytes(b"")
    with pytest.raises(RevertConflictError) as info:
        revert_changeset("j", journal=journal)
    assert [c.code for c in info.value.conflicts] == ["operation_in_progress"]
    (repo.git_dir / "index.lock").unlink()
    revert_changeset("j", journal=journal)


# --------------------------------------------------------------------------------------
# Through the CLI, on a job record awaiting review (no Docker needed)


def test_apply_and_revert_through_the_cli_after_head_moved(
    repo: Repo, baseline: Baseline, diff: str
) -> None:
    job_id = f"moved-{uuid.uuid4().hex[:12]}"
    store = JobStore()
    record = JobRecord(job_id=job_id, repo=str(repo.path), baseline=baseline)
    record.state = "awaiting_review"
    store.save(record)
    (store.folder(job_id) / "diff.patch").write_text(diff)
    commit_readme(repo)
    user_a = lines("a", {2: "a line 2 by the user"})
    repo.write("a.txt", user_a)
    repo.commit("user edits a.txt")
    before = snapshot(repo.path)

    refused = patchbox("apply", job_id, "--json")
    assert refused.returncode == 1, refused.stderr
    error = json.loads(refused.stdout)["error"]
    assert error["code"] == "APPLY_CONFLICT"
    assert "a.txt (changed)" in error["message"]
    assert error["message"].endswith(
        f"; to merge your changes three-way: patchbox apply {job_id} --merge"
    )
    assert error["hint"] == {
        "option": "merge",
        "job_id": job_id,
        "text": f"to merge your changes three-way: patchbox apply {job_id} --merge",
    }
    assert f"patchbox apply {job_id} --merge" in refused.stderr
    assert snapshot(repo.path) == before
    assert store.load(job_id).state == "awaiting_review"

    done = patchbox("apply", job_id, "--merge", "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert (data["status"], data["merged"]) == ("applied", ["a.txt"])
    both_a = lines("a", {2: "a line 2 by the user", 15: "a line 15 by the job"})
    assert snapshot(repo.path) == applied(before, merged={"a.txt": both_a})

    reverted = patchbox("revert", job_id, "--json")
    assert reverted.returncode == 0, reverted.stderr
    assert json.loads(reverted.stdout)["status"] == "reverted"
    assert snapshot(repo.path) == before
