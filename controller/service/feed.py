"""A running job's record turned into the service's events, in order, each once: its state
changes, its tool calls, its check results and the live output of a running check."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from controller.jobs.records import CheckResult, JobRecord, ToolCallRecord
from controller.service.store import (
    RUNNING_STATES,
    CheckData,
    CheckOutputData,
    ServiceStore,
    ToolCallData,
)

if TYPE_CHECKING:
    from controller.tools.watch import CheckLine

OUTPUT_EVERY = 0.5
"""Seconds between two ``check_output`` events of a running check (its lines since the
last one in each)."""
OUTPUT_LINES = 200
"""Lines one ``check_output`` event keeps (the newest)."""
LOOP_DONE = frozenset(
    {"validating", "checking", "awaiting_review", "applied", "no_change", "failed"}
)
"""States after the tool loop: every tool call is emitted before them."""
DECIDED = frozenset({"awaiting_review", "applied", "no_change", "failed", "cancelled"})
"""States after the checks: every check result is emitted before them."""


def tool_call_event(call: ToolCallRecord) -> ToolCallData:
    data = ToolCallData(
        turn=call.turn, id=call.id, name=call.name, ok=call.ok, error_code=call.error_code
    )
    if call.verdict is not None:
        data["verdict"] = call.verdict
    return data


def check_event(check: CheckResult) -> CheckData:
    return CheckData(
        id=check.id, status=check.status, exit_code=check.exit_code, duration_ms=check.duration_ms
    )


class EventFeed:
    """Turns one job record's progress into events, in order, each once: state changes (the
    record's history), then its tool calls before the loop ends, its checks before the
    decision. Safe to call from several threads. Nothing is written while ``allowed`` says
    no (a replica fenced off the job): what is new then is written once it says yes."""

    def __init__(
        self, store: ServiceStore, job_id: str, allowed: Callable[[], bool] = lambda: True
    ) -> None:
        self._store = store
        self._job_id = job_id
        self._allowed = allowed
        self._lock = threading.Lock()
        self._states = 0
        self._calls = 0
        self._checks_done = False
        self._output: list[CheckLine] = []
        self._dropped = 0
        self._flushed = time.monotonic()

    def output(self, line: CheckLine) -> None:
        """A line of the running check's output: kept for the next ``check_output`` event,
        emitted once :data:`OUTPUT_EVERY` seconds passed since the last one."""
        with self._lock:
            self._output.append(line)
            if len(self._output) > OUTPUT_LINES:
                del self._output[0]
                self._dropped += 1
            if time.monotonic() - self._flushed >= OUTPUT_EVERY and self._allowed():
                self._emit_output()

    def _emit_output(self) -> None:
        """Under the lock: the kept lines as ``check_output`` events (one per check run)."""
        self._flushed = time.monotonic()
        lines, self._output = self._output, []
        dropped, self._dropped = self._dropped, 0
        while lines:
            first = lines[0]
            same = [x for x in lines if x.handle == first.handle]
            lines = [x for x in lines if x.handle != first.handle]
            data = CheckOutputData(
                check_id=first.check_id,
                handle=first.handle,
                lines=[x.line for x in same],
                dropped=dropped,
            )
            dropped = 0
            self._store.append_event(self._job_id, "check_output", data)

    def sync(self, record: JobRecord, *, final: bool = False) -> None:
        """Emits what is new. The job's end state is held back until ``final`` (its worker
        returned: containers removed, evidence written), so a client that sees it, or whose
        stream ends, finds nothing of the job still running."""
        with self._lock:
            if not self._allowed():
                return
            if self._output:
                self._emit_output()  # before the call that ran the check
            history = list(record.history)
            calls = record.tool_calls[self._calls :]  # only what is new: a long job stays cheap
            checks = list(record.checks)
            while self._states < len(history):
                state = history[self._states][0]
                if not final and state not in RUNNING_STATES:
                    break
                if state in LOOP_DONE | DECIDED:
                    self._emit_calls(calls)
                if state in DECIDED:
                    self._emit_checks(checks)
                self._store.append_event(self._job_id, "state", {"state": state})
                self._store.update_state(self._job_id, state)
                self._states += 1
            if self._states and history[self._states - 1][0] == "running":
                self._emit_calls(calls)

    def _emit_calls(self, new: list[ToolCallRecord]) -> None:
        """Emits the calls of ``new`` (the record's calls from the first not emitted at the
        start of this sync) that are not emitted yet."""
        for call in new:
            self._store.append_event(self._job_id, "tool_call", tool_call_event(call))
        self._calls += len(new)
        new.clear()

    def _emit_checks(self, checks: list[CheckResult]) -> None:
        if self._checks_done:
            return
        for check in checks:
            self._store.append_event(self._job_id, "check", check_event(check))
        self._checks_done = True
