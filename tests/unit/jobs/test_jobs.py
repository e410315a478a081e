"""The job state machine (pure, by table), records on disk, and the per-repository lock."""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

import pytest

from controller.errors import ErrorCode, InvalidTransitionError, PatchboxError, UsageError
from controller.jobs.records import FINAL, TRANSITIONS, JobRecord, check_transition
from controller.jobs.store import JobStore, write_lock

STATES = list(TRANSITIONS)
ALLOWED = {
    ("created", "preparing"),
    ("preparing", "running"),
    ("running", "validating"),
    ("validating", "checking"),
    ("validating", "no_change"),
    ("no_change", "discarded"),
    ("checking", "awaiting_review"),
    ("checking", "applied"),
    ("awaiting_review", "applied"),
    ("awaiting_review", "discarded"),
    ("applied", "reverted"),
    ("reverted", "applied"),
    ("failed", "discarded"),
    ("cancelled", "discarded"),
} | {
    (s, end)
    for s in ("created", "preparing", "running", "validating", "checking")
    for end in ("failed", "cancelled")
}


@pytest.mark.parametrize("current", STATES)
@pytest.mark.parametrize("new", STATES)
def test_every_transition_by_table(current: str, new: str) -> None:
    if (current, new) in ALLOWED:
        check_transition(current, new)
    else:
        with pytest.raises(InvalidTransitionError):
            check_transition(current, new)


def test_final_states_are_final() -> None:
    assert {"reverted", "discarded", "no_change", "failed", "cancelled"} == FINAL


def test_record_moves_and_keeps_history(tmp_path: Path) -> None:
    store = JobStore(tmp_path)
    record = JobRecord(job_id="j1", repo="/r")
    for state in ("preparing", "running", "validating", "checking", "awaiting_review"):
        record.move(state)
    store.save(record)
    again = store.load("j1")
    assert again.state == "awaiting_review"
    assert [s for s, _ in again.history] == [
        "preparing",
        "running",
        "validating",
        "checking",
        "awaiting_review",
    ]
    with pytest.raises(InvalidTransitionError):
        again.move("reverted")
    assert again.state == "awaiting_review"
    assert [r.job_id for r in store.all("/r")] == ["j1"]
    assert store.all("/other") == []


def test_a_turns_save_skips_the_fsyncs_a_state_change_pays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tool loop saves the record after every turn without fsync (a tool call's cost);
    every other save is durable. Both append to the job's log, the only file they leave."""
    synced: list[int] = []
    real_fsync = os.fsync

    def counted(fd: int) -> None:
        synced.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", counted)
    store = JobStore(tmp_path)
    record = JobRecord(job_id="j1", repo="/r")
    store.save(record, durable=False)
    assert synced == []
    assert store.load("j1") == record
    record.move("preparing")
    store.save(record)
    assert len(synced) == 2  # the file, then its folder
    assert store.load("j1").state == "preparing"
    assert [p.name for p in store.folder("j1").iterdir()] == ["log.jsonl"]


@pytest.mark.parametrize("bad", ["", "../x", "a/b", ".hidden"])
def test_store_refuses_odd_job_ids(tmp_path: Path, bad: str) -> None:
    with pytest.raises(UsageError):
        JobStore(tmp_path).load(bad)


def test_unknown_job_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="no job"):
        JobStore(tmp_path).load("nope")


def _hold(
    root: str,
    repo: str,
    ready: multiprocessing.synchronize.Event,
    done: multiprocessing.synchronize.Event,
    holder: str = "",
) -> None:
    with write_lock(repo, Path(root), holder=holder):
        ready.set()
        done.wait(30)


def test_second_write_job_on_a_repository_is_refused(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    ready, done = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold, args=(str(tmp_path), "/repo", ready, done))
    holder.start()
    try:
        assert ready.wait(30)
        with pytest.raises(PatchboxError) as info, write_lock("/repo", tmp_path):
            pass
        assert info.value.code is ErrorCode.JOB_ALREADY_RUNNING
        with write_lock("/other-repo", tmp_path):
            pass  # another repository is independent
    finally:
        done.set()
        holder.join(30)
    with write_lock("/repo", tmp_path):
        pass  # released when the holder ended


def test_a_refused_write_job_names_the_job_holding_the_lock(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    ready, done = ctx.Event(), ctx.Event()
    job_id = "20261205-050000-0123abcd"
    holder = ctx.Process(target=_hold, args=(str(tmp_path), "/repo", ready, done, job_id))
    holder.start()
    try:
        assert ready.wait(30)
        with pytest.raises(PatchboxError) as info, write_lock("/repo", tmp_path):
            pass
        assert info.value.code is ErrorCode.JOB_ALREADY_RUNNING
        assert (
            info.value.message
            == f"another job is already running on this repository: job {job_id} holds it"
        )
    finally:
        done.set()
        holder.join(30)
    with write_lock("/repo", tmp_path, holder="next-job"):
        pass  # released, and its holder's name cleared with it
    lock = next((tmp_path).glob("*.lock"))
    assert lock.read_text() == ""


def test_a_lock_file_naming_no_job_id_is_not_shown(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    ready, done = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold, args=(str(tmp_path), "/repo", ready, done))
    holder.start()
    try:
        assert ready.wait(30)
        next(tmp_path.glob("*.lock")).write_text("\x1b[31m../evil id\n")
        with pytest.raises(PatchboxError) as info, write_lock("/repo", tmp_path):
            pass
        assert info.value.message == "another job is already running on this repository"
    finally:
        done.set()
        holder.join(30)


def test_lock_of_a_killed_process_is_released(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    ready, done = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold, args=(str(tmp_path), "/repo", ready, done))
    holder.start()
    assert ready.wait(30)
    os.kill(holder.pid or 0, 9)
    holder.join(30)
    with write_lock("/repo", tmp_path):
        pass
