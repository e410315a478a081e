"""One replica's runner without Docker: the roots it can see decide what it claims; its
engine's loss stops its claims and its jobs (``INTERRUPTED`` naming the engine); a lease
another replica took fences it off the job (the job stopped, nothing more written)."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from controller.errors import ErrorCode
from controller.identity import CONTROLLER, current_identity
from controller.service.config import load_service_config
from controller.service.engines import can_see, seen_roots
from controller.service.feed import EventFeed
from controller.service.runner import LEASE_LOST, Runner, Running
from controller.service.sqlitestore import SqliteStore
from controller.service.store import JobRow, Quota
from tests.support.service import stored, write_config


class FakeJob:
    """What the runner asks of a running job here: to be stopped, and why."""

    def __init__(self) -> None:
        self.stops: list[tuple[str, ErrorCode]] = []

    def cancel(self, reason: str, code: ErrorCode = ErrorCode.CANCELLED) -> None:
        self.stops.append((reason, code))


class Engine:
    def __init__(self) -> None:
        self.up = True

    def __call__(self) -> bool:
        return self.up


def _runner(tmp_path: Path, engine: Engine, **service: float | list[str]) -> Runner:
    path = write_config(tmp_path, workers=0, service=service)
    host, config = load_service_config(path)
    return Runner(SqliteStore(tmp_path / "replica.db"), host, config, ping=engine)


def _queue(runner: Runner, job_id: str, repo: str, **req: str) -> JobRow:
    row = JobRow(job_id, "alpha", repo, stored(**req), "queued", time.time())
    runner.store.insert_job(row)
    return row


def _hold(runner: Runner, row: JobRow) -> Running:
    """The job claimed and running on this runner, with a stand-in for its engine job."""
    assert runner.store.claim(row.job_id, runner.leases.owner, runner.leases.until(), Quota(2))
    runner.store.update_state(row.job_id, "running")
    item = Running(row, job=FakeJob())  # type: ignore[arg-type]
    runner._running[row.job_id] = item
    return item


def test_roots_are_compared_by_whole_path_parts(tmp_path: Path) -> None:
    assert can_see(["/srv/a"], "/srv/a/repo")
    assert can_see(["/srv/a/"], "/srv/a")
    assert not can_see(["/srv/a"], "/srv/ab/repo")
    assert not can_see([], "/srv/a/repo")
    (tmp_path / "here").mkdir()
    roots = [str(tmp_path / "here"), str(tmp_path / "not-here")]
    assert seen_roots(None, roots) == (str(tmp_path / "here"),)
    assert seen_roots(["/elsewhere"], roots) == ("/elsewhere",)


def test_a_replica_claims_only_jobs_under_the_roots_it_can_see(tmp_path: Path) -> None:
    runner = _runner(tmp_path, Engine(), visible_roots=["/srv/one"])
    _queue(runner, "20260101-000000-eeee0001", "/srv/two/a")
    _queue(runner, "20260101-000000-eeee0002", "/srv/one/b")
    _queue(runner, "20260101-000000-eeee0003", "/srv/two/c", bundle="b" + "0" * 32)
    picked = []
    while (row := runner._pick()) is not None:
        picked.append(row.job_id)
        runner._running[row.job_id] = Running(row)
    assert picked == ["20260101-000000-eeee0002", "20260101-000000-eeee0003"]
    runner._register()
    (info,) = runner.store.replicas()
    assert (info.name, info.roots, info.engine_ok) == (runner.leases.owner, ("/srv/one",), True)
    runner.shutdown(timeout=1)


def test_an_engine_that_stops_answering_stops_claims_and_interrupts_its_jobs(
    tmp_path: Path,
) -> None:
    engine = Engine()
    runner = _runner(tmp_path, engine, visible_roots=["/srv"])
    item = _hold(runner, _queue(runner, "20260101-000000-ffff0001", "/srv/a"))
    queued = _queue(runner, "20260101-000000-ffff0002", "/srv/b")
    engine.up = False
    runner.beat()
    assert item.job.stops == [  # type: ignore[union-attr]
        (f"interrupted: the Docker engine {runner.engine.name} stopped answering", "INTERRUPTED")
    ]
    assert runner.engine.down
    assert runner.store.replicas()[0].engine_ok is False
    runner.service = runner.service.model_copy(update={"workers": 4})
    runner.dispatch()
    assert runner.store.get_job(queued.job_id).state == "queued"  # type: ignore[union-attr]
    runner.shutdown(timeout=1)


def test_a_replica_whose_lease_was_taken_over_is_fenced_off_its_job(tmp_path: Path) -> None:
    runner = _runner(tmp_path, Engine(), visible_roots=["/srv"])
    row = _queue(runner, "20260101-000000-abab0001", "/srv/a")
    item = _hold(runner, row)
    feed = EventFeed(runner.store, row.job_id, lambda: not item.fenced)
    assert runner.store.take_over(row.job_id, runner.leases.owner, "elsewhere 1")
    runner.store.update_state(row.job_id, "failed")  # the other replica ended it
    before = runner.store.events_after(row.job_id, 0)
    runner.beat()
    assert item.fenced
    assert item.job.stops == [(LEASE_LOST, "INTERRUPTED")]  # type: ignore[union-attr]
    record = SimpleNamespace(history=[("running", 1.0), ("failed", 2.0)], tool_calls=[], checks=[])
    feed.sync(record, final=True)  # type: ignore[arg-type]
    assert runner.store.events_after(row.job_id, 0) == before
    assert runner.store.get_job(row.job_id).state == "failed"  # type: ignore[union-attr]
    runner.shutdown(timeout=1)


def test_a_replica_not_renewed_in_time_stops_its_jobs_itself(tmp_path: Path) -> None:
    """The database does not answer the renewal: within the share of the lease nothing is
    stopped; past it every job is stopped and fenced; once a renewal says the job is still
    the replica's, its end is written again."""
    runner = _runner(tmp_path, Engine(), visible_roots=["/srv"], lease_seconds=3)
    item = _hold(runner, _queue(runner, "20260101-000000-acac0001", "/srv/a"))
    renew = runner.leases.renew

    def unreachable() -> list[str]:
        raise OSError("the database does not answer")

    runner.leases.renew = unreachable  # type: ignore[method-assign]
    with pytest.raises(OSError):
        runner.beat()
    assert item.job.stops == []  # type: ignore[union-attr]
    runner._renewed -= 3  # no renewal for a whole lease: another replica may own the job
    assert not runner.holding()
    with pytest.raises(OSError):
        runner.beat()
    assert item.job.stops == [(LEASE_LOST, "INTERRUPTED")]  # type: ignore[union-attr]
    assert item.fenced
    runner.leases.renew = renew  # type: ignore[method-assign]
    runner.beat()
    assert not item.fenced  # renewed again and still its own: its end is written
    runner.shutdown(timeout=1)


def test_a_job_whose_end_was_not_written_while_fenced_is_ended_once_renewed(
    tmp_path: Path,
) -> None:
    """A worker that ended while its replica was fenced wrote nothing; once the lease is
    renewed and still its own, the job's row is ended from the engine's record, never left
    running."""
    runner = _runner(tmp_path, Engine(), visible_roots=["/srv"])
    row = _queue(runner, "20260101-000000-adad0001", "/srv/a")
    _hold(runner, row)
    del runner._running[row.job_id]  # its worker is gone; the row still says running
    runner.beat()
    assert runner.store.get_job(row.job_id).state == "failed"  # type: ignore[union-attr]
    runner.shutdown(timeout=1)


class Daemon:
    """What removing a job's leftovers asks of the engine's client: a listing and removals;
    the first connection fails (the engine is not back for long)."""

    def __init__(self, labels: list[dict[str, str]]) -> None:
        self.found = [
            SimpleNamespace(id=f"c{n}" * 8, attrs={"Labels": x}) for n, x in enumerate(labels)
        ]
        self.removed: list[str] = []
        self.tries = 0
        self.containers = SimpleNamespace(list=lambda **_: list(self.found))
        self.api = SimpleNamespace(remove_container=lambda cid, **_: self.removed.append(cid))

    def connect(self) -> Daemon:
        self.tries += 1
        if self.tries == 1:
            raise OSError("connection refused")
        return self

    def close(self) -> None:
        return None


def test_what_the_engines_lost_jobs_left_is_removed_once_it_answers_again(
    tmp_path: Path,
) -> None:
    """This process's containers of no running job go (a lost job's, one that ended while
    the engine was away); its spares, a running job's and another process's stay."""
    engine = Engine()
    path = write_config(tmp_path, workers=0, service={"visible_roots": ["/srv"]})
    host, config = load_service_config(path)
    me = current_identity()
    lost = me.labels("20260101-000000-aeae0001", "sandbox")
    ended = me.labels("20260101-000000-aeae0002", "sandbox")
    running = me.labels("20260101-000000-aeae0003", "sandbox")
    spare = me.labels("20260101-000000-aeae0004", "spare")
    other = {**lost, CONTROLLER: "elsewhere"}
    daemon = Daemon([lost, ended, running, spare, other])
    runner = Runner(
        SqliteStore(tmp_path / "replica.db"),
        host,
        config,
        connect=daemon.connect,  # type: ignore[arg-type]
        ping=engine,
    )
    row = _queue(runner, "20260101-000000-aeae0001", "/srv/a")
    _hold(runner, row)
    _hold(runner, _queue(runner, "20260101-000000-aeae0003", "/srv/c"))
    engine.up = False
    runner.beat()
    del runner._running[row.job_id]  # its worker ended, INTERRUPTED
    engine.up = True
    with pytest.raises(OSError):
        runner.beat()  # the engine answers the ping, not yet the listing: tried again
    assert daemon.removed == []
    runner.beat()
    assert daemon.removed == [daemon.found[0].id, daemon.found[1].id]
    runner.beat()
    assert daemon.tries == 2  # nothing left to remove: no more connections
    runner.shutdown(timeout=1)
