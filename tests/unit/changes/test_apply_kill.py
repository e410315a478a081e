"""``patchbox apply`` killed with SIGKILL at any moment, its job then read FIRST (``jobs``,
``show``, the API), before any other apply: real processes on real repositories.

The rule checked after every kill: the state shown is ``applied`` exactly when every file of
the apply holds its content after the change, and ``awaiting_review`` exactly when every one
holds its content before (bytes and modes: the whole work tree byte for byte, no temp file,
no folder left over), never anything else; ``show`` says what ``jobs`` says, and so does the
record (``decision.applied_by`` too, for an apply the killed process had not recorded).

- At each of the apply's steps (the journal's fault points, ``PATCHBOX_FAULT_POINT``).
- After a random delay inside the apply's writing window, over a large apply (100 paths:
  changed, made executable, created in new folders, deleted).
- With readers waiting: the apply stopped mid-write with its locks held while ``jobs`` and
  ``show`` start, then killed: the readers settle what it left.
- ``revert`` killed at each step likewise (``applied`` with the change, ``reverted``
  without), and an apply of a reverted job (``reverted`` without, ``applied`` with); ``discard`` first settles an apply the killed process did not record (an
  applied job is not discarded); the API's ``job`` and, after ``patchbox serve`` was
  killed in an apply, the restarted service's list and view say ``applied``.
- ``run`` in the gated auto mode killed in its apply: ``applied`` when the apply was done,
  else ``failed`` with ``INTERRUPTED`` and nothing written.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from controller import api
from controller.changes.journal import FAULT_ENV, Journal
from controller.jobs.records import JobRecord
from controller.jobs.store import JobStore
from controller.repo.baseline import build_baseline
from tests.support.cli import ROOT, patchbox
from tests.support.git import Written, init, make_diff
from tests.support.worktree import Snapshot, snapshot

TEXT = {
    f"src/pkg{i % 5}/m{i:03d}.py": "".join(f"value_{i}_{n} = {n}\n" for n in range(120))
    for i in range(100)
}
CHANGED = sorted(TEXT)[:60]
EXECUTABLE = CHANGED[:10]
"""Executable before; the change clears the bit (a diff may not set one)."""
DELETED = sorted(TEXT)[60:80]
CREATED = [f"gen/deep/x{i:02d}/n.py" for i in range(20)]
BEFORE: dict[str, Written] = {p: (0o755, t) if p in EXECUTABLE else t for p, t in TEXT.items()}
AFTER: dict[str, Written] = {
    **{p: t for p, t in TEXT.items() if p not in DELETED},
    **{p: f"# changed\n{TEXT[p]}" for p in CHANGED},
    **{p: f"new_{i} = {i}\n" * 50 for i, p in enumerate(CREATED)},
}
TOUCHED = len(CHANGED) + len(DELETED) + len(CREATED)
STEPS_BEFORE = [
    "apply.checked",
    "apply.record.tmp",
    "apply.record",
    "apply.dirs",
    "apply.temps",
    "apply.write.1",
    f"apply.write.{TOUCHED // 2}",
    f"apply.write.{TOUCHED}",
    "apply.synced",
]
STEPS_AFTER = ["apply.done", "apply.recorded"]
RANDOM_KILLS = 12


@contextlib.contextmanager
def home_of(home: Path) -> Iterator[None]:
    """``$PATCHBOX_HOME`` is ``home`` in this process for the block."""
    old = os.environ["PATCHBOX_HOME"]
    os.environ["PATCHBOX_HOME"] = str(home)
    try:
        yield
    finally:
        os.environ["PATCHBOX_HOME"] = old


def state_of(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def wait_until_stopped(proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 120
    while state_of(proc.pid) != "T":
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the apply never reached its stop"
        time.sleep(0.01)


@dataclass(frozen=True)
class Case:
    """One repository with one job awaiting review, in a state directory of its own."""

    home: Path
    repo: Path
    job_id: str
    original: Snapshot

    def start_apply(self, fault: str | None = None) -> subprocess.Popen[str]:
        env = {**os.environ, "PATCHBOX_HOME": str(self.home)}
        env.pop(FAULT_ENV, None)
        if fault is not None:
            env[FAULT_ENV] = fault
        return subprocess.Popen(
            [sys.executable, "-m", "controller", "apply", self.job_id, "--json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env=env,
        )

    def reader(self, command: str) -> subprocess.Popen[str]:
        args = ("jobs", "--json") if command == "jobs" else ("show", self.job_id, "--json")
        return subprocess.Popen(
            [sys.executable, "-m", "controller", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env={**os.environ, "PATCHBOX_HOME": str(self.home)},
        )

    def shown(self, command: str, out: str) -> str:
        data = json.loads(out)
        if command == "jobs":
            [data] = [j for j in data["jobs"] if j["job_id"] == self.job_id]
        return str(data["status"])

    def read(self, command: str) -> str:
        """The job's state as ``jobs --json`` or ``show JOB --json`` prints it."""
        args = ("jobs", "--json") if command == "jobs" else ("show", self.job_id, "--json")
        done = patchbox(*args, home=self.home)
        assert done.returncode == 0, done.stderr
        return self.shown(command, done.stdout)

    def record(self) -> JobRecord:
        return JobStore(self.home / "jobs").load(self.job_id)


def make_case(root: Path, name: str) -> Case:
    """A repository of :data:`BEFORE` and a job awaiting review whose diff makes it
    :data:`AFTER`."""
    folder = root / name
    home = folder / "home"
    home.mkdir(parents=True)
    repo = init(folder / "repo", BEFORE, message="init").path
    diff = make_diff(root / "diffs", BEFORE, AFTER)
    job_id = f"20260101-000000-{name}"
    with home_of(home):
        baseline = build_baseline(repo, "require-clean")[0]
        store = JobStore()
        record = JobRecord(job_id=job_id, repo=str(repo), baseline=baseline)
        record.state = "awaiting_review"
        store.save(record)
        (store.folder(job_id) / "diff.patch").write_text(diff)
    return Case(home, repo, job_id, snapshot(repo))


@dataclass(frozen=True)
class Trees:
    """The work tree's files, links and folders before and after the apply."""

    before: tuple[object, ...]
    after: tuple[object, ...]


def tree(snap: Snapshot) -> tuple[object, ...]:
    return (snap.files, snap.links, snap.folders)


@pytest.fixture(scope="module")
def trees(tmp_path_factory: pytest.TempPathFactory) -> Trees:
    """The reference: a job applied by an ``apply`` nobody killed."""
    case = make_case(tmp_path_factory.mktemp("reference"), "reference")
    done = patchbox("apply", case.job_id, "--json", home=case.home)
    assert done.returncode == 0, done.stderr
    after = tree(snapshot(case.repo))
    assert after != tree(case.original)
    assert {case.original.files[p][0] for p in EXECUTABLE} == {0o755}
    assert {snapshot(case.repo).files[p][0] for p in EXECUTABLE} == {0o644}
    return Trees(tree(case.original), after)


HOLDS = {"applied": "after", "awaiting_review": "before", "reverted": "before"}
"""What the work tree must hold, by the state shown."""
PHASES = {
    "applied": {"applied"},
    "awaiting_review": {"none", "rolled_back"},
    "reverted": {"reverted"},
}
"""The journal's phases that agree with the state shown."""


def check_settled(case: Case, trees: Trees, first: str) -> str:
    """Reads the job with ``first`` (``jobs`` or ``show``) before anything else, then with
    the other one; checks the rule and returns the state."""
    state = case.read(first)
    now = snapshot(case.repo)
    assert (now.index, now.head) == (case.original.index, case.original.head)
    if state not in HOLDS:
        pytest.fail(f"after a killed apply or revert the job is {state}")
    wanted = trees.after if HOLDS[state] == "after" else trees.before
    assert tree(now) == wanted, f"the job is {state}, but the work tree is not {HOLDS[state]}"
    other = "show" if first == "jobs" else "jobs"
    assert case.read(other) == state
    record = case.record()
    assert record.state == state
    if state == "applied":
        assert record.decision is not None
        assert record.decision.applied_by == "user"
    assert Journal(case.home / "journal").phase(case.job_id) in PHASES[state]
    return state


def finish(case: Case, trees: Trees, state: str) -> None:
    """A job a kill left awaiting review applies as if nothing had happened."""
    if state == "awaiting_review":
        done = patchbox("apply", case.job_id, "--json", home=case.home)
        assert done.returncode == 0, done.stderr
        assert tree(snapshot(case.repo)) == trees.after


def kill_at(case: Case, trees: Trees, step: str, first: str) -> str:
    proc = case.start_apply(step)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL, (step, out, err)
    state = check_settled(case, trees, first)
    finish(case, trees, state)
    return state


@pytest.mark.parametrize(
    ("steps", "expected"),
    [(STEPS_BEFORE, "awaiting_review"), (STEPS_AFTER, "applied")],
    ids=["before-done", "after-done"],
)
def test_an_apply_killed_at_each_step_is_all_or_nothing_when_first_read(
    tmp_path: Path, trees: Trees, steps: list[str], expected: str
) -> None:
    cases = [make_case(tmp_path, f"s{i:07x}") for i in range(len(steps))]
    firsts = ["jobs" if i % 2 == 0 else "show" for i in range(len(steps))]
    with ThreadPoolExecutor(max_workers=3) as pool:
        states = list(pool.map(kill_at, cases, [trees] * len(steps), steps, firsts))
    assert states == [expected] * len(steps), dict(zip(steps, states, strict=True))


def test_an_apply_killed_after_random_delays_is_all_or_nothing_when_first_read(
    tmp_path: Path, trees: Trees
) -> None:
    """The kills land in the writing window: from the plan checked (the apply stops there
    and is let go) to the process's end, as long as a reference apply takes."""
    reference = make_case(tmp_path, "window0")
    proc = reference.start_apply("apply.checked:stop")
    wait_until_stopped(proc)
    started = time.monotonic()
    proc.send_signal(signal.SIGCONT)
    proc.communicate(timeout=120)
    window = time.monotonic() - started
    assert proc.returncode == 0
    rng = random.Random(7)  # noqa: S311 - when to kill, not a secret
    states = []
    for n in range(RANDOM_KILLS):
        case = make_case(tmp_path, f"r{n:07x}")
        proc = case.start_apply("apply.checked:stop")
        wait_until_stopped(proc)
        proc.send_signal(signal.SIGCONT)
        time.sleep(rng.uniform(0, window))
        proc.kill()
        proc.communicate(timeout=120)
        state = check_settled(case, trees, "jobs" if n % 2 == 0 else "show")
        states.append((state, "recovered" in case.record().diagnostics))
        finish(case, trees, state)
        shutil.rmtree(case.repo.parent, ignore_errors=True)
    print(f"writing window {window:.2f} s; outcomes {states}")
    assert any(recovered for _, recovered in states), "no kill landed inside the writing"


REVERT_STEPS_BEFORE = [
    "revert.checked",
    "revert.begin",
    "revert.temps",
    "revert.write.1",
    f"revert.write.{TOUCHED // 2}",
    f"revert.write.{TOUCHED}",
    "revert.synced",
]
REVERT_STEPS_AFTER = ["revert.done", "revert.recorded"]


def kill_revert_at(case: Case, trees: Trees, step: str, first: str) -> str:
    applied = patchbox("apply", case.job_id, "--json", home=case.home)
    assert applied.returncode == 0, applied.stderr
    env = {**os.environ, "PATCHBOX_HOME": str(case.home), FAULT_ENV: step}
    proc = subprocess.run(
        [sys.executable, "-m", "controller", "revert", case.job_id, "--json"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        check=False,
        timeout=120,
    )
    assert proc.returncode == -signal.SIGKILL, (step, proc.stdout, proc.stderr)
    return check_settled(case, trees, first)


@pytest.mark.parametrize(
    ("steps", "expected"),
    [(REVERT_STEPS_BEFORE, "applied"), (REVERT_STEPS_AFTER, "reverted")],
    ids=["before-done", "after-done"],
)
def test_a_revert_killed_at_each_step_is_all_or_nothing_when_first_read(
    tmp_path: Path, trees: Trees, steps: list[str], expected: str
) -> None:
    cases = [make_case(tmp_path, f"v{i:07x}") for i in range(len(steps))]
    firsts = ["show" if i % 2 == 0 else "jobs" for i in range(len(steps))]
    with ThreadPoolExecutor(max_workers=3) as pool:
        states = list(pool.map(kill_revert_at, cases, [trees] * len(steps), steps, firsts))
    assert states == [expected] * len(steps), dict(zip(steps, states, strict=True))


REAPPLY_STEPS = {
    "apply.checked": "reverted",
    "apply.record": "reverted",
    f"apply.write.{TOUCHED // 2}": "reverted",
    "apply.synced": "reverted",
    "apply.done": "applied",
    "apply.recorded": "applied",
}
"""A reverted job applied again, killed at these steps: the state it reads as first."""


def kill_reapply_at(case: Case, trees: Trees, step: str, first: str) -> str:
    """Applies and reverts the job, then applies it again and kills that apply at
    ``step``; checks that the first read says what the work tree holds."""
    for command in ("apply", "revert"):
        done = patchbox(command, case.job_id, "--json", home=case.home)
        assert done.returncode == 0, done.stderr
    proc = case.start_apply(step)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL, (step, out, err)
    state = case.read(first)
    wanted = {"reverted": trees.before, "applied": trees.after}.get(state)
    assert tree(snapshot(case.repo)) == wanted, (step, state)
    assert case.read("show" if first == "jobs" else "jobs") == state
    record = case.record()
    assert record.state == state
    if state == "applied":
        assert record.decision is not None
        assert record.decision.applied_by == "user"
        return state
    again = patchbox("apply", case.job_id, "--json", home=case.home)  # as if nothing happened
    assert again.returncode == 0, again.stderr
    assert tree(snapshot(case.repo)) == trees.after
    return state


def test_a_reapply_after_a_revert_killed_at_each_step_is_all_or_nothing_when_first_read(
    tmp_path: Path, trees: Trees
) -> None:
    steps = list(REAPPLY_STEPS)
    cases = [make_case(tmp_path, f"a{i:07x}") for i in range(len(steps))]
    firsts = ["jobs" if i % 2 == 0 else "show" for i in range(len(steps))]
    with ThreadPoolExecutor(max_workers=3) as pool:
        states = list(pool.map(kill_reapply_at, cases, [trees] * len(steps), steps, firsts))
    assert dict(zip(steps, states, strict=True)) == REAPPLY_STEPS


def test_discard_first_settles_an_apply_the_killed_process_did_not_record(
    tmp_path: Path, trees: Trees
) -> None:
    """The files are all written: the job is applied, and an applied job is not discarded
    (it is reverted)."""
    case = make_case(tmp_path, "discard")
    proc = case.start_apply("apply.done")
    proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL
    refused = patchbox("discard", case.job_id, "--json", home=case.home)
    assert refused.returncode == 2, refused.stderr
    error = json.loads(refused.stdout)["error"]
    assert error["code"] == "USAGE_ERROR"
    assert f"job {case.job_id} is applied" in error["message"]
    assert tree(snapshot(case.repo)) == trees.after
    assert case.record().state == "applied"


@pytest.mark.parametrize(
    ("step", "expected"),
    [(f"apply.write.{TOUCHED // 2}", "awaiting_review"), ("apply.done", "applied")],
    ids=["mid-write", "done"],
)
def test_readers_waiting_on_an_apply_that_dies_settle_it(
    tmp_path: Path, trees: Trees, step: str, expected: str
) -> None:
    """The apply stops with its locks held; ``jobs`` and ``show`` start and wait (they
    print nothing while it holds the job); then it is killed, and both settle what it left."""
    case = make_case(tmp_path, "waiting")
    proc = case.start_apply(f"{step}:stop")
    wait_until_stopped(proc)
    readers = {command: case.reader(command) for command in ("jobs", "show")}
    time.sleep(3.0)
    waiting = {c: r.poll() is None for c, r in readers.items()}
    proc.kill()
    proc.communicate(timeout=60)
    shown = {}
    for command, reader in readers.items():
        out, err = reader.communicate(timeout=120)
        assert reader.returncode == 0, err
        shown[command] = case.shown(command, out)
    assert waiting == {"jobs": True, "show": True}
    assert shown == {"jobs": expected, "show": expected}
    assert tree(snapshot(case.repo)) == (trees.after if expected == "applied" else trees.before)
    assert case.record().state == expected


def test_the_api_reads_a_killed_apply_settled(
    tmp_path: Path, trees: Trees, monkeypatch: pytest.MonkeyPatch
) -> None:
    case = make_case(tmp_path, "api")
    proc = case.start_apply("apply.done")
    proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL
    assert JobStore(case.home / "jobs").load(case.job_id).state == "awaiting_review"
    monkeypatch.setenv("PATCHBOX_HOME", str(case.home))
    record = api.job(case.job_id)
    assert record.state == "applied"
    assert tree(snapshot(case.repo)) == trees.after
    assert [s for s, _ in record.history][-1:] == ["applied"]
