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
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol, cast

from controller.errors import CancelledError, ErrorCode, LimitExceededError, PatchboxError
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
    from collections.abc import Callable

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
    step: Callable[[str], None] = lambda _what: None
    """Told what the loop is doing now (waiting for the model, running a call)."""
    called: Callable[[CallDone], None] = lambda _done: None
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

    def run(self) -> str:
        """Turns until the model answers without a tool call; returns that answer (its first
        :data:`FINAL_MESSAGE_CHARS` characters). Every other exit raises (module docstring)."""
        limits = self.limits
        clock = self.clock or WorkClock(limits.wall_seconds)
        self.calls_left, self.bytes_left = limits.max_tool_calls, MAX_RESULT_BYTES
        results: list[ToolResult] = []
        nudged = False
        for turn in range(1, limits.max_turns + 2):
            if self.cancelled.is_set():
                raise cancelled_error()
            if clock.expired():
                raise LimitExceededError(f"wall-clock limit of {limits.wall_seconds:g} s reached")
            asked = time.monotonic()
            if self.idle_while_asking:
                self.step("waiting for the next call")
                clock.pause()
            try:
                model_turn = self._ask(results, nudge=nudged and turn == 2)
            except CancelledError as exc:
                raise cancelled_error() from exc
            finally:
                clock.resume()
            model_ms = round((time.monotonic() - asked) * 1000)
            if not model_turn.tool_calls:
                self._transcribe(turn, model_turn, model_ms, [])
                if turn == 1 or (nudged and turn == 2):
                    nudged = self._without_tools(model_turn, nudged=nudged)
                    continue
                return (model_turn.text or "")[:FINAL_MESSAGE_CHARS]
            if turn > limits.max_turns:
                break
            calls: list[TranscriptCall] = []
            try:
                results = [self._call(turn, call, calls) for call in model_turn.tool_calls]
            finally:
                self._transcribe(turn, model_turn, model_ms, calls)
            self.save()
        raise LimitExceededError(f"more than {limits.max_turns} turns")

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


SUBJECT_CHARS = 80
"""Characters of a call's subject (a path, a check id, a query) in its progress line."""


@dataclass(frozen=True)
class CallDone:
    """One tool call that ended, as the loop recorded it: what it named and how it ended
    (a check's own verdict and exit code from its result), for a progress line."""

    turn: int
    name: str
    subject: str
    """The path, check id, query or glob the call named; the files a patch wrote; or ''."""
    ok: bool
    error_code: str | None = None
    check_status: str | None = None
    """A check run's ``passed``, ``failed`` or ``timed_out``."""
    exit_code: int | None = None
    reused: bool = False

    @classmethod
    def of(
        cls, turn: int, call: ToolCall, result: Mapping[str, Any] | None, error_code: str | None
    ) -> CallDone:
        """The call's event from its arguments and its result (None: it raised)."""
        status = (result or {}).get("status") if call.name == "run_check" else None
        exit_code = (result or {}).get("exitCode")
        return cls(
            turn=turn,
            name=strip_control(call.name),
            subject=_subject(call, result),
            ok=error_code is None,
            error_code=error_code,
            check_status=status if isinstance(status, str) else None,
            exit_code=exit_code if isinstance(exit_code, int) and status is not None else None,
            reused=bool((result or {}).get("reused")) and status is not None,
        )

    def line(self) -> str:
        """``turn 3 run_check tests: failed (exit 1)``, ``turn 1 read_file src/x.py``."""
        head = " ".join(p for p in (f"turn {self.turn}", self.name, self.subject) if p)
        if self.error_code == "CANCELLED":
            return f"{head}: cancelled"
        if not self.ok:
            return f"{head}: error {self.error_code}"
        if self.check_status is None:
            return head
        notes = [f"exit {self.exit_code}"] if self.exit_code is not None else []
        notes += ["reused"] if self.reused else []
        verdict = self.check_status.replace("_", " ")
        return f"{head}: {verdict}" + (f" ({', '.join(notes)})" if notes else "")


def _subject(call: ToolCall, result: Mapping[str, Any] | None) -> str:
    """What a call named, in one short line (untrusted: controls removed, bounded)."""
    keys = {
        "read_file": ("path",),
        "replace_text": ("path",),
        "run_check": ("checkId",),
        "search_text": ("query",),
        "list_files": ("glob",),
    }.get(call.name, ())
    args: object = {}
    if keys:  # a patch's arguments (the patch) are not read again
        try:
            args = json.loads(call.arguments)
        except (ValueError, RecursionError):
            args = {}
    if not isinstance(args, dict):
        args = {}
    words = [str(args[k]) for k in keys if isinstance(args.get(k), str)]
    if call.name == "search_text" and words:
        words = [json.dumps(words[0][:SUBJECT_CHARS], ensure_ascii=False)]
    if call.name == "apply_patch" and result is not None:
        files = result.get("files")
        paths = [str(f.get("path")) for f in files or [] if isinstance(f, dict)]
        words = [", ".join(paths[:3]) + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")]
    text = " ".join(w for w in words if w).replace("\n", " ")
    text = strip_control(text)
    return text if len(text) <= SUBJECT_CHARS else text[: SUBJECT_CHARS - 3] + "..."


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
