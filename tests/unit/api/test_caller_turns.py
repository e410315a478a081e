"""A session's turns (:class:`controller.api.caller.CallerProvider` driving a
:class:`controller.jobs.loop.ToolLoop`): each tool-call turn runs on the caller's thread
while the job's thread waits; each turn's save runs once, before the next turn and before
the loop ends (on the job's thread, or on the caller's when its next call comes first);
what a turn or a save raises ends the job. Fake tools, no Docker."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest

from controller.api.caller import CallerProvider
from controller.config.limits import Limits
from controller.errors import ErrorCode, PatchboxError
from controller.jobs.loop import ToolLoop
from controller.jobs.records import JobRecord
from controller.providers.base import ModelTurn, ToolCall
from controller.tools.outcome import ToolOutcome
from tests.support.loop import FakeTools


@dataclass
class _Noted(FakeTools):
    """Fake tools that note the thread each call ran on."""

    threads: list[str] = field(default_factory=list)
    interrupts: str = ""
    """A call id whose call is interrupted (``KeyboardInterrupt`` on the caller's thread)."""

    def execute(self, turn: int, call_id: str, tool: str, raw: str) -> ToolOutcome:
        self.threads.append(threading.current_thread().name)
        if call_id == self.interrupts:
            raise KeyboardInterrupt
        return super().execute(turn, call_id, tool, raw)


@dataclass
class _Saves:
    """The loop's per-turn saves: where each ran and how many calls the record had then."""

    record: JobRecord
    done: list[tuple[str, int]] = field(default_factory=list)
    fails: BaseException | None = None
    later: list[int] = field(default_factory=list)
    """The calls the record had when each deferred save was made."""

    def save(self) -> None:
        self.done.append((threading.current_thread().name, len(self.record.tool_calls)))

    def save_later(self) -> Callable[[], None]:
        self.later.append(len(self.record.tool_calls))

        def run() -> None:
            if self.fails is not None:
                raise self.fails
            self.save()

        return run


@dataclass
class _Job:
    provider: CallerProvider
    loop: ToolLoop
    saves: _Saves
    tools: _Noted
    outcome: list[object] = field(default_factory=list)
    thread: threading.Thread | None = None

    def result(self) -> object:
        assert self.thread is not None
        self.thread.join(10)
        assert not self.thread.is_alive()
        return self.outcome[0]


def _saved(job: _Job, n: int) -> None:
    """Waits until ``n`` saves ran (the job's thread saves while the caller goes on)."""
    deadline = time.monotonic() + 10
    while len(job.saves.done) < n:
        assert time.monotonic() < deadline, job.saves.done
        time.sleep(0.001)


def _turn(call_id: str, tool: str = "read_file") -> ModelTurn:
    return ModelTurn(tool_calls=[ToolCall(id=call_id, name=tool, arguments="{}")])


@pytest.fixture
def job() -> Iterator[_Job]:
    provider = CallerProvider()
    record = JobRecord(job_id="j", repo="/r")
    saves = _Saves(record)
    tools = _Noted(raises="boom")
    loop = ToolLoop(
        provider,
        tools,
        Limits(max_turns=5),
        record,
        threading.Event(),
        saves.save,
        save_later=saves.save_later,
        idle_while_asking=True,
    )
    made = _Job(provider, loop, saves, tools)

    def work() -> None:
        try:
            made.outcome.append(loop.run())
        except BaseException as exc:  # handed to the test
            made.outcome.append(exc)

    made.thread = threading.Thread(target=work, name="job-thread", daemon=True)
    made.thread.start()
    assert provider.waiting.wait(10)
    yield made
    provider.cancel()
    made.thread.join(10)


def test_turns_run_on_the_callers_thread_and_saves_on_the_jobs(job: _Job) -> None:
    for n in range(1, 4):
        results = job.provider.take(_turn(f"s{n}"))
        assert results is not None
        assert [r.call_id for r in results] == [f"s{n}"]
        _saved(job, n)  # a caller that pauses: the job's thread saved meanwhile
    job.provider.ask(ModelTurn(text="proposed"))
    assert job.result() == "proposed"
    caller = threading.current_thread().name
    assert job.tools.threads == [caller] * 3
    # every turn's save ran, on the job's thread, each after its own turn
    assert job.saves.later == [1, 2, 3]
    assert [thread for thread, _ in job.saves.done] == ["job-thread"] * 3
    assert [(t.turn, [c.id for c in t.calls]) for t in job.loop.record.transcript] == [
        (1, ["s1"]),
        (2, ["s2"]),
        (3, ["s3"]),
        (4, []),
    ]


def test_calls_back_to_back_save_each_turn_once_before_the_next(job: _Job) -> None:
    for n in range(1, 6):  # as many turns as the limit allows
        assert job.provider.take(_turn(f"s{n}")) is not None
    job.provider.ask(ModelTurn(text="done"))
    assert job.result() == "done"
    # each turn saved once, before the next turn began (by whichever thread came first)
    assert [calls for _, calls in job.saves.done] == list(range(1, 6))
    assert {thread for thread, _ in job.saves.done} <= {"job-thread", "MainThread"}


def test_a_turn_that_raises_ends_the_job_with_its_error(job: _Job) -> None:
    assert job.provider.take(_turn("s1")) is not None
    assert job.provider.take(_turn("boom", "replace_text")) is None
    error = job.result()
    assert isinstance(error, PatchboxError)
    assert error.code is ErrorCode.SANDBOX_FAILED
    assert job.provider.take(_turn("s3")) is None  # the job has ended
    assert [c.id for c in job.loop.record.tool_calls] == ["s1", "boom"]
    # the first turn's save ran; the failed one is left to the job's own end (its record)
    assert [calls for _, calls in job.saves.done] == [1]


def test_a_save_that_raises_ends_the_job_with_its_error(job: _Job) -> None:
    job.saves.fails = OSError(28, "No space left on device")
    assert job.provider.take(_turn("s1")) is not None
    error = job.result()  # the job's thread made the save
    assert isinstance(error, OSError)
    assert error.errno == 28
    assert job.provider.take(_turn("s2")) is None


def test_a_save_made_by_the_next_call_that_raises_ends_the_job_with_its_error(
    job: _Job,
) -> None:
    job.saves.fails = OSError(28, "No space left on device")
    with job.provider._state:  # holds the job's thread off: the next call makes the save
        assert job.provider.take(_turn("s1")) is not None
        assert job.provider.take(_turn("s2")) is None
    error = job.result()
    assert isinstance(error, OSError)
    assert error.errno == 28
    assert [c.id for c in job.loop.record.tool_calls] == ["s1"]  # s2 never ran


def test_a_call_that_comes_first_makes_the_last_turns_save_itself(job: _Job) -> None:
    with job.provider._state:  # holds the job's thread off
        assert job.provider.take(_turn("s1")) is not None
        assert job.saves.done == []
        assert job.provider.take(_turn("s2")) is not None
    assert job.saves.done[0] == (threading.current_thread().name, 1)
    job.provider.ask(ModelTurn(text="done"))
    assert job.result() == "done"
    assert job.saves.done[1:] == [("job-thread", 2)]


def test_a_limit_reached_by_a_turn_ends_the_job(job: _Job) -> None:
    for n in range(1, 6):
        assert job.provider.take(_turn(f"s{n}")) is not None
    assert job.provider.take(_turn("s6")) is None
    error = job.result()
    assert isinstance(error, PatchboxError)
    assert error.code is ErrorCode.LIMIT_EXCEEDED
    assert "more than 5 turns" in error.message
    assert len(job.loop.record.tool_calls) == 5


def test_a_cancel_between_turns_ends_the_job_cancelled_after_the_last_save(job: _Job) -> None:
    assert job.provider.take(_turn("s1")) is not None
    job.loop.cancelled.set()
    job.provider.cancel()
    error = job.result()
    assert isinstance(error, PatchboxError)
    assert error.code is ErrorCode.CANCELLED
    assert job.saves.done == [("job-thread", 1)]
    assert job.provider.take(_turn("s2")) is None


def test_a_caller_interrupted_midway_cancels_the_job(job: _Job) -> None:
    job.tools.interrupts = "s1"
    with pytest.raises(KeyboardInterrupt):
        job.provider.take(_turn("s1"))
    error = job.result()
    assert isinstance(error, PatchboxError)
    assert error.code is ErrorCode.CANCELLED
