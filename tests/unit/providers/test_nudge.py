"""The nudge: a first turn with text and no tool call gets one user message naming the tools
before the job fails with MODEL_TOOL_CALL_UNSUPPORTED. The tool loop
(:class:`controller.jobs.loop.ToolLoop`) drives the OpenAI-compatible adapters against a real
HTTP server on loopback, with fake tools (no Docker)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from controller.config.limits import Limits
from controller.errors import ErrorCode, PatchboxError
from controller.jobs.loop import NUDGE_MESSAGE, ToolLoop
from controller.jobs.records import JobRecord
from controller.providers import (
    ModelTurn,
    Nudgeable,
    OpenAIProvider,
    ProviderError,
    ScriptedProvider,
    ToolResult,
    parse_calls,
)
from controller.tools.schemas import tool_schemas
from tests.support.loop import FakeTools
from tests.support.loopback import LoopbackServer, serve
from tests.support.openai import MODES, PROMPT, READ, answer, provider_for


@pytest.fixture
def server() -> Iterator[LoopbackServer]:
    yield from serve()


def tool_loop(provider: Any, **limits: Any) -> ToolLoop:
    return ToolLoop(
        provider,
        FakeTools(),
        Limits(**limits),
        JobRecord(job_id="j", repo="/r"),
        threading.Event(),
        lambda: None,
    )


def failure(run: ToolLoop) -> PatchboxError:
    with pytest.raises(PatchboxError) as caught:
        run.run()
    return caught.value


def last_message(api: str, body: dict[str, Any]) -> Any:
    return (body["messages"] if api == "chat" else body["input"])[-1]


def test_the_nudge_names_every_tool() -> None:
    for schema in tool_schemas():
        assert schema["name"] in NUDGE_MESSAGE
    assert len(NUDGE_MESSAGE) < 300


@pytest.mark.parametrize(("api", "stream"), MODES)
def test_text_then_a_tool_call_after_the_nudge(
    server: LoopbackServer, api: str, stream: bool
) -> None:
    server.play(
        answer(api, stream, [], "I will look at the parser first."),
        answer(api, stream, [READ]),
        answer(api, stream, [], "Fixed."),
    )
    with provider_for(server, api, stream) as provider:
        run = tool_loop(provider)
        assert run.run() == "Fixed."
    assert [(c.turn, c.id, c.name) for c in run.record.tool_calls] == [(2, READ[0], READ[1])]
    first, second, third = (r.json() for r in server.received)
    nudge = {"role": "user", "content": NUDGE_MESSAGE}
    if api == "chat":
        assert second["messages"] == [
            *first["messages"],
            {"role": "assistant", "content": "I will look at the parser first."},
            nudge,
        ]
        assert third["messages"][: len(second["messages"])] == second["messages"]
        assert last_message(api, third)["role"] == "tool"
    else:
        assert second["input"] == [
            *first["input"],
            {"role": "assistant", "content": "I will look at the parser first."},
            nudge,
        ]
        assert third["input"][: len(second["input"])] == second["input"]
        assert last_message(api, third)["type"] == "function_call_output"
    assert NUDGE_MESSAGE not in server.received[0].body.decode()


@pytest.mark.parametrize(("api", "stream"), MODES)
def test_text_twice_is_model_tool_call_unsupported(
    server: LoopbackServer, api: str, stream: bool
) -> None:
    server.play(answer(api, stream, [], "Hello!"), answer(api, stream, [], "Hello again!"))
    with provider_for(server, api, stream) as provider:
        run = tool_loop(provider)
        error = failure(run)
    assert error.code == ErrorCode.MODEL_TOOL_CALL_UNSUPPORTED
    assert "also after being asked to use the tools" in error.message
    assert len(server.received) == 2
    assert last_message(api, server.received[1].json())["content"] == NUDGE_MESSAGE
    assert run.record.tool_calls == []


def test_an_empty_first_turn_is_not_nudged(server: LoopbackServer) -> None:
    """No text and no tool call: nothing to answer, the job fails at once."""
    server.play(answer("chat", stream=False, calls=[]))
    with provider_for(server) as provider:
        error = failure(tool_loop(provider))
    assert error.code == ErrorCode.MODEL_TOOL_CALL_UNSUPPORTED
    assert error.message == "the model's first turn has no tool call: it does not use tools"
    assert len(server.received) == 1


def test_the_nudge_counts_against_the_turn_limit(server: LoopbackServer) -> None:
    server.play(
        answer("chat", stream=False, calls=[], text="Hi."),
        answer("chat", stream=False, calls=[READ]),
    )
    with provider_for(server) as provider:
        run = tool_loop(provider, max_turns=1)
        error = failure(run)
    assert error.code == ErrorCode.LIMIT_EXCEEDED
    assert error.message == "more than 1 turns"
    assert run.record.tool_calls == []
    assert len(server.received) == 2


def test_a_final_answer_after_tool_calls_is_not_nudged(server: LoopbackServer) -> None:
    server.play(
        answer("chat", stream=False, calls=[READ]),
        answer("chat", stream=False, calls=[], text="Done."),
    )
    with provider_for(server) as provider:
        assert tool_loop(provider).run() == "Done."
    assert len(server.received) == 2
    assert NUDGE_MESSAGE not in server.received[1].body.decode()


def test_the_provider_nudges_only_after_a_turn_without_tool_calls(
    server: LoopbackServer,
) -> None:
    with provider_for(server) as provider:
        assert isinstance(provider, Nudgeable)
        with pytest.raises(ProviderError, match="only a turn without tool calls"):
            provider.nudge("use the tools")
        server.play(answer("chat", stream=False, calls=[READ]))
        provider.next_turn([])
        with pytest.raises(ProviderError, match="only a turn without tool calls"):
            provider.nudge("use the tools")
    assert len(server.received) == 1


def test_scripted_provider_answers_a_nudge_with_its_final_text() -> None:
    provider = ScriptedProvider(parse_calls('{"turns": [], "final": "chatting"}'))
    run = tool_loop(provider)
    error = failure(run)
    assert error.code == ErrorCode.MODEL_TOOL_CALL_UNSUPPORTED
    assert provider.nudges == [NUDGE_MESSAGE]


class NoNudge:
    """A provider without :meth:`nudge` (a wrapper, say): the first text turn ends the job."""

    def __init__(self, inner: OpenAIProvider[Any]) -> None:
        self.inner = inner

    def next_turn(self, results: list[ToolResult]) -> ModelTurn:
        return self.inner.next_turn(results)

    def cancel(self) -> None:
        self.inner.cancel()

    def close(self) -> None:
        self.inner.close()


def test_a_provider_without_nudge_fails_at_once(server: LoopbackServer) -> None:
    server.play(answer("chat", stream=False, calls=[], text="Hi."))
    with provider_for(server) as provider:
        wrapped = NoNudge(provider)
        assert not isinstance(wrapped, Nudgeable)
        error = failure(tool_loop(wrapped))
    assert error.code == ErrorCode.MODEL_TOOL_CALL_UNSUPPORTED
    assert len(server.received) == 1


def test_prompt_is_unchanged_by_the_nudge(server: LoopbackServer) -> None:
    server.play(
        answer("responses", stream=True, calls=[], text="Hi."),
        answer("responses", stream=True, calls=[READ]),
    )
    server.play(answer("responses", stream=True, calls=[], text="Done."))
    with provider_for(server, "responses", stream=True) as provider:
        assert tool_loop(provider).run() == "Done."
    assert all(r.json()["input"][0] == {"role": "user", "content": PROMPT} for r in server.received)
