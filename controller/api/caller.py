"""The provider of a session (:class:`CallerProvider`): the caller is the model, and each of
its tool-call turns runs on the caller's own thread."""

from __future__ import annotations

import threading
from collections.abc import Callable

from controller.errors import CancelledError
from controller.jobs.loop import CallerTurn
from controller.providers.base import ModelTurn, ToolResult, check_results


class CallerProvider:
    """The provider of a session: the caller is the model. Its tool-call turns run on the
    caller's own thread (:meth:`take`, through the loop's
    :meth:`~controller.jobs.loop.ToolLoop.caller_turn`) while the job's thread waits in
    :meth:`next_turn` for the session's last turn (a proposal) or its end, saving each turn
    meanwhile while its result goes back: a call costs no hand-over between threads. A call
    that comes before the job's thread began the last turn's save makes that save itself
    first; one that comes while it runs waits for it."""

    def __init__(self) -> None:
        self._state = threading.Condition()
        self._run_turn: Callable[[ModelTurn], CallerTurn] | None = None
        self._last: ModelTurn | None = None
        """The session's last turn (no tool call), until the job's thread takes it."""
        self._busy = False
        """A caller's turn runs, or the job's thread saves one."""
        self._then: Callable[[], object] | None = None
        """The last turn's save, until the job's thread runs it."""
        self._over = False
        """The job's thread takes no more turns: the last one was asked, the session
        cancelled, a turn raised, or the job ended."""
        self._cancelled = False
        self._raised: BaseException | None = None
        """What a turn's save made on the caller's thread raised: the job's end."""
        self.waiting = threading.Event()
        """Set while the engine waits for the caller's turns."""

    def serve(self, run_turn: Callable[[ModelTurn], CallerTurn]) -> None:
        self._run_turn = run_turn

    def next_turn(self, results: list[ToolResult]) -> ModelTurn:
        check_results(None, results)
        while True:
            with self._state:
                self.waiting.set()
                while self._busy or (self._then is None and self._last is None and not self._over):
                    self._state.wait()
                then, self._then = self._then, None
                if then is None:
                    self.waiting.clear()
                    last, self._last, self._over = self._last, None, True
                    break
                self._busy = True
            try:
                then()
            except BaseException:
                with self._state:
                    self._over = True
                raise
            finally:
                with self._state:
                    self._busy = False
                    self._state.notify_all()
        if self._raised is not None:
            raise self._raised
        if last is None or self._cancelled:
            raise CancelledError("the session was cancelled")
        return last

    def take(self, turn: ModelTurn) -> list[ToolResult] | None:
        """Runs a turn with tool calls on this thread; None when the job has ended (or
        this turn ended it: what it raised is the job's error)."""
        with self._state:
            while self._busy and not self._over:
                self._state.wait()  # the last turn's save, by the job's thread
            if self._busy or self._over or self._run_turn is None or not self.waiting.is_set():
                return None
            then, self._then = self._then, None  # not begun by the job's thread: made here
            self._busy = True
        done: CallerTurn | None = None
        ended = True
        try:
            if then is not None:
                self._save(then)
            done = self._run_turn(turn)
            check_results(turn, done.results)
            ended = False
        except Exception:  # the job's end: the job's thread raises it
            return None
        finally:
            with self._state:
                self._busy = False
                self._over = self._over or ended
                self._then = None if done is None else done.then
                self._state.notify_all()
        return done.results

    def _save(self, then: Callable[[], object]) -> None:
        """The last turn's save, on this thread; what it raises ends the job (a caller
        interrupted midway cancels it)."""
        try:
            then()
        except Exception as exc:
            self._raised = exc
            raise
        except BaseException:
            self._raised = CancelledError("the session's call was interrupted")
            raise

    def ask(self, turn: ModelTurn) -> None:
        """The session's last turn (no tool call): the job's thread ends the loop with it."""
        with self._state:
            if not self._over:
                self._last = turn
            self._state.notify_all()

    def job_ended(self) -> None:
        with self._state:
            self._over = True
            self._state.notify_all()

    def cancel(self) -> None:
        with self._state:
            self._cancelled = self._over = True
            self._state.notify_all()

    def close(self) -> None:
        return None
