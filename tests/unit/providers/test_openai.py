"""The OpenAI-compatible adapters against a real HTTP server on loopback (tests/support/loopback.py).

Every answer below is played by the server over a socket: recorded shapes of both APIs,
streamed and not, and hostile ones (hangs, trickles, cuts, oversized, echoed keys).
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
import structlog
from pydantic import SecretStr, ValidationError

from controller.config.task import CheckSpec
from controller.errors import ErrorCode, PatchboxError, ToolError, UsageError
from controller.providers import (
    CancelledError,
    ChatCompletionsProvider,
    DuplicateToolCallIdError,
    OpenAIProvider,
    Provider,
    ProviderConfig,
    ProviderError,
    ResponsesProvider,
    ToolCall,
    open_provider,
)
from controller.providers.replies import retry_after_seconds, sse_events
from controller.tools.schemas import ReadFileArgs, parse_arguments, tool_schemas
from tests.support.loopback import (
    LoopbackServer,
    Responder,
    announce,
    hang,
    hang_after,
    json_reply,
    serve,
    sse_event,
    sse_reply,
    streamed_bytes,
    trickle,
)
from tests.support.openai import (
    APIS,
    KEY,
    MODES,
    PROMPT,
    READ,
    SEARCH,
    answer,
    chat_json,
    chat_sse,
    key_free,
    make_config,
    named,
    provider_for,
    responses_sse,
    result,
)


@pytest.fixture
def server() -> Iterator[LoopbackServer]:
    yield from serve()


# The normal conversation.


@pytest.mark.parametrize(("api", "stream"), MODES)
def test_tool_call_turn(server: LoopbackServer, api: str, stream: bool) -> None:
    server.play(answer(api, stream, [READ]))
    with provider_for(server, api, stream) as provider:
        turn = provider.next_turn([])
    assert turn.tool_calls == [ToolCall(id="call_1", name="read_file", arguments=READ[2])]
    assert turn.text is None
    assert parse_arguments("read_file", turn.tool_calls[0].arguments) == ReadFileArgs(
        path="src/parser.py", startLine=1
    )
    assert turn.usage["input_tokens"] == 120
    assert turn.usage["output_tokens"] == 30
    assert turn.usage["total_tokens"] == 150
    assert turn.usage["response_bytes"] > 0
    (request,) = server.received
    assert turn.usage["request_bytes"] == len(request.body)
    assert request.path == ("/v1/chat/completions" if api == "chat" else "/v1/responses")
    assert request.headers["authorization"] == f"Bearer {KEY}"
    assert request.headers["content-type"] == "application/json"
    body = request.json()
    assert body["model"] == "test-model"
    assert body["stream"] is stream
    names = [s["name"] for s in tool_schemas()]
    if api == "chat":
        assert [t["type"] for t in body["tools"]] == ["function"] * 6
        assert [t["function"] for t in body["tools"]] == tool_schemas()
        assert [m["role"] for m in body["messages"]] == ["system", "user"]
        assert "never instructions" in body["messages"][0]["content"]
        assert body["messages"][1]["content"] == PROMPT
        assert ("stream_options" in body) is stream
    else:
        assert [t["name"] for t in body["tools"]] == names
        assert all(t["type"] == "function" and t["strict"] is False for t in body["tools"])
        assert [
            {k: v for k, v in t.items() if k not in ("type", "strict")} for t in body["tools"]
        ] == tool_schemas()
        assert "never instructions" in body["instructions"]
        assert body["input"] == [{"role": "user", "content": PROMPT}]
        assert body["store"] is False


@pytest.mark.parametrize("api", APIS)
def test_the_jobs_checks_reach_the_model(server: LoopbackServer, api: str) -> None:
    """What a real model sees: run_check's checkId an enum of the job's check ids, each
    check described in run_check's description and in the system prompt."""
    checks = {
        "tests": CheckSpec(argv=["pytest", "-q"], description="the unit tests"),
        "lint": CheckSpec(argv=["ruff", "check", "."], required=False, timeout_seconds=60),
    }
    server.play(answer(api, False, [READ]))  # noqa: FBT003 - the helper's stream flag
    with provider_for(server, api) as provider:
        provider.use_checks(checks)
        provider.next_turn([])
    body = server.received[0].json()
    tools = [t["function"] if api == "chat" else t for t in body["tools"]]
    (run_check,) = [t for t in tools if t["name"] == "run_check"]
    check_id = run_check["parameters"]["properties"]["checkId"]
    assert check_id["enum"] == ["lint", "tests"]
    listed = (
        "The checks run_check can run (checkId: what it runs):\n"
        "- lint: ruff check . (optional; at most 60 s)\n"
        "- tests: the unit tests (the change must pass it; at most 300 s)"
    )
    assert run_check["description"].endswith(listed)
    system = body["messages"][0]["content"] if api == "chat" else body["instructions"]
    assert system.endswith("\n\n" + listed)
    assert "never instructions" in system
    for tool in tools:
        assert "description" not in tool["parameters"]
        assert all(p["description"] for p in tool["parameters"]["properties"].values())
        assert "``" not in json.dumps(tool)


@pytest.mark.parametrize("api", APIS)
def test_a_job_without_checks_says_so(server: LoopbackServer, api: str) -> None:
    server.play(answer(api, False, [READ]))  # noqa: FBT003 - the helper's stream flag
    with provider_for(server, api) as provider:
        provider.use_checks({})
        provider.next_turn([])
    body = server.received[0].json()
    tools = [t["function"] if api == "chat" else t for t in body["tools"]]
    (run_check,) = [t for t in tools if t["name"] == "run_check"]
    assert "enum" not in run_check["parameters"]["properties"]["checkId"]
    none = "This job has no configured checks, so run_check has nothing to run: do not call it."
    assert run_check["description"].endswith(none)
    system = body["messages"][0]["content"] if api == "chat" else body["instructions"]
    assert system.endswith(none)


@pytest.mark.parametrize(("api", "stream"), MODES)
def test_conversation_sends_results_back(server: LoopbackServer, api: str, stream: bool) -> None:
    reused = ("call_1", "replace_text", '{"path": "a.py", "oldText": "x", "newText": "y"}')
    server.play(
        answer(api, stream, [READ, SEARCH], "Looking."),
        answer(api, stream, [reused]),
        answer(api, stream, [], "Done."),
    )
    with provider_for(server, api, stream) as provider:
        first = provider.next_turn([])
        assert [c.id for c in first.tool_calls] == ["call_1", "call_2"]
        assert first.text == "Looking."
        # Results in another order than the calls: sent back in the calls' order.
        second = provider.next_turn([result(SEARCH, "3 hits"), result(READ, "line 1")])
        assert second.tool_calls == [
            ToolCall(id="call_1", name="replace_text", arguments=reused[2])
        ]
        third = provider.next_turn([result(reused, "replaced")])
        assert third.tool_calls == []
        assert third.text == "Done."
        with pytest.raises(ProviderError, match="final answer"):
            provider.next_turn([])
    requests = [r.json() for r in server.received]
    assert len(requests) == 3
    if api == "chat":
        messages = requests[2]["messages"]
        assert [m["role"] for m in messages] == [
            "system",
            "user",
            "assistant",
            "tool",
            "tool",
            "assistant",
            "tool",
        ]
        assert messages[2] == {
            "role": "assistant",
            "content": "Looking.",
            "tool_calls": [
                {"id": i, "type": "function", "function": {"name": n, "arguments": a}}
                for i, n, a in (READ, SEARCH)
            ],
        }
        assert messages[3] == {"role": "tool", "tool_call_id": "call_1", "content": "line 1"}
        assert messages[4] == {"role": "tool", "tool_call_id": "call_2", "content": "3 hits"}
        assert messages[5]["tool_calls"][0]["function"]["name"] == "replace_text"
        assert messages[6] == {"role": "tool", "tool_call_id": "call_1", "content": "replaced"}
        assert requests[1]["messages"] == messages[:5]
    else:
        items = requests[2]["input"]
        assert items[0] == {"role": "user", "content": PROMPT}
        assert items[1] == {"role": "assistant", "content": "Looking."}
        assert items[2:4] == [
            {"type": "function_call", "call_id": i, "name": n, "arguments": a}
            for i, n, a in (READ, SEARCH)
        ]
        assert items[4:6] == [
            {"type": "function_call_output", "call_id": "call_1", "output": "line 1"},
            {"type": "function_call_output", "call_id": "call_2", "output": "3 hits"},
        ]
        assert items[6] == {
            "type": "function_call",
            "call_id": "call_1",
            "name": "replace_text",
            "arguments": reused[2],
        }
        assert items[7] == {
            "type": "function_call_output",
            "call_id": "call_1",
            "output": "replaced",
        }
        assert len(items) == 8
        assert requests[1]["input"] == items[:6]
    assert all(r["tools"] == requests[0]["tools"] for r in requests)


@pytest.mark.parametrize(("api", "stream"), MODES)
def test_text_only_first_turn(server: LoopbackServer, api: str, stream: bool) -> None:
    server.play(answer(api, stream, [], "I cannot use tools."))
    with provider_for(server, api, stream) as provider:
        turn = provider.next_turn([])
    assert turn.tool_calls == []
    assert turn.text == "I cannot use tools."


@pytest.mark.parametrize(("api", "stream"), MODES)
def test_invalid_arguments_json_is_delivered(
    server: LoopbackServer, api: str, stream: bool
) -> None:
    broken = ("call_9", "read_file", '{"path": "a.py", ')
    server.play(answer(api, stream, [broken]))
    with provider_for(server, api, stream) as provider:
        turn = provider.next_turn([])
    assert turn.tool_calls == [ToolCall(id="call_9", name="read_file", arguments=broken[2])]
    with pytest.raises(ToolError) as caught:
        parse_arguments("read_file", turn.tool_calls[0].arguments)
    assert caught.value.code == ErrorCode.TOOL_ARGUMENTS_INVALID


@pytest.mark.parametrize(("api", "stream"), MODES)
def test_duplicate_ids_in_one_turn_refused(server: LoopbackServer, api: str, stream: bool) -> None:
    server.play(answer(api, stream, [READ, (READ[0], "search_text", '{"query": "x"}')]))
    with (
        provider_for(server, api, stream) as provider,
        pytest.raises(DuplicateToolCallIdError) as caught,
    ):
        provider.next_turn([])
    assert caught.value.code == ErrorCode.PROVIDER_ERROR
    assert "call_1" in caught.value.message


def test_results_must_answer_the_previous_turn(server: LoopbackServer) -> None:
    server.play(answer("chat", stream=False, calls=[READ, SEARCH]))
    with provider_for(server) as provider:
        with pytest.raises(ValueError, match="previous turn"):
            provider.next_turn([result(READ, "x")])
        provider.next_turn([])
        for wrong in ([result(READ, "x")], [result(READ, "x"), result(READ, "y")], []):
            with pytest.raises(ValueError, match="previous turn"):
                provider.next_turn(wrong)
    assert len(server.received) == 1


# Malformed and wrongly shaped answers.


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("body", [b"not json{", b"", b'{"a": 1, "a": 2}', b"[1, NaN]", b"\xff\xfe"])
def test_malformed_json(server: LoopbackServer, api: str, body: bytes) -> None:
    server.play(json_reply(body))
    with (
        provider_for(server, api) as provider,
        pytest.raises(ProviderError, match="not valid JSON") as caught,
    ):
        provider.next_turn([])
    assert caught.value.code == ErrorCode.PROVIDER_ERROR
    assert len(server.received) == 1


def _chat_call(**function: Any) -> dict[str, Any]:
    return {
        "choices": [
            {"message": {"tool_calls": [{"id": "c1", "type": "function", "function": function}]}}
        ]
    }


@pytest.mark.parametrize(
    ("api", "value", "fragment"),
    [
        ("chat", [], "unexpected shape"),
        ("chat", {}, "choices"),
        ("chat", {"choices": []}, "choices"),
        ("chat", {"choices": [{}]}, "message"),
        ("chat", {"choices": [{"message": {"content": 5}}]}, "content"),
        ("chat", {"choices": [{"message": {"tool_calls": {}}}]}, "tool_calls"),
        ("chat", _chat_call(name="read_file", arguments={"path": "a"}), "arguments"),
        ("chat", _chat_call(name="read_file"), "arguments"),
        ("chat", _chat_call(name=7, arguments="{}"), "name"),
        ("chat", _chat_call(name="", arguments="{}"), "name"),
        ("chat", _chat_call(name="x" * 129, arguments="{}"), "name"),
        (
            "chat",
            {
                "choices": [
                    {
                        "message": {
                            "tool_calls": [{"id": "", "function": {"name": "a", "arguments": "{}"}}]
                        }
                    }
                ]
            },
            "id",
        ),
        (
            "chat",
            {
                "choices": [
                    {
                        "message": {
                            "tool_calls": [
                                {
                                    "id": "c",
                                    "type": "custom",
                                    "function": {"name": "a", "arguments": ""},
                                }
                            ]
                        }
                    }
                ]
            },
            "type",
        ),
        ("chat", {"choices": [{"message": {}}], "usage": {"prompt_tokens": "5"}}, "prompt_tokens"),
        ("responses", {}, "output"),
        ("responses", {"output": "text"}, "output"),
        (
            "responses",
            {"output": [{"type": "function_call", "name": "read_file", "arguments": "{}"}]},
            "call_id",
        ),
        (
            "responses",
            {
                "output": [
                    {"type": "function_call", "call_id": "c", "name": "read_file", "arguments": {}}
                ]
            },
            "arguments",
        ),
        ("responses", {"output": [{"type": "message", "content": "hello"}]}, "content"),
        (
            "responses",
            {
                "status": "failed",
                "output": [],
                "error": {"code": "server_error", "message": "boom"},
            },
            "failed (server_error)",
        ),
        (
            "responses",
            {"status": "in_progress", "output": []},
            "unexpected response status 'in_progress'",
        ),
        (
            "responses",
            {"status": "queued\x1b[31m", "output": []},
            "unexpected response status 'unknown'",
        ),
    ],
)
def test_wrong_shapes(server: LoopbackServer, api: str, value: Any, fragment: str) -> None:
    server.play(json_reply(value))
    with provider_for(server, api) as provider, pytest.raises(ProviderError) as caught:
        provider.next_turn([])
    assert fragment in caught.value.message
    assert caught.value.message.startswith(named(server, api))
    assert "\x1b" not in caught.value.message
    assert "boom" not in caught.value.message


@pytest.mark.parametrize(
    ("api", "events", "fragment"),
    [
        ("chat", [b"data: {oops\n\n"], "stream event is not valid JSON"),
        (
            "chat",
            [b'data: {"choices": [{"delta": {"content": 1}}]}\n\n', b"data: [DONE]\n\n"],
            "content",
        ),
        (
            "chat",
            [b'data: {"error": {"code": "overloaded", "message": "x"}}\n\n'],
            "stream reported an error (overloaded)",
        ),
        (
            "chat",
            [
                b'data: {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}}]}\n\n',
                b"data: [DONE]\n\n",
            ],
            "no id or name",
        ),
        (
            "chat",
            [b'data: {"choices": [{"delta": {"tool_calls": [{"index": 5000}]}}]}\n\n'],
            "index",
        ),
        ("responses", [b'data: {"no_type": 1}\n\n'], "type"),
        (
            "responses",
            [b'data: {"type": "error", "code": "rate_limit_exceeded", "message": "m"}\n\n'],
            "(rate_limit_exceeded)",
        ),
        (
            "responses",
            [
                b'data: {"type": "response.failed", "response": {"error": {"code": "bad_thing"}}}\n\n'
            ],
            "failed (bad_thing)",
        ),
        (
            "responses",
            [b'data: {"type": "response.completed", "response": {"output": 3}}\n\n'],
            "output",
        ),
        ("responses", [b'data: {"type": "response.completed"}\n\n'], "unexpected shape"),
    ],
)
def test_wrong_stream_shapes(
    server: LoopbackServer, api: str, events: list[bytes], fragment: str
) -> None:
    server.play(sse_reply(events))
    with provider_for(server, api, stream=True) as provider, pytest.raises(ProviderError) as caught:
        provider.next_turn([])
    assert fragment in caught.value.message


def test_responses_stream_uses_items_when_output_is_empty(server: LoopbackServer) -> None:
    events = responses_sse([READ])
    events[-1] = sse_event(
        {"type": "response.completed", "response": {"status": "completed", "output": []}}
    )
    server.play(sse_reply(events))
    with provider_for(server, "responses", stream=True) as provider:
        turn = provider.next_turn([])
    assert [c.id for c in turn.tool_calls] == ["call_1"]


@pytest.mark.parametrize("api", APIS)
def test_stream_requested_but_json_answered(server: LoopbackServer, api: str) -> None:
    server.play(answer(api, stream=False, calls=[READ]))
    with provider_for(server, api, stream=True) as provider:
        turn = provider.next_turn([])
    assert [c.id for c in turn.tool_calls] == ["call_1"]
    assert server.received[0].json()["stream"] is True


# Streams cut mid-way (more in tests/unit/providers/test_disconnect.py).


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("chunked", [True, False])
def test_stream_cut_midway(server: LoopbackServer, api: str, chunked: bool) -> None:
    """A disconnect is retried like a 5xx; every attempt cut: PROVIDER_ERROR naming it."""
    events = chat_sse([READ]) if api == "chat" else responses_sse([READ])
    server.play(*[sse_reply(events, cut_after=len(events) - 2, chunked=chunked)] * 3)
    with provider_for(server, api, stream=True) as provider, pytest.raises(ProviderError) as caught:
        provider.next_turn([])
    assert caught.value.code == ErrorCode.PROVIDER_ERROR
    expected = "(RemoteProtocolError after " if chunked else "(the event stream ended before "
    assert "the server disconnected mid-stream " + expected in caught.value.message
    assert caught.value.message.endswith("; gave up after 3 attempts")
    assert len(server.received) == 3


def test_sse_parser_drops_an_unterminated_event() -> None:
    body = b": comment\r\nevent: a\r\ndata: 1\r\ndata: 2\r\n\r\nid: 7\ndata: 3\n\ndata: 4\n"
    assert sse_events(body) == [("a", "1\n2"), ("message", "3")]
    with pytest.raises(ProviderError, match="UTF-8"):
        sse_events(b"data: \xff\n\n")


# Retries.


def test_429_then_success_honours_retry_after(server: LoopbackServer) -> None:
    server.play(
        json_reply({"error": {"code": "rate_limit_exceeded"}}, 429, {"Retry-After": "1"}),
        answer("chat", stream=False, calls=[READ]),
    )
    started = time.monotonic()
    with structlog.testing.capture_logs() as logs, provider_for(server) as provider:
        turn = provider.next_turn([])
    elapsed = time.monotonic() - started
    assert [c.id for c in turn.tool_calls] == ["call_1"]
    assert len(server.received) == 2
    assert server.received[0].body == server.received[1].body
    assert 0.9 <= elapsed < 4
    retries = [e for e in logs if e["event"] == "provider_retry"]
    assert len(retries) == 1
    assert retries[0]["wait_seconds"] == 1.0
    assert "HTTP 429 (rate_limit_exceeded)" in retries[0]["reason"]


def test_retry_after_longer_than_allowed_ends_at_once(server: LoopbackServer) -> None:
    server.play(json_reply({}, 429, {"Retry-After": "3600"}))
    started = time.monotonic()
    with (
        provider_for(server) as provider,
        pytest.raises(ProviderError, match="asks to wait 3600 s") as caught,
    ):
        provider.next_turn([])
    assert time.monotonic() - started < 1
    assert len(server.received) == 1
    assert "HTTP 429" in caught.value.message


def test_retry_after_values() -> None:
    now = datetime(2025, 1, 1, 12, 0, 0, tzinfo=UTC)
    assert retry_after_seconds("7", now) == 7.0
    assert retry_after_seconds(" 0 ", now) == 0.0
    assert retry_after_seconds("Wed, 01 Jan 2025 12:00:30 GMT", now) == 30.0
    assert retry_after_seconds("Wed, 01 Jan 2025 11:00:00 GMT", now) == 0.0
    for bad in (None, "", "-1", "1.5", "soon", "9" * 100):
        assert retry_after_seconds(bad, now) is None


@pytest.mark.parametrize("status", [500, 502, 503, 504])
def test_server_errors_retried_then_given_up(server: LoopbackServer, status: int) -> None:
    server.play(*[json_reply({"error": {"message": "internal"}}, status)] * 3)
    with (
        structlog.testing.capture_logs() as logs,
        provider_for(server) as provider,
        pytest.raises(ProviderError) as caught,
    ):
        provider.next_turn([])
    assert len(server.received) == 3
    assert caught.value.message == named(server) + f"HTTP {status}; gave up after 3 attempts"
    assert [e["attempt"] for e in logs if e["event"] == "provider_retry"] == [1, 2]


def test_transient_then_success_with_backoff(server: LoopbackServer) -> None:
    server.play(
        json_reply({}, 503), json_reply({}, 502), answer("responses", stream=False, calls=[READ])
    )
    with provider_for(server, "responses") as provider:
        turn = provider.next_turn([])
    assert [c.id for c in turn.tool_calls] == ["call_1"]
    assert len(server.received) == 3


@pytest.mark.parametrize("status", [400, 401, 403, 404, 422])
def test_client_errors_not_retried(server: LoopbackServer, status: int) -> None:
    echo = {
        "error": {
            "message": f"Incorrect API key provided: {KEY}",
            "type": "invalid_request_error",
            "code": "invalid_api_key",
        }
    }
    server.play(json_reply(echo, status))
    with provider_for(server) as provider, pytest.raises(ProviderError) as caught:
        provider.next_turn([])
    assert len(server.received) == 1
    assert caught.value.message == named(server) + f"HTTP {status} (invalid_api_key)"
    key_free(caught.value)


def test_error_code_shown_only_when_a_plain_token(server: LoopbackServer) -> None:
    server.play(json_reply({"error": {"code": f"bad {KEY}", "type": "x" * 65}}, 401))
    with provider_for(server) as provider, pytest.raises(ProviderError) as caught:
        provider.next_turn([])
    assert caught.value.message == named(server) + "HTTP 401"


def test_redirect_not_followed(server: LoopbackServer) -> None:
    server.play(json_reply({}, 307, {"Location": "http://127.0.0.2:1/elsewhere"}))
    with provider_for(server) as provider, pytest.raises(ProviderError, match="HTTP 307"):
        provider.next_turn([])
    assert len(server.received) == 1


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def test_connection_refused_retried_then_given_up() -> None:
    """The error names the URL it tried (and never the key)."""
    port = _closed_port()
    config = ProviderConfig(
        base_url=f"http://127.0.0.1:{port}/v1",
        api_key=SecretStr(KEY),
        model="m",
        trust_env=False,
        max_attempts=2,
        backoff_seconds=0.01,
    )
    with (
        structlog.testing.capture_logs() as logs,
        open_provider(config, PROMPT) as provider,
        pytest.raises(ProviderError, match="cannot connect") as caught,
    ):
        provider.next_turn([])
    assert "gave up after 2 attempts" in caught.value.message
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    assert caught.value.message.startswith(f"chat completions at {url}: cannot connect")
    key_free(caught.value)
    assert len([e for e in logs if e["event"] == "provider_retry"]) == 1


# Bounds: size, deadline, cancel.


@pytest.mark.parametrize(
    "responder",
    [
        json_reply(b" " * 2048 + b"{}"),
        streamed_bytes(5000),
        streamed_bytes(5000, "text/event-stream"),
    ],
    ids=["content-length", "chunked-json", "chunked-stream"],
)
def test_oversized_answer(server: LoopbackServer, responder: Responder) -> None:
    server.play(responder)
    with (
        provider_for(server, max_response_bytes=1024) as provider,
        pytest.raises(ProviderError) as caught,
    ):
        provider.next_turn([])
    assert caught.value.message == named(server) + "answer larger than 1024 bytes"
    assert len(server.received) == 1


def test_announced_size_refused_before_reading(server: LoopbackServer) -> None:
    server.play(announce(10**9))
    started = time.monotonic()
    with provider_for(server) as provider, pytest.raises(ProviderError) as caught:
        provider.next_turn([])
    assert time.monotonic() - started < 1.0
    assert caught.value.message == named(server) + f"answer larger than {16 * 1024 * 1024} bytes"


def test_answer_at_the_size_bound_is_read(server: LoopbackServer) -> None:
    body = json.dumps(chat_json([READ], "x" * 2000)).encode()
    server.play(json_reply(body))
    with provider_for(server, max_response_bytes=len(body)) as provider:
        assert len(provider.next_turn([]).tool_calls) == 1


def test_compressed_answer_refused(server: LoopbackServer) -> None:
    server.play(json_reply(b"\x1f\x8b", headers={"Content-Encoding": "gzip"}))
    with (
        provider_for(server) as provider,
        pytest.raises(ProviderError, match=r"compressed answer refused \(gzip\)"),
    ):
        provider.next_turn([])
    assert server.received[0].headers["accept-encoding"] == "identity"


def assert_workers_end(within: float = 1.0) -> None:
    """The request's worker thread ends soon after a cancel or a deadline (its sockets were
    shut down), not when its read timeout (5 s here) or the hanging server lets it."""
    limit = time.monotonic() + within
    while any(t.name == "patchbox-provider" and t.is_alive() for t in threading.enumerate()):
        assert time.monotonic() < limit, "a request worker outlived its cancel or deadline"
        time.sleep(0.01)


def _cancel_after(provider: OpenAIProvider[Any], delay: float) -> threading.Thread:
    def later() -> None:
        time.sleep(delay)
        provider.cancel()

    thread = threading.Thread(target=later)
    thread.start()
    return thread


@pytest.mark.parametrize(("api", "stream"), MODES)
def test_cancel_while_server_hangs(server: LoopbackServer, api: str, stream: bool) -> None:
    server.play(hang())
    with provider_for(server, api, stream, request_deadline_seconds=30) as provider:
        canceller = _cancel_after(provider, 0.3)
        started = time.monotonic()
        with pytest.raises(CancelledError) as caught:
            provider.next_turn([])
        elapsed = time.monotonic() - started
        canceller.join()
        assert 0.25 <= elapsed < 1.0
        assert caught.value.code == ErrorCode.CANCELLED
        with pytest.raises(CancelledError):
            provider.next_turn([])
        assert_workers_end()
    assert len(server.received) == 1


def test_cancel_mid_stream(server: LoopbackServer) -> None:
    server.play(hang_after(chat_sse([READ])[:3]))
    with provider_for(server, "chat", stream=True, request_deadline_seconds=30) as provider:
        canceller = _cancel_after(provider, 0.3)
        started = time.monotonic()
        with pytest.raises(CancelledError):
            provider.next_turn([])
        assert time.monotonic() - started < 1.0
        canceller.join()
        assert_workers_end()


def test_cancel_during_backoff(server: LoopbackServer) -> None:
    server.play(json_reply({}, 503, {"Retry-After": "30"}))
    with provider_for(server, max_retry_after_seconds=60) as provider:
        canceller = _cancel_after(provider, 0.3)
        started = time.monotonic()
        with pytest.raises(CancelledError):
            provider.next_turn([])
        assert time.monotonic() - started < 1.0
        canceller.join()
    assert len(server.received) == 1


def test_cancel_before_the_first_turn_sends_nothing(server: LoopbackServer) -> None:
    with provider_for(server) as provider:
        provider.cancel()
        with pytest.raises(CancelledError):
            provider.next_turn([])
    assert server.received == []


@pytest.mark.parametrize("responder", [hang(), trickle(0.05)], ids=["hang", "trickle"])
def test_deadline_bounds_a_request(server: LoopbackServer, responder: Responder) -> None:
    server.play(responder)
    with provider_for(server, "chat", stream=True, request_deadline_seconds=0.4) as provider:
        started = time.monotonic()
        with pytest.raises(ProviderError) as caught:
            provider.next_turn([])
        elapsed = time.monotonic() - started
        assert_workers_end()
    assert caught.value.message == named(server) + "no complete answer within 0.4 s"
    assert 0.35 <= elapsed < 1.5
    assert len(server.received) == 1


def test_close_is_idempotent_and_final(server: LoopbackServer) -> None:
    provider = provider_for(server)
    provider.close()
    provider.close()
    with pytest.raises(ProviderError, match="closed"):
        provider.next_turn([])
    assert server.received == []


def test_open_provider_picks_the_api(server: LoopbackServer) -> None:
    with provider_for(server, "chat") as chat, provider_for(server, "responses") as responses:
        assert isinstance(chat, ChatCompletionsProvider)
        assert isinstance(responses, ResponsesProvider)
        as_protocol: list[Provider] = [chat, responses]
        assert len(as_protocol) == 2


def test_no_key_sends_no_authorization(server: LoopbackServer) -> None:
    server.play(answer("chat", stream=False, calls=[READ]))
    config = make_config(server).model_copy(update={"api_key": None})
    with open_provider(config, PROMPT) as provider:
        provider.next_turn([])
    assert "authorization" not in server.received[0].headers


# The planted key.


def test_planted_key_in_no_error_or_log(server: LoopbackServer) -> None:
    """Every failure path, with the server echoing the key wherever it can."""
    echo = {"error": {"message": KEY, "code": KEY, "type": KEY}}
    scenarios: list[tuple[list[Responder], dict[str, Any]]] = [
        ([json_reply(echo, 401)], {}),
        ([json_reply(echo, 500)] * 3, {}),
        ([json_reply(echo, 429, {"Retry-After": KEY})] * 3, {}),
        ([json_reply(echo, 429, {"Retry-After": "3600"})], {}),
        ([json_reply(KEY.encode())], {}),
        ([json_reply({"choices": [{"message": {"content": {KEY: KEY}}}]})], {}),
        ([json_reply(_chat_call(name=KEY * 10, arguments="{}"))], {}),
        ([json_reply({"choices": [], KEY: [KEY]}, headers={"X-Key": KEY})], {}),
        ([json_reply(b" " * 4096 + KEY.encode())], {"max_response_bytes": 1024}),
        ([sse_reply([sse_event({"error": {"code": KEY, "message": KEY}})])], {"stream": True}),
        ([sse_reply([f"data: {KEY}\n\n".encode()])], {"stream": True}),
        (
            [sse_reply([sse_event({"type": "error", "code": KEY})])],
            {"stream": True, "api": "responses"},
        ),
        ([json_reply({"status": KEY, "output": []})], {"api": "responses"}),
        ([json_reply(b"", 302, {"Location": f"http://{KEY}.invalid/"})], {}),
        ([hang()], {"request_deadline_seconds": 0.2}),
    ]
    errors: list[BaseException] = []
    with structlog.testing.capture_logs() as logs:
        for responders, fields in scenarios:
            server.play(*responders)
            with provider_for(server, **fields) as provider, pytest.raises(ProviderError) as caught:
                provider.next_turn([])
            errors.append(caught.value)
        server.play(hang())
        with provider_for(server, request_deadline_seconds=30) as provider:
            canceller = _cancel_after(provider, 0.1)
            with pytest.raises(CancelledError) as cancelled:
                provider.next_turn([])
            canceller.join()
            errors.append(cancelled.value)
        refused = make_config(server).model_copy(
            update={"base_url": f"http://127.0.0.1:{_closed_port()}"}
        )
        with open_provider(refused, PROMPT) as provider, pytest.raises(ProviderError) as caught:
            provider.next_turn([])
        errors.append(caught.value)
    assert len(errors) == len(scenarios) + 2
    assert all(
        e.code in (ErrorCode.PROVIDER_ERROR, ErrorCode.CANCELLED)
        for e in errors
        if isinstance(e, PatchboxError)
    )
    for error in errors:
        key_free(error)
    assert logs
    assert KEY not in repr(logs)
    assert any(
        KEY in r.body.decode() or r.headers.get("authorization") == f"Bearer {KEY}"
        for r in server.received
    )


# Configuration.


def test_config_never_shows_the_key() -> None:
    config = ProviderConfig(api_key=SecretStr(KEY), model="m")
    for text in (repr(config), str(config), repr(config.model_dump()), config.model_dump_json()):
        assert KEY not in text
    assert config.api_key is not None
    assert config.api_key.get_secret_value() == KEY


@pytest.mark.parametrize(
    ("fields", "fragment"),
    [
        ({"base_url": "http://api.example.com/v1"}, "only over https"),
        ({"base_url": f"https://user:{KEY}@api.example.com/v1"}, "credentials"),
        ({"base_url": "ftp://api.example.com"}, "http:// or https://"),
        ({"base_url": "https://api.example.com/v1?x=1"}, "query"),
        ({"base_url": "https:///v1"}, "no host"),
        ({"base_url": "https://api.example.com:99999"}, "port"),
        ({"base_url": "https://api.example.com/\n"}, "control"),
        ({"api_key": f"{KEY} x"}, "printable ASCII"),
        ({"api_key": f"{KEY}\n"}, "printable ASCII"),
        ({"api": "completions"}, "api"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"max_response_bytes": 10**9}, "max_response_bytes"),
        ({"unknown": 1}, "unknown"),
    ],
)
def test_config_refuses(fields: dict[str, Any], fragment: str) -> None:
    values = {"api_key": KEY, "model": "m"} | fields
    with pytest.raises(ValidationError) as caught:
        ProviderConfig.model_validate(values)
    assert fragment in str(caught.value)
    assert KEY not in str(caught.value)
    with pytest.raises(UsageError) as usage:
        ProviderConfig.from_mapping(values)
    assert fragment in usage.value.message
    key_free(usage.value)


def test_config_allows_plain_http_to_loopback_only() -> None:
    for url in ("http://127.0.0.1:8000/v1", "http://localhost:11434/v1/", "http://[::1]/v1"):
        assert ProviderConfig(
            base_url=url, api_key=SecretStr(KEY), model="m"
        ).base_url == url.rstrip("/")
    assert ProviderConfig(base_url="http://10.0.0.5:8000/v1", model="m").api_key is None


def test_config_from_env() -> None:
    config = ProviderConfig.from_env(
        {
            "OPENAI_BASE_URL": "https://llm.example.com/v1/",
            "OPENAI_API_KEY": KEY,
            "PATCHBOX_MODEL": "gpt-test",
            "PATCHBOX_PROVIDER_API": "responses",
            "PATCHBOX_PROVIDER_STREAM": "false",
        }
    )
    assert (config.base_url, config.model, config.api, config.stream) == (
        "https://llm.example.com/v1",
        "gpt-test",
        "responses",
        False,
    )
    assert config.api_key is not None
    assert config.api_key.get_secret_value() == KEY
    defaults = ProviderConfig.from_env({"PATCHBOX_MODEL": "m", "OPENAI_API_KEY": ""})
    assert (defaults.base_url, defaults.api, defaults.stream, defaults.api_key) == (
        "https://api.openai.com/v1",
        "chat",
        True,
        None,
    )


@pytest.mark.parametrize(
    ("environ", "fragment"),
    [
        ({}, "PATCHBOX_MODEL"),
        ({"PATCHBOX_MODEL": "m", "PATCHBOX_PROVIDER_API": "grpc"}, "PATCHBOX_PROVIDER_API"),
        ({"PATCHBOX_MODEL": "m", "PATCHBOX_PROVIDER_STREAM": "maybe"}, "PATCHBOX_PROVIDER_STREAM"),
        (
            {"PATCHBOX_MODEL": "m", "OPENAI_BASE_URL": "http://example.com", "OPENAI_API_KEY": KEY},
            "OPENAI_API_KEY: the API key is sent only over https",
        ),
        ({"PATCHBOX_MODEL": "m", "OPENAI_BASE_URL": "example.com"}, "OPENAI_BASE_URL"),
        ({"PATCHBOX_MODEL": "m", "OPENAI_API_KEY": f"{KEY}\t"}, "OPENAI_API_KEY"),
    ],
)
def test_config_from_env_refuses(environ: dict[str, str], fragment: str) -> None:
    with pytest.raises(UsageError) as caught:
        ProviderConfig.from_env(environ)
    assert fragment in caught.value.message
    key_free(caught.value)


def test_config_from_mapping() -> None:
    table = {
        "base_url": "https://llm.example.com/v1",
        "model": "m",
        "api": "responses",
        "max_attempts": 2,
    }
    config = ProviderConfig.from_mapping(table, {"OPENAI_API_KEY": KEY})
    assert (config.api, config.max_attempts) == ("responses", 2)
    assert config.api_key is not None
    assert config.api_key.get_secret_value() == KEY
    named = ProviderConfig.from_mapping(
        table | {"api_key_env": "LLM_KEY"}, {"LLM_KEY": "other-key"}
    )
    assert named.api_key is not None
    assert named.api_key.get_secret_value() == "other-key"
    with pytest.raises(UsageError, match=r"OPENAI_API_KEY is set but .* provider\.api_key_env"):
        ProviderConfig.from_mapping(
            table | {"api_key_env": "LLM_KEY"}, {"LLM_KEY": "other-key", "OPENAI_API_KEY": KEY}
        )
    assert ProviderConfig.from_mapping(table, {}).api_key is None
    inline = ProviderConfig.from_mapping(table | {"api_key": KEY}, {})
    assert inline.api_key is not None
    with pytest.raises(UsageError, match="not both"):
        ProviderConfig.from_mapping(table | {"api_key": KEY, "api_key_env": "X"}, {})
    with pytest.raises(UsageError, match="environment variable name"):
        ProviderConfig.from_mapping(table | {"api_key_env": "A B"}, {})
    with pytest.raises(UsageError, match="LLM_KEY") as caught:
        ProviderConfig.from_mapping(table | {"api_key_env": "LLM_KEY"}, {"LLM_KEY": f"{KEY} "})
    key_free(caught.value)
