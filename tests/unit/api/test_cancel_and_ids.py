"""The engine's side of ``patchbox cancel`` and of what a user types for a job, without a
daemon: a job that is not running is refused, a running job whose controller is gone ends
``INTERRUPTED`` and is refused too, a cancel asked of a live job is a request in its folder;
and the repository of the current folder is found from any folder inside it."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from controller import api
from controller.errors import NotARepositoryError, UsageError
from controller.jobs.records import JobRecord
from controller.jobs.store import JobStore
from controller.repo.layout import enclosing_top
from controller.sandbox.labels import current_identity
from tests.support.jobs import make_repo


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> JobStore:
    monkeypatch.setenv("PATCHBOX_HOME", str(tmp_path / "home"))
    return JobStore()


def test_a_job_that_is_not_running_is_not_cancelled(store: JobStore) -> None:
    record = JobRecord(job_id="20261201-080000-aaaa1111", repo="/r", state="awaiting_review")
    store.save(record)
    with pytest.raises(UsageError) as caught:
        api.cancel_job(api.resolve_job("2026"))
    assert caught.value.message == (
        "job 20261201-080000-aaaa1111 is awaiting_review; only a running job is cancelled"
    )
    assert not store.cancel_requested(record.job_id)


def test_a_running_job_whose_controller_is_gone_is_interrupted(store: JobStore) -> None:
    host = current_identity().host
    record = JobRecord(
        job_id="j-gone", repo="/r", state="running", controller="x:1:0:dead", controller_host=host
    )
    store.save(record)
    with pytest.raises(UsageError) as caught:
        api.cancel_job("j-gone")
    assert "is failed; only a running job is cancelled (its controller is gone)" in (
        caught.value.message
    )
    assert store.load("j-gone").error is not None


def test_a_live_job_gets_a_cancel_request_and_is_waited_for(store: JobStore) -> None:
    me = current_identity()
    record = JobRecord(
        job_id="j-live", repo="/r", state="running", controller=me.token, controller_host=me.host
    )
    store.save(record)

    def controller() -> None:  # the running job's engine, as far as the request goes
        while not store.cancel_requested("j-live"):
            threading.Event().wait(0.05)
        live = store.load("j-live")
        live.move("cancelled")
        store.save(live)

    thread = threading.Thread(target=controller)
    thread.start()
    ended = api.cancel_job("j-live", wait=30)
    thread.join(10)
    assert ended.state == "cancelled"


def test_a_job_that_does_not_end_in_time_is_returned_running(store: JobStore) -> None:
    me = current_identity()
    record = JobRecord(
        job_id="j-slow", repo="/r", state="running", controller=me.token, controller_host=me.host
    )
    store.save(record)
    assert api.cancel_job("j-slow", wait=0.3).state == "running"
    assert store.cancel_requested("j-slow")


def test_the_repository_of_a_folder_inside_it(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    deep = repo / "a" / "b"
    deep.mkdir(parents=True)
    assert enclosing_top(deep) == repo.resolve()
    assert enclosing_top(repo) == repo.resolve()
    (tmp_path / "plain").mkdir()
    with pytest.raises(NotARepositoryError) as caught:
        enclosing_top(tmp_path / "plain")
    assert "is not inside a git work tree" in caught.value.message
    with pytest.raises(NotARepositoryError):
        enclosing_top(tmp_path / "missing")
