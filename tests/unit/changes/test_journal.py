"""journal: the write-ahead record, and crash safety of apply and revert.

The kill matrix runs apply (and revert) in a real child process that SIGKILLs itself at each
step (``PATCHBOX_FAULT_POINT``); then a fresh process runs ``recover()``. The rule checked:
an operation that did not reach its done marker is rolled back, so the user's repository is
byte for byte either as before the apply or as after it, never in between.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from controller.changes.apply import apply_changeset, job_state, recover, revert_changeset
from controller.changes.journal import (
    FAULT_ENV,
    ApplyRecord,
    Journal,
    PathRecord,
    Side,
    contents_digest,
)
from controller.errors import (
    ApplyConflictError,
    JournalCorruptError,
    RevertConflictError,
    UsageError,
)
from controller.repo.baseline import build_baseline
from tests.support.git import git, init, make_diff, status
from tests.support.paths import REPO_ROOT
from tests.support.worktree import Snapshot, snapshot

ROOT = REPO_ROOT

CHILD = """
import json, sys
from pathlib import Path
from controller.changes.apply import apply_changeset, recover, revert_changeset
from controller.repo.baseline import Baseline
from controller.changes.journal import Journal

op, root, spec = sys.argv[1:4]
journal = Journal(Path(root))
if op == "apply":
    data = json.loads(Path(spec).read_text())
    baseline = Baseline.model_validate(data["baseline"])
    apply_changeset(baseline, data["diff"], job_id="job", journal=journal)
elif op == "revert":
    revert_changeset("job", journal=journal)
else:
    print(json.dumps([r.model_dump() for r in recover(journal)]))
"""

HEAD = {"f.txt": b"a\nb\nc\n", "gone.txt": b"bye\n", "keep.txt": b"keep\n"}
TOUCHED = {"f.txt": b"a\nb\nc\nuser\n", "gone.txt": b"bye\n"}
CHANGED = {"f.txt": b"a\nB\nc\nuser\n", "new/deep/n.py": b"n = 1\n"}
APPLY_STEPS = [
    "apply.checked",
    "apply.record.tmp",
    "apply.record",
    "apply.dirs",
    "apply.temps",
    "apply.write.1",
    "apply.write.2",
    "apply.write.3",
    "apply.synced",
    "apply.done",
]
REVERT_STEPS = [
    "revert.checked",
    "revert.begin",
    "revert.temps",
    "revert.write.1",
    "revert.write.2",
    "revert.write.3",
    "revert.synced",
    "revert.done",
]
RECOVER_STEPS = ["recover.temps", "recover.write.2", "recover.synced", "recover.done"]


def run_child(op: str, journal: Path, spec: Path | None, home: Path, fault: str | None) -> Any:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'sandbox-image'}",
        "PATCHBOX_HOME": str(home),
        "HOME": str(home),
    }
    if fault:
        env[FAULT_ENV] = fault
    return subprocess.run(
        [sys.executable, "-c", CHILD, op, str(journal), str(spec or "")],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def make_user_repo(path: Path) -> Path:
    """HEAD, a staged change, an unstaged change on top of it, an untracked file."""
    repo = init(path, HEAD, message="init").path
    (repo / "f.txt").write_bytes(b"a\nb\nc\nstaged\n")
    git(repo, "add", "f.txt")
    (repo / "f.txt").write_bytes(TOUCHED["f.txt"])
    (repo / "untracked.txt").write_bytes(b"mine\n")
    return repo


@dataclass
class Outcome:
    killed: bool
    error: str
    report: list[dict[str, Any]]
    before_recovery: Snapshot
    after: Snapshot
    status: bytes
    leftovers: list[str]


@dataclass
class Matrix:
    original: Snapshot
    original_status: bytes
    applied: Snapshot
    applied_status: bytes
    outcomes: dict[str, Outcome]


def _case(base: Path, template: Path, diff: str, op: str, step: str, pre: str | None) -> Outcome:
    case = base / step
    repo = case / "repo"
    shutil.copytree(template, repo, symlinks=True)
    journal = case / "journal"
    home = case / "home"
    home.mkdir()
    baseline = build_baseline(repo, "include-local-changes")[0]
    spec = case / "spec.json"
    spec.write_text(json.dumps({"baseline": baseline.model_dump(mode="json"), "diff": diff}))
    if op == "revert":
        apply_changeset(baseline, diff, job_id="job", journal=Journal(journal))
    if pre is not None:  # an apply killed first; the fault is in the recovery
        killed = run_child("apply", journal, spec, home, pre)
        assert killed.returncode == -signal.SIGKILL, killed.stderr
    proc = run_child("recover" if pre else op, journal, spec, home, step)
    before_recovery = snapshot(repo)
    recovered = run_child("recover", journal, None, home, None)
    assert recovered.returncode == 0, recovered.stderr
    return Outcome(
        killed=proc.returncode == -signal.SIGKILL,
        error=proc.stderr[-2000:],
        report=json.loads(recovered.stdout),
        before_recovery=before_recovery,
        after=snapshot(repo),
        status=status(repo),
        leftovers=sorted(p.name for p in repo.rglob(".patchbox-*")),
    )


@pytest.fixture(scope="module")
def matrix(tmp_path_factory: pytest.TempPathFactory) -> Matrix:
    """Every case of the kill matrix, run concurrently (each in its own copy of the repo)."""
    base = tmp_path_factory.mktemp("kill")
    template = make_user_repo(base / "template")
    diff = make_diff(base, TOUCHED, CHANGED)
    reference = base / "reference"
    shutil.copytree(template, reference, symlinks=True)
    original, original_status = snapshot(reference), status(reference)
    baseline = build_baseline(reference, "include-local-changes")[0]
    apply_changeset(baseline, diff, job_id="job", journal=Journal(base / "ref-journal"))
    applied, applied_status = snapshot(reference), status(reference)
    cases: list[tuple[str, str, str | None]] = [("apply", s, None) for s in APPLY_STEPS]
    cases += [("revert", s, None) for s in REVERT_STEPS]
    cases += [("recover", s, "apply.write.2") for s in RECOVER_STEPS]
    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = {
            step: pool.submit(_case, base, template, diff, op, step, pre) for op, step, pre in cases
        }
        outcomes = {step: future.result() for step, future in futures.items()}
    return Matrix(original, original_status, applied, applied_status, outcomes)


def _only_job(outcome: Outcome) -> dict[str, Any] | None:
    assert len(outcome.report) <= 1
    return outcome.report[0] if outcome.report else None


@pytest.mark.parametrize("step", APPLY_STEPS)
def test_apply_killed_at_every_step(matrix: Matrix, step: str) -> None:
    outcome = matrix.outcomes[step]
    assert outcome.killed, f"{step} was never reached: {outcome.error}"
    report = _only_job(outcome)
    assert outcome.leftovers == []
    if step == "apply.done":
        assert report is not None
        assert (report["state"], report["action"]) == ("applied", "none")
        assert outcome.after == matrix.applied
        assert outcome.status == matrix.applied_status
        return
    assert outcome.after == matrix.original
    assert outcome.status == matrix.original_status
    if step == "apply.checked":
        assert report is None
        return
    assert report is not None
    assert report["state"] == "not_applied"
    rolled_back = step != "apply.record.tmp"
    assert report["action"] == ("rolled_back_apply" if rolled_back else "none")
    if step in ("apply.write.2", "apply.write.3", "apply.synced"):
        assert outcome.before_recovery != matrix.original  # the kill left a half-applied tree


@pytest.mark.parametrize("step", REVERT_STEPS)
def test_revert_killed_at_every_step(matrix: Matrix, step: str) -> None:
    outcome = matrix.outcomes[step]
    assert outcome.killed, f"{step} was never reached: {outcome.error}"
    report = _only_job(outcome)
    assert report is not None
    assert outcome.leftovers == []
    if step == "revert.done":
        assert (report["state"], report["action"]) == ("not_applied", "none")
        assert outcome.after == matrix.original
        assert outcome.status == matrix.original_status
        return
    assert report["state"] == "applied"
    assert report["action"] == ("none" if step == "revert.checked" else "rolled_back_revert")
    assert outcome.after == matrix.applied
    assert outcome.status == matrix.applied_status


@pytest.mark.parametrize("step", RECOVER_STEPS)
def test_recovery_killed_at_every_step_recovers_again(matrix: Matrix, step: str) -> None:
    outcome = matrix.outcomes[step]
    assert outcome.killed, f"{step} was never reached: {outcome.error}"
    report = _only_job(outcome)
    assert report is not None
    assert report["state"] == "not_applied"
    assert outcome.after == matrix.original
    assert outcome.status == matrix.original_status
    assert outcome.leftovers == []


# --------------------------------------------------------------------------------------
# Recovery that must not write


def test_a_user_edit_before_recovery_needs_attention(tmp_path: Path) -> None:
    repo = make_user_repo(tmp_path / "repo")
    baseline = build_baseline(repo, "include-local-changes")[0]
    diff = make_diff(tmp_path, TOUCHED, CHANGED)
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"baseline": baseline.model_dump(mode="json"), "diff": diff}))
    home = tmp_path / "home"
    home.mkdir()
    journal_root = tmp_path / "journal"
    killed = run_child("apply", journal_root, spec, home, "apply.write.1")
    assert killed.returncode == -signal.SIGKILL
    (repo / "f.txt").write_bytes(b"the user kept typing\n")
    left = snapshot(repo)
    temps = [name for name in left.files if "/.patchbox-" in f"/{name}"]
    assert temps  # the kill left a temp file of the journal; only those may go
    before = replace(left, files={k: v for k, v in left.files.items() if k not in temps})
    journal = Journal(journal_root)
    (report,) = recover(journal)
    assert (report.state, report.paths) == ("needs_attention", ["f.txt"])
    assert snapshot(repo) == before
    assert job_state("job", journal=journal).state == "needs_attention"
    with pytest.raises(ApplyConflictError) as info:
        apply_changeset(baseline, diff, job_id="job", journal=journal)
    assert [(c.code, c.path) for c in info.value.conflicts] == [("needs_attention", "f.txt")]
    with pytest.raises(RevertConflictError):
        revert_changeset("job", journal=journal)
    assert snapshot(repo) == before
    (repo / "f.txt").write_bytes(CHANGED["f.txt"])
    (report,) = recover(journal)
    assert (report.state, report.action) == ("not_applied", "rolled_back_apply")
    assert (repo / "f.txt").read_bytes() == TOUCHED["f.txt"]


def _replaced(repo: Path) -> Snapshot:
    """``repo`` moved aside and a copy put at its path (another folder, the same files, the
    journal's temp files included): what the copy holds now."""
    aside = repo.with_name(repo.name + "-aside")
    shutil.copytree(repo, aside, symlinks=True)
    repo.rename(repo.with_name(repo.name + "-moved"))
    aside.rename(repo)
    return snapshot(repo)


def test_recovery_never_writes_a_folder_that_replaced_the_work_tree(tmp_path: Path) -> None:
    """An apply killed midway, then its folder replaced by a copy (another tenant's, a
    re-clone): recovery needs attention and writes nothing, in the copy or anywhere."""
    repo = make_user_repo(tmp_path / "repo")
    baseline = build_baseline(repo, "include-local-changes")[0]
    diff = make_diff(tmp_path, TOUCHED, CHANGED)
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"baseline": baseline.model_dump(mode="json"), "diff": diff}))
    home = tmp_path / "home"
    home.mkdir()
    journal_root = tmp_path / "journal"
    killed = run_child("apply", journal_root, spec, home, "apply.write.1")
    assert killed.returncode == -signal.SIGKILL
    before = _replaced(repo)
    journal = Journal(journal_root)
    (report,) = recover(journal)
    assert report.state == "needs_attention"
    assert "not the folder" in report.message
    assert snapshot(repo) == before
    with pytest.raises(RevertConflictError):
        revert_changeset("job", journal=journal)
    assert snapshot(repo) == before


def test_a_revert_never_writes_a_folder_that_replaced_the_work_tree(tmp_path: Path) -> None:
    repo = make_user_repo(tmp_path / "repo")
    baseline = build_baseline(repo, "include-local-changes")[0]
    diff = make_diff(tmp_path, TOUCHED, CHANGED)
    journal = Journal(tmp_path / "journal")
    apply_changeset(baseline, diff, job_id="job", journal=journal)
    before = _replaced(repo)
    with pytest.raises(RevertConflictError) as info:
        revert_changeset("job", journal=journal)
    assert [c.code for c in info.value.conflicts] == ["needs_attention"]
    assert "not the folder the apply wrote" in info.value.conflicts[0].message
    assert snapshot(repo) == before
    moved = repo.with_name("repo-moved")
    moved.rename(tmp_path / "elsewhere")
    repo.rename(moved)
    (tmp_path / "elsewhere").rename(repo)  # the folder the apply wrote, back at its path
    revert_changeset("job", journal=journal)
    assert (repo / "f.txt").read_bytes() == TOUCHED["f.txt"]


# --------------------------------------------------------------------------------------
# The record itself


def _record(job_id: str, before: list[bytes | None], after: list[bytes | None]) -> ApplyRecord:
    def side(data: bytes | None) -> Side | None:
        if data is None:
            return None
        return Side(sha256=hashlib.sha256(data).hexdigest(), size=len(data), mode=0o644)

    return ApplyRecord(
        job_id=job_id,
        repo="/nonexistent/repo",
        head="0" * 40,
        baseline_tree="1" * 40,
        diff_sha256="2" * 64,
        nonce="abc",
        paths=[
            PathRecord(path=f"p{i}", before=side(b), after=side(a))
            for i, (b, a) in enumerate(zip(before, after, strict=True))
        ],
        created_dirs=[],
        contents_sha256=contents_digest(before, after),
    )


def test_a_record_reads_back_exactly(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j")
    before: list[bytes | None] = [b"one\r\n", None, b"", b"\xff\x00bin"]
    after: list[bytes | None] = [b"two", b"new\n", None, b"x"]
    journal.write_record(_record("job", before, after), before, after)
    rec = journal.read_record("job")
    assert (rec.before, rec.after) == (before, after)
    assert journal.phase("job") == "applying"
    assert journal.jobs() == ["job"]
    assert not (journal.job_dir("job") / "record.tmp").exists()


@pytest.mark.parametrize(
    ("markers", "phase"),
    [
        ([], "applying"),
        (["apply.undone"], "rolled_back"),
        (["apply.done"], "applied"),
        (["apply.done", "revert.begin"], "reverting"),
        (["apply.done", "revert.begin", "revert.done"], "reverted"),
    ],
)
def test_phases_follow_the_markers(tmp_path: Path, markers: list[Any], phase: str) -> None:
    journal = Journal(tmp_path / "j")
    assert journal.phase("job") == "none"
    journal.write_record(_record("job", [b"a"], [b"b"]), [b"a"], [b"b"])
    for marker in markers:
        journal.mark("job", marker)
    assert journal.phase("job") == phase


def test_a_damaged_record_needs_attention(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j")
    journal.write_record(_record("job", [b"abc"], [b"def"]), [b"abc"], [b"def"])
    path = journal.job_dir("job") / "record"
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(JournalCorruptError):
        journal.read_record("job")
    (report,) = recover(journal)
    assert report.state == "needs_attention"
    path.write_bytes(b"not a journal")
    with pytest.raises(JournalCorruptError):
        journal.read_record("job")


@pytest.mark.parametrize("job_id", ["", "../x", ".hidden", "a/b", "x" * 200, "a\nb"])
def test_job_ids_are_plain_names(tmp_path: Path, job_id: str) -> None:
    with pytest.raises(UsageError):
        Journal(tmp_path / "j").job_dir(job_id)


def test_the_fault_point_kills_only_at_its_step(tmp_path: Path) -> None:
    code = (
        "from controller.changes.journal import fault_point\n"
        "fault_point('a'); print('alive', flush=True); fault_point('b'); print('not reached')"
    )
    env = {
        "PATH": os.environ.get("PATH", ""),
        "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'sandbox-image'}",
        "PATCHBOX_HOME": str(tmp_path),
        FAULT_ENV: "b",
    }
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False
    )
    assert proc.returncode == -signal.SIGKILL
    assert proc.stdout == "alive\n"


def test_recover_with_an_empty_journal(tmp_path: Path) -> None:
    assert recover(Journal(tmp_path / "j")) == []
