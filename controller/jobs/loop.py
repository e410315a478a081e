"""The tool loop: the model asks for tool calls, the tools run in the sandbox, the results go
back, until the model answers without a tool call.

Every call is written to the job record as it ends (a :class:`ToolCallRecord`), and every
one that may change the workspace (an edit, a patch, a check run) to the effect ledger too
(a :class:`LedgerEntry`). The loop's other exits are exceptions, which the job records in one
place: ``CANCELLED``, ``LIMIT_EXCEEDED`` (turns, tool calls, result bytes, wall clock),
``MODEL_TOOL_CALL_UNSUPPORTED`` (a first turn without a tool call) and whatever a tool raised.

A first turn with text but no tool call gets one nudge first, where the provider can take
the conversation up again (:class:`~controller.providers.base.Nudgeable`): a user message
naming the tools (:data:`NUDGE_MESSAGE`). The nudge's answer is the next turn (it counts
against ``max_turns``); only if it has no tool call either does the job end with
``MODEL_TOOL_CALL_UNSUPPORTED``.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, cast, runtime_checkable

from controller.errors import CancelledError, ErrorCode, LimitExceededError, PatchboxError
from controller.jobs.calldone import CallDone
from controller.jobs.records import (
    TRANSCRIPT_TEXT,
    EffectTool,
    JobRecord,
    LedgerEntry,
    LedgerFile,
    ToolCallRecord,
    TranscriptCall,
    TranscriptTurn,
)
from controller.providers.base import Nudgeable, ToolResult
from controller.sandbox.base import WorkClock
from controller.text import strip_control
from controller.tools.schemas import ARGUMENT_MODELS

if TYPE_CHECKING:
    import threading

    from controller.config.limits import Limits
    from controller.providers.base import ModelTurn, Provider, ToolCall
    from controller.tools.outcome import ResultFields, ToolOutcome

MAX_RESULT_BYTES = 64 * 1024 * 1024
"""Tool-result bytes sent back to the model over a whole job."""
FINAL_MESSAGE_CHARS = 4000
INTENTS: dict[str, Literal["edit", "patch", "check"]] = {
    "replace_text": "edit",
    "apply_patch": "patch",
    "run_check": "check",
}
"""The tools that may change the workspace, each with its ledger intent."""
NUDGE_MESSAGE = (
    "Use the tools to work on the task: answer with a tool call ("
    + ", ".join(ARGUMENT_MODELS)
    + "), not with text alone. Answer without a tool call only when the task is done."
)
"""Sent once, as a user message, when the model's first turn is text without a tool call."""


@dataclass(frozen=True)
class CallerTurn:
    """A caller's turn done (:meth:`ToolLoop.caller_turn`): its results, and the turn's save
    when it is left to the job's thread (the provider runs it there before the next turn,
    and before its ``next_turn`` returns or raises)."""

    results: list[ToolResult]
    then: Callable[[], object] | None = None


@runtime_checkable
class CallerTurns(Protocol):
    """A provider whose caller runs the tool-call turns on its own thread (a session): the
    loop hands it :meth:`ToolLoop.caller_turn` before its first turn. Its ``next_turn``
    then returns only a turn without tool calls (the end), and raises
    :class:`~controller.errors.CancelledError` when the job is cancelled or a caller's
    turn raised, once no caller's turn runs any more and every turn's save ran; what a
    save raises, it raises."""

    def serve(self, run_turn: Callable[[ModelTurn], CallerTurn]) -> None: ...


class Tools(Protocol):
    """Runs one tool call in the sandbox (:class:`controller.tools.executor.ToolExecutor`)."""

    def execute(self, turn: int, call_id: str, tool: str, raw: str) -> ToolOutcome: ...


CANCELLED_MESSAGE = "the job was cancelled"
"""A cancelled job's error message when its canceller gave no reason."""


def cancelled_error() -> PatchboxError:
    return PatchboxError(CANCELLED_MESSAGE, code=ErrorCode.CANCELLED)


@dataclass
class ToolLoop:
    """One job's tool loop; :meth:`run` is called once."""

    provider: Provider
    tools: Tools
    limits: Limits
    record: JobRecord
    """Gets a :class:`ToolCallRecord` for every call and the ledger's entries."""
    cancelled: threading.Event
    save: Callable[[], object]
    """Called after each turn, so a later process sees the calls made so far."""
    save_later: Callable[[], Callable[[], object]] | None = None
    """For a :class:`CallerTurns` provider: the per-turn save, made at the turn's end to be
    run by the job's thread while the turn's result goes back to the caller (None: the
    caller's thread saves before the result goes back)."""
    step: Callable[[str], None] = lambda _what: None
    """Told what the loop is doing now (waiting for the model, running a call)."""
    called: Callable[[CallDone], None] | None = None
    """Told of every call that ended, as it is recorded (a progress line per call)."""
    version: int = 0
    """The workspace version: as the agent's tools report it; a check run bumps it once."""
    calls_left: int = 0
    """Tool calls the job may still make (set by :meth:`run`)."""
    bytes_left: int = 0
    """Tool-result bytes the job may still send back (set by :meth:`run`)."""
    clock: WorkClock | None = None
    """The job's wall clock (the sandbox's); a new one started by :meth:`run` when None."""
    idle_while_asking: bool = False
    """The provider is a caller (a session): the clock is paused while the loop waits for
    its next turn, so only the tool calls' time counts against ``wall_seconds``."""
    turn: int = 0
    """The turns taken so far."""
    _clock: WorkClock = field(init=False, repr=False)
    _asked: float = field(init=False, repr=False, default=0.0)
    """When the loop began to wait for the next turn."""
    _failure: BaseException | None = field(init=False, repr=False, default=None)
    """What a caller's turn raised: the job's end."""

    def run(self) -> str:
        """Turns until the model answers without a tool call; returns that answer (its first
        :data:`FINAL_MESSAGE_CHARS` characters). Every other exit raises (module docstring).
        A :class:`CallerTurns` provider runs its tool-call turns itself, through
        :meth:`caller_turn`, while this waits for its last turn."""
        limits = self.limits
        clock = self._clock = self.clock or WorkClock(limits.wall_seconds)
        self.calls_left, self.bytes_left = limits.max_tool_calls, MAX_RESULT_BYTES
        results: list[ToolResult] = []
        nudged = False
        if isinstance(self.provider, CallerTurns):
            self.provider.serve(self.caller_turn)
        while True:
            self._ready(clock)
            self._asked = time.monotonic()
            model_turn = self._wait(results, clock, nudge=nudged and self.turn == 1)
            turn = self.turn = self.turn + 1
            model_ms = round((time.monotonic() - self._asked) * 1000)
            if not model_turn.tool_calls:
                self._transcribe(turn, model_turn, model_ms, [])
                if turn == 1 or (nudged and turn == 2):
                    nudged = self._without_tools(model_turn, nudged=nudged)
                    continue
                return (model_turn.text or "")[:FINAL_MESSAGE_CHARS]
            results = self._take(turn, model_turn, model_ms)
            self.save()

    def caller_turn(self, model_turn: ModelTurn) -> CallerTurn:
        """One tool-call turn of a :class:`CallerTurns` provider, run on its caller's thread
        while :meth:`run` waits (never at the same time as anything else of the loop): the
        turn as :meth:`run` takes it, the checks before the next turn, and its save (or,
        with :attr:`save_later`, the save for the job's thread to run). What it raises (a
        limit, a broken sandbox, the job cancelled meanwhile) ends the job: the provider
        wakes :meth:`run`, which raises it; a caller interrupted midway
        (``KeyboardInterrupt``) cancels the job."""
        clock = self._clock
        clock.resume()
        try:
            turn = self.turn = self.turn + 1
            model_ms = round((time.monotonic() - self._asked) * 1000)
            results = self._take(turn, model_turn, model_ms)
            try:
                self._ready(clock)
            except Exception:
                self.save()
                raise
            then = None if self.save_later is None else self.save_later()
            if then is None:
                self.save()
        except Exception as exc:
            self._failure = exc
            raise
        except BaseException:
            self._failure = cancelled_error()
            raise
        finally:
            self._asked = time.monotonic()
            if self.idle_while_asking:
                self.step("waiting for the next call")
                clock.pause()
        return CallerTurn(results, then)

    def _ready(self, clock: WorkClock) -> None:
        """Before each turn: the job not cancelled, its clock not out."""
        if self.cancelled.is_set():
            raise cancelled_error()
        if clock.expired():
            raise LimitExceededError(f"wall-clock limit of {self.limits.wall_seconds:g} s reached")

    def _wait(self, results: list[ToolResult], clock: WorkClock, *, nudge: bool) -> ModelTurn:
        """The model's next turn, the clock paused meanwhile for a caller; what a caller's
        turn raised meanwhile is raised here."""
        if self.idle_while_asking:
            self.step("waiting for the next call")
            clock.pause()
        model_turn: ModelTurn | None = None
        try:
            model_turn = self._ask(results, nudge=nudge)
        except CancelledError as exc:
            if self._failure is None:
                raise cancelled_error() from exc
        finally:
            clock.resume()
        if self._failure is not None:
            raise self._failure
        assert model_turn is not None  # noqa: S101 - else it raised
        return model_turn

    def _take(self, turn: int, model_turn: ModelTurn, model_ms: int) -> list[ToolResult]:
        """Runs a turn's tool calls and transcribes it."""
        if turn > self.limits.max_turns:
            raise LimitExceededError(f"more than {self.limits.max_turns} turns")
        calls: list[TranscriptCall] = []
        try:
            return [self._call(turn, call, calls) for call in model_turn.tool_calls]
        finally:
            self._transcribe(turn, model_turn, model_ms, calls)

    def _ask(self, results: list[ToolResult], *, nudge: bool) -> ModelTurn:
        """The model's next turn: after ``results``, or after the nudge."""
        if nudge and isinstance(self.provider, Nudgeable):
            return self.provider.nudge(NUDGE_MESSAGE)
        return self.provider.next_turn(results)

    def _without_tools(self, model_turn: ModelTurn, *, nudged: bool) -> bool:
        """A first turn (or the nudge's answer) without a tool call: True when the model is
        to be nudged, else ``MODEL_TOOL_CALL_UNSUPPORTED``."""
        if not nudged and model_turn.text and isinstance(self.provider, Nudgeable):
            return True
        reason = (
            "the model answered without a tool call, also after being asked to use the tools"
            if nudged
            else "the model's first turn has no tool call"
        )
        raise PatchboxError(
            f"{reason}: it does not use tools", code=ErrorCode.MODEL_TOOL_CALL_UNSUPPORTED
        )

    def _transcribe(
        self, turn: int, model_turn: ModelTurn, model_ms: int, calls: list[TranscriptCall]
    ) -> None:
        text = model_turn.text
        self.record.transcript.append(
            TranscriptTurn(
                turn=turn,
                text=None if text is None else strip_control(text)[:TRANSCRIPT_TEXT],
                usage=dict(model_turn.usage),
                model_ms=model_ms,
                calls=calls,
            )
        )

    def _call(self, turn: int, call: ToolCall, transcript: list[TranscriptCall]) -> ToolResult:
        """Runs one call, counting the job's calls and result bytes down."""
        self.calls_left -= 1
        if self.calls_left < 0:
            raise LimitExceededError(f"more than {self.limits.max_tool_calls} tool calls")
        started = time.monotonic()
        self.step(f"tool call {call.id} {call.name} (turn {turn})")
        try:
            outcome = self._execute(turn, call)
        except PatchboxError as exc:
            error = {"error": exc.to_dict()}
            transcript.append(_transcript_call(call, json.dumps(error), started, ok=False))
            raise
        content = json.dumps(outcome.for_model(), ensure_ascii=False)
        transcript.append(
            _transcript_call(call, content, started, ok=outcome.ok, verdict=outcome.verdict)
        )
        self.bytes_left -= len(content.encode())
        if self.bytes_left < 0:
            raise LimitExceededError("tool results exceed the job's byte limit")
        return ToolResult(call_id=call.id, name=call.name, content=content)

    def _execute(self, turn: int, call: ToolCall) -> ToolOutcome:
        """Runs the call and records it; a call that raised leaves an ``unknown`` entry."""
        calls, ledger = self.record.tool_calls, self.record.ledger
        try:
            outcome = self.tools.execute(turn, call.id, call.name, call.arguments)
        except PatchboxError as exc:
            failed = ErrorCode.CANCELLED if self.cancelled.is_set() else exc.code
            calls.append(
                _call_record(
                    turn,
                    call,
                    ok=False,
                    error_code=str(failed),
                    error_message=(
                        "the job was cancelled while the call ran"
                        if failed is ErrorCode.CANCELLED
                        else exc.message[:1000]
                    ),
                )
            )
            if call.name in INTENTS:
                ledger.append(self._entry(turn, call, {}, "unknown"))
            self._tell(turn, call, None, calls[-1].error_code)
            raise
        error = outcome.error
        calls.append(
            _call_record(
                turn,
                call,
                ok=outcome.ok,
                error_code=error["code"] if error else None,
                error_message=error["message"][:1000] if error else None,
                verdict=outcome.verdict,
            )
        )
        if outcome.effect != "none" or call.name in {"replace_text", "apply_patch"}:
            ledger.append(self._entry(turn, call, outcome.fields, _done(outcome)))
        self._tell(turn, call, outcome.result, calls[-1].error_code)
        result = outcome.fields
        if isinstance(result.get("version"), int):
            self.version = result["version"]
        elif (
            call.name == "run_check"
            and outcome.ok
            and not result.get("reused")
            and (outcome.result or {}).get("status") != "running"
        ):
            self.version += 1
        return outcome

    def _tell(
        self, turn: int, call: ToolCall, result: Mapping[str, Any] | None, error_code: str | None
    ) -> None:
        """Tells :attr:`called` of the call; a fault in telling (the listener's, or untrusted
        arguments that do not parse) never ends the job."""
        if self.called is None:
            return
        with contextlib.suppress(Exception):
            self.called(CallDone.of(turn, call, result, error_code))

    def _entry(
        self,
        turn: int,
        call: ToolCall,
        result: ResultFields,
        outcome: Literal["done", "rejected", "unknown"],
    ) -> LedgerEntry:
        return LedgerEntry(
            turn=turn,
            id=call.id,
            tool=cast("EffectTool", call.name),  # a key of INTENTS
            intent=INTENTS[call.name],
            version_before=self.version,
            files=ledger_files(call.name, result),
            outcome=outcome,
        )


def _transcript_call(
    call: ToolCall, content: str, started: float, *, ok: bool, verdict: str | None = None
) -> TranscriptCall:
    result = strip_control(content)
    return TranscriptCall(
        id=call.id,
        name=call.name,
        arguments=call.arguments[:TRANSCRIPT_TEXT],
        ok=ok,
        verdict=verdict,
        result=result[:TRANSCRIPT_TEXT],
        truncated=len(result) > TRANSCRIPT_TEXT or len(call.arguments) > TRANSCRIPT_TEXT,
        duration_ms=round((time.monotonic() - started) * 1000),
    )


def _done(outcome: ToolOutcome) -> Literal["done", "rejected"]:
    return "done" if outcome.ok else "rejected"


def _call_record(turn: int, call: ToolCall, *, ok: bool, **outcome: str | None) -> ToolCallRecord:
    """The record of ``call``: ``outcome`` holds its ``error_code`` and ``error_message`` (a
    refused call) or its ``verdict`` (a check that ran)."""
    return ToolCallRecord(turn=turn, id=call.id, name=call.name, ok=ok, **outcome)


def ledger_files(tool: str, result: ResultFields) -> list[LedgerFile]:
    """The files a call's result names, each with the content it left: the hash an edit or
    a patch reports (None for a path a patch removed or renamed away); a check says only
    which paths changed."""
    if tool == "replace_text" and "path" in result:
        return [LedgerFile(path=result["path"], sha256=result.get("sha256After"))]
    files: list[LedgerFile] = []
    if tool == "apply_patch":
        for f in result.get("files", []):
            files.append(LedgerFile(path=f["path"], sha256=f.get("sha256After")))
            old_path = f.get("oldPath")
            if old_path:
                files.append(LedgerFile(path=old_path))
    elif tool == "run_check":
        changes = result.get("changes") or {}
        for paths in (
            changes.get("added", []),
            changes.get("modified", []),
            changes.get("removed", []),
        ):
            files += [LedgerFile(path=p) for p in paths]
    return files
