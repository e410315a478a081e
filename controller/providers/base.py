"""The model edge: the events every provider produces and the Protocol the loop drives.

Its errors (:class:`~controller.errors.ProviderError`, ``DuplicateToolCallIdError``,
``CancelledError``) live with all the others in :mod:`controller.errors`.

A duplicate tool-call id within one turn is a :class:`ProviderError` (the job ends), not
``TOOL_ARGUMENTS_INVALID``: the loop could not tell the model which of the two calls a
result belongs to, so there is nothing the model could correct. The same id in different
turns is accepted.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Annotated, Protocol, Self, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

from controller.errors import DuplicateToolCallIdError

if TYPE_CHECKING:
    from controller.config.task import CheckSpec

CallId = Annotated[str, StringConstraints(min_length=1, max_length=256)]
ToolNameText = Annotated[str, StringConstraints(min_length=1, max_length=128)]


class _Event(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class ToolCall(_Event):
    """One tool call as the model sent it."""

    id: CallId
    """The call id; results are sent back under it."""
    name: ToolNameText
    """The tool name, not yet checked against the six tools."""
    arguments: str
    """The raw JSON text of the arguments. It may be invalid JSON: the loop validates it
    with :func:`controller.tools.schemas.parse_arguments` and tells the model what was wrong."""


class ModelTurn(_Event):
    """One answer of the model: tool calls to run, or none when the model has finished."""

    tool_calls: list[ToolCall] = Field(default_factory=list)
    """In the order the model sent them; ids are unique within the turn."""
    text: str | None = None
    """Assistant text beside or instead of tool calls."""
    usage: dict[str, int] = Field(default_factory=dict)
    """What is known of the cost: ``input_tokens``, ``output_tokens``, ``total_tokens``,
    ``request_bytes``, ``response_bytes``; a key is missing where it is unknown."""

    @model_validator(mode="after")
    def _unique_ids(self) -> Self:
        duplicate = duplicate_id(c.id for c in self.tool_calls)
        if duplicate is not None:
            msg = f"duplicate tool call id {duplicate[:64]!r} in one turn"
            raise ValueError(msg)
        return self


class ToolResult(_Event):
    """What the loop sends back for one tool call of the previous turn."""

    call_id: CallId
    name: ToolNameText
    content: str
    """The tool's output or error, as text for the model."""


def duplicate_id(ids: Iterable[str]) -> str | None:
    """The first id that occurs twice in ``ids``, or None."""
    seen: set[str] = set()
    for call_id in ids:
        if call_id in seen:
            return call_id
        seen.add(call_id)
    return None


def new_turn(calls: Sequence[ToolCall], text: str | None, usage: dict[str, int]) -> ModelTurn:
    """Builds a turn; raises :class:`DuplicateToolCallIdError` for a repeated id."""
    duplicate = duplicate_id(c.id for c in calls)
    if duplicate is not None:
        raise DuplicateToolCallIdError(f"duplicate tool call id {duplicate[:64]!r} in one turn")
    return ModelTurn(tool_calls=list(calls), text=text, usage=usage)


def check_results(previous: ModelTurn | None, results: Sequence[ToolResult]) -> None:
    """Raises ValueError unless ``results`` answer exactly the calls of ``previous``.

    Before the first turn (``previous`` is None) the results must be empty. A wrong set of
    results is a bug in the caller, not a provider failure.
    """
    expected = [] if previous is None else [c.id for c in previous.tool_calls]
    got = [r.call_id for r in results]
    if sorted(got) != sorted(expected):
        msg = "tool results must answer exactly the tool calls of the previous turn"
        raise ValueError(msg)


MAX_JSON_DEPTH = 64
"""How deep a model's JSON (an answer, a stream event, tool arguments) may nest."""


class Provider(Protocol):
    """A model conversation about one task.

    The provider is made with the task prompt. The loop calls :meth:`next_turn` with an
    empty list first (the provider sends the prompt), then with one result for every tool
    call of the previous turn, in any order (``ValueError`` otherwise). A turn without tool
    calls ends the conversation: a further ``next_turn`` raises :class:`ProviderError`, and
    only :meth:`Nudgeable.nudge`, where the provider has it, takes it up again.
    """

    def next_turn(self, results: list[ToolResult]) -> ModelTurn:
        """The model's next turn. Raises :class:`ProviderError` or :class:`CancelledError`."""
        ...

    def cancel(self) -> None:
        """Thread-safe and final: an in-flight ``next_turn`` raises :class:`CancelledError`
        promptly, and so does every later one."""
        ...

    def close(self) -> None:
        """Releases connections; idempotent. Call it after the last turn, from the loop's thread."""
        ...


@runtime_checkable
class ChecksAware(Protocol):
    """A provider that tells its model which checks the job has: ``run_check``'s schema
    (an ``enum`` of their ids) and its instructions list them. The job calls
    :meth:`use_checks` once, before the first turn."""

    def use_checks(self, checks: Mapping[str, CheckSpec]) -> None: ...


@runtime_checkable
class Nudgeable(Protocol):
    """A provider that can take the conversation up again after a turn without tool calls.

    The loop uses it once, when the model's first turn is text without a tool call
    (:mod:`controller.jobs.loop`); a provider without it fails that job at once.
    """

    def nudge(self, message: str) -> ModelTurn:
        """Sends ``message`` as a user message after a turn without tool calls, and returns
        the model's answer, which the loop handles like any other turn (results for its tool
        calls go to :meth:`Provider.next_turn`). Raises :class:`ProviderError` unless the
        previous turn had no tool calls, and like :meth:`Provider.next_turn` otherwise."""
        ...
