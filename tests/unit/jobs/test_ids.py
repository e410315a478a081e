"""What a user types for a job (a whole id, a unique prefix, ``last``) resolved by the one
store; the repository lock naming the job that holds it; a cancel asked for through the
job's folder."""

from __future__ import annotations

import multiprocessing
from multiprocessing.synchronize import Event
from pathlib import Path

import pytest

from controller.errors import ErrorCode, PatchboxError, UsageError
from controller.jobs.records import JobRecord
from controller.jobs.store import JobStore, write_lock

IDS = [
    "20261201-080000-aaaa1111",
    "20261201-080000-aaaa2222",
    "20261202-090000-bbbb3333",
]


@pytest.fixture
def store(tmp_path: Path) -> JobStore:
    store = JobStore(tmp_path / "jobs")
    for n, job_id in enumerate(IDS):
        # Created in another order than the ids sort: ``last`` goes by creation.
        created = {0: 300.0, 1: 100.0, 2: 200.0}[n]
        store.save(JobRecord(job_id=job_id, repo="/r", created_at=created, updated_at=created))
    return store


def test_a_whole_id_resolves_to_itself(store: JobStore) -> None:
    assert [store.resolve(i) for i in IDS] == IDS


@pytest.mark.parametrize(
    ("prefix", "expected"),
    [("20261202", IDS[2]), ("20261201-080000-aaaa1", IDS[0]), ("2026120", None)],
)
def test_a_unique_prefix_names_its_job(store: JobStore, prefix: str, expected: str | None) -> None:
    if expected is not None:
        assert store.resolve(prefix) == expected
        return
    with pytest.raises(UsageError) as caught:
        store.resolve(prefix)
    message = caught.value.message
    assert "is the start of 3 job ids" in message
    for job_id in IDS:
        assert job_id in message


def test_an_ambiguous_prefix_lists_ten_candidates_then_counts(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "jobs")
    ids = [f"20261201-080000-{n:08x}" for n in range(13)]
    for job_id in ids:
        store.save(JobRecord(job_id=job_id, repo="/r"))
    with pytest.raises(UsageError) as caught:
        store.resolve("20261201")
    message = caught.value.message
    assert all(i in message for i in ids[:10])
    assert not any(i in message for i in ids[10:])
    assert message.endswith("and 3 more; give more of the id")


def test_last_is_the_job_created_last(store: JobStore) -> None:
    assert store.resolve("last") == IDS[0]
    store.save(JobRecord(job_id="zz-newest", repo="/r", created_at=400.0))
    assert store.resolve("last") == "zz-newest"


@pytest.mark.parametrize("ref", ["last", "2026", "20261201-080000-aaaa1111"])
def test_no_job_names_the_state_folder(tmp_path: Path, ref: str) -> None:
    store = JobStore(tmp_path / "empty" / "jobs")
    with pytest.raises(UsageError) as caught:
        store.resolve(ref)
    assert caught.value.code is ErrorCode.USAGE_ERROR
    assert str(tmp_path / "empty" / "jobs") in caught.value.message
    with pytest.raises(UsageError) as loaded:
        store.load("nope")
    assert str(tmp_path / "empty" / "jobs") in loaded.value.message


@pytest.mark.parametrize("ref", ["../x", "a/b", ".hidden", ""])
def test_a_name_that_is_no_id_is_refused(store: JobStore, ref: str) -> None:
    with pytest.raises(UsageError):
        store.resolve(ref)


def test_a_cancel_request_is_a_file_in_the_jobs_folder(store: JobStore) -> None:
    assert not store.cancel_requested(IDS[0])
    store.request_cancel(IDS[0])
    store.request_cancel(IDS[0])  # asked twice: the same request
    assert store.cancel_requested(IDS[0])
    assert not store.cancel_requested(IDS[1])
    assert store.load(IDS[0]).job_id == IDS[0]  # the record still reads


def _hold(root: str, holder: str, ready: Event, done: Event) -> None:
    with write_lock("/repo", Path(root), holder=holder):
        ready.set()
        done.wait(30)


@pytest.mark.parametrize(
    ("holder", "named"),
    [("20261201-080000-aaaa1111", True), ("", False), ("bad name; rm -rf", False)],
)
def test_a_refused_lock_names_the_job_that_holds_it(
    tmp_path: Path, holder: str, named: bool
) -> None:
    ctx = multiprocessing.get_context("fork")
    ready, done = ctx.Event(), ctx.Event()
    proc = ctx.Process(target=_hold, args=(str(tmp_path), holder, ready, done))
    proc.start()
    try:
        assert ready.wait(30)
        with pytest.raises(PatchboxError) as info, write_lock("/repo", tmp_path, holder="me"):
            pass
    finally:
        done.set()
        proc.join(30)
    assert info.value.code is ErrorCode.JOB_ALREADY_RUNNING
    message = info.value.message
    assert message.startswith("another job is already running on this repository")
    assert (f"job {holder} holds it" in message) is named
    assert "rm -rf" not in message
    with write_lock("/repo", tmp_path, holder="next"):
        pass  # released with its holder; the next one names itself
