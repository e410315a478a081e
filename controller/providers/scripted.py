"""The deterministic provider: the tool calls of a calls file, one turn per call.

A calls file is operator-trusted but still parsed strictly: unknown fields, a missing
``turns``, an ``arguments`` value that is not an object, duplicate ids within one turn,
duplicate JSON keys and sizes past the bounds below are a :class:`UsageError`. Tool names
and argument contents are not checked here; the loop validates them like a model's.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Annotated, Any, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from controller.config.inputfile import read_input_file
from controller.errormap import describe_validation
from controller.errors import CancelledError, ProviderError, UsageError
from controller.providers.base import (
    MAX_JSON_DEPTH,
    CallId,
    ModelTurn,
    ToolCall,
    ToolNameText,
    ToolResult,
    check_results,
    duplicate_id,
)
from controller.strictjson import loads

MAX_CALLS_FILE_BYTES = 64 * 1024 * 1024
"""The largest calls file read (room for a few 8 MiB patches)."""
MAX_TURNS = 10_000
MAX_CALLS_PER_TURN = 256
MAX_FINAL_CHARS = 1024 * 1024


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, hide_input_in_errors=True)


class ScriptedCall(_Strict):
    """One tool call of a calls file."""

    id: CallId
    name: ToolNameText
    arguments: dict[str, Any]
    """A JSON object; sent to the loop re-serialized as JSON text."""


ScriptedTurn = Annotated[list[ScriptedCall], Field(min_length=1, max_length=MAX_CALLS_PER_TURN)]


class CallsFile(_Strict):
    """The whole calls file: the turns in order and the final message."""

    turns: list[ScriptedTurn] = Field(max_length=MAX_TURNS)
    """Each turn holds at least one call; an empty ``turns`` makes the first turn the final."""
    final: str | None = Field(default=None, max_length=MAX_FINAL_CHARS)
    """The text of the last turn, which has no tool calls."""

    @model_validator(mode="after")
    def _unique_ids(self) -> Self:
        for number, turn in enumerate(self.turns):
            if duplicate_id(c.id for c in turn) is not None:
                msg = f"turn {number} repeats a tool call id"
                raise ValueError(msg)
        return self


def parse_calls(data: bytes | str) -> CallsFile:
    """Parses calls-file text; raises :class:`UsageError` naming what is wrong."""
    size = len(data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data)
    if size > MAX_CALLS_FILE_BYTES:
        raise UsageError(f"calls file larger than {MAX_CALLS_FILE_BYTES} bytes")
    try:
        value = loads(data, max_depth=MAX_JSON_DEPTH)
    except ValueError as exc:
        raise UsageError(f"calls file is not valid JSON ({str(exc)[:100]})") from None
    if not isinstance(value, dict):
        raise UsageError("calls file is not a JSON object")
    try:
        return CallsFile.model_validate(value)
    except ValidationError as exc:
        detail = describe_validation(exc, subject="calls file", model=CallsFile)
        raise UsageError(f"invalid calls file: {detail}") from None


def read_calls(path: Path | str) -> CallsFile:
    """Reads and parses a calls file; :class:`UsageError` if it is missing, not a regular
    file, unreadable, too large or invalid."""
    # The task file's rule too (controller.config.inputfile): a FIFO or a device never blocks.
    return parse_calls(read_input_file(path, "calls file", MAX_CALLS_FILE_BYTES))


def load_calls(path: Path | str) -> ScriptedProvider:
    """The scripted provider of a calls file (:func:`read_calls`)."""
    return ScriptedProvider(read_calls(path))


class ScriptedProvider:
    """Plays a :class:`CallsFile`: one turn per scripted turn, then the final turn.

    The tool results the loop sends are checked against the previous turn and kept in
    :attr:`received`; they do not change what is played. The script has no more tool calls
    after its final turn, so a :meth:`nudge` there is answered with the final text again
    (a calls file without turns fails as a model that does not use tools does).
    """

    def __init__(self, calls: CallsFile) -> None:
        self._calls = calls
        self._next = 0
        self._last: ModelTurn | None = None
        self._ended = False
        self._cancelled = threading.Event()
        self._received: list[list[ToolResult]] = []
        self._nudges: list[str] = []

    @property
    def received(self) -> list[list[ToolResult]]:
        """The results of every ``next_turn`` call so far (the first one is empty)."""
        return [list(r) for r in self._received]

    @property
    def nudges(self) -> list[str]:
        """The messages of every :meth:`nudge` so far."""
        return list(self._nudges)

    def nudge(self, message: str) -> ModelTurn:
        """After the final turn, the final text again (:class:`~.base.Nudgeable`)."""
        if self._cancelled.is_set():
            raise CancelledError("the model conversation was cancelled")
        if not self._ended:
            raise ProviderError("a nudge follows only a turn without tool calls")
        self._nudges.append(message)
        return ModelTurn(text=self._calls.final)

    def next_turn(self, results: list[ToolResult]) -> ModelTurn:
        if self._cancelled.is_set():
            raise CancelledError("the model conversation was cancelled")
        if self._ended:
            raise ProviderError("the scripted conversation has already ended")
        check_results(self._last, results)
        self._received.append(list(results))
        if self._next < len(self._calls.turns):
            scripted = self._calls.turns[self._next]
            self._next += 1
            turn = ModelTurn(
                tool_calls=[
                    ToolCall(
                        id=c.id,
                        name=c.name,
                        arguments=json.dumps(c.arguments, ensure_ascii=False),
                    )
                    for c in scripted
                ]
            )
        else:
            turn = ModelTurn(text=self._calls.final)
            self._ended = True
        self._last = turn
        return turn

    def cancel(self) -> None:
        self._cancelled.set()

    def close(self) -> None:
        """Nothing to release."""

    def __enter__(self) -> ScriptedProvider:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()
