"""A server that disconnects mid-answer, against a real HTTP server on loopback.

A disconnect (the connection closes or resets inside a framed body, an event stream ends
before its last event, an unframed JSON answer ends inside its JSON) is retried like a 5xx:
the same backoff, the same ``max_attempts``; once they are used up the turn fails with
PROVIDER_ERROR naming the disconnect. A turn cut short is never used, not even in part.
"""

from __future__ import annotations

import json
import socket
import struct
from collections.abc import Iterator, MutableMapping
from typing import Any

import pytest
import structlog

from controller.errors import ErrorCode
from controller.providers import ProviderError, ToolCall
from controller.providers.replies import ends_early
from tests.support.loopback import (
    Handler,
    LoopbackServer,
    Responder,
    json_reply,
    serve,
    write_chunk,
)
from tests.support.openai import (
    APIS,
    KEY,
    MODES,
    READ,
    SEARCH,
    answer,
    chat_json,
    chat_sse,
    key_free,
    named,
    provider_for,
    responses_json,
    responses_sse,
    result,
)


@pytest.fixture
def server() -> Iterator[LoopbackServer]:
    yield from serve()


def events_of(api: str, calls: list[tuple[str, str, str]], text: str | None = None) -> list[bytes]:
    return chat_sse(calls, text) if api == "chat" else responses_sse(calls, text)


def body_of(api: str, calls: list[tuple[str, str, str]], text: str | None = None) -> bytes:
    value = chat_json(calls, text) if api == "chat" else responses_json(calls, text)
    return json.dumps(value).encode()


def partial_chunk(events: list[bytes], upto: int) -> Responder:
    """A chunked event stream: the events before ``upto`` whole, then a chunk that announces
    event ``upto`` whole but carries only its first half, then the connection closes."""

    def respond(handler: Handler) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", "text/event-stream")
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()
        for event in events[:upto]:
            write_chunk(handler, event)
        cut = events[upto]
        handler.wfile.write(f"{len(cut):x}\r\n".encode() + cut[: len(cut) // 2])
        handler.wfile.flush()

    return respond


def partial_unframed(events: list[bytes], upto: int) -> Responder:
    """An event stream without a length or chunking (it ends where the connection closes):
    the events before ``upto`` whole, then half of event ``upto``."""

    def respond(handler: Handler) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", "text/event-stream")
        handler.end_headers()
        for event in events[:upto]:
            handler.wfile.write(event)
        handler.wfile.write(events[upto][: len(events[upto]) // 2])
        handler.wfile.flush()

    return respond


def partial_body(
    body: bytes, *, framed: bool = True, status: int = 200, reset: bool = False
) -> Responder:
    """A JSON answer announcing ``len(body)`` bytes (unless not ``framed``) and closing after
    half of them; with ``reset`` the connection is reset (RST) instead of closed."""

    def respond(handler: Handler) -> None:
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        if framed:
            handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body[: len(body) // 2])
        handler.wfile.flush()
        if reset:
            handler.connection.setsockopt(
                socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
            )
            handler.connection.close()

    return respond


def unframed(body: bytes, content_type: str = "application/json") -> Responder:
    """A whole answer without a length (it ends where the connection closes)."""

    def respond(handler: Handler) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", content_type)
        handler.end_headers()
        handler.wfile.write(body)

    return respond


def stream_cut(api: str, kind: str, calls: list[tuple[str, str, str]]) -> Responder:
    """A stream of ``calls`` cut inside the first tool call's arguments."""
    events = events_of(api, calls)
    # chat: role, call header, first half of the arguments | responses: created, reasoning.
    upto = 3 if api == "chat" else 2
    return partial_chunk(events, upto) if kind == "chunked" else partial_unframed(events, upto)


def retry_waits(logs: list[MutableMapping[str, Any]]) -> list[tuple[int, float]]:
    return [(e["attempt"], e["wait_seconds"]) for e in logs if e["event"] == "provider_retry"]


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("kind", ["chunked", "unframed"])
def test_stream_cut_after_a_partial_chunk_then_whole(
    server: LoopbackServer, api: str, kind: str
) -> None:
    """The first attempt's stream breaks inside a tool call's arguments; the second answer
    (another call) is the turn, whole: nothing of the first reaches the turn or the
    conversation."""
    server.play(
        stream_cut(api, kind, [READ]), answer(api, stream=True, calls=[SEARCH], text="Searching.")
    )
    with (
        structlog.testing.capture_logs() as logs,
        provider_for(server, api, stream=True) as provider,
    ):
        turn = provider.next_turn([])
        assert turn.tool_calls == [ToolCall(id=SEARCH[0], name=SEARCH[1], arguments=SEARCH[2])]
        assert turn.text == "Searching."
        server.play(answer(api, stream=True, calls=[], text="Done."))
        assert provider.next_turn([result(SEARCH, "3 hits")]).text == "Done."
    first, second, third = server.received
    assert first.body == second.body
    history = json.dumps(third.json())
    assert READ[0] not in history  # the cut call never joined the conversation
    assert history.count(SEARCH[0]) == 2  # its call and its result
    reasons = [e["reason"] for e in logs if e["event"] == "provider_retry"]
    assert len(reasons) == 1
    assert reasons[0].startswith("the server disconnected mid-stream (")


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("kind", ["chunked", "unframed"])
def test_stream_always_cut_fails_after_the_bounded_attempts(
    server: LoopbackServer, api: str, kind: str
) -> None:
    server.play(*[stream_cut(api, kind, [READ, SEARCH])] * 3)
    with (
        structlog.testing.capture_logs() as logs,
        provider_for(server, api, stream=True) as provider,
        pytest.raises(ProviderError) as caught,
    ):
        provider.next_turn([])
    assert caught.value.code == ErrorCode.PROVIDER_ERROR
    expected = named(server, api) + "the server disconnected mid-stream ("
    assert caught.value.message.startswith(expected)
    assert caught.value.message.endswith("; gave up after 3 attempts")
    key_free(caught.value)
    assert len(server.received) == 3
    assert [a for a, _ in retry_waits(logs)] == [1, 2]


def test_a_disconnect_waits_like_a_5xx(server: LoopbackServer) -> None:
    """The same exponential backoff and the same attempt bound as an HTTP 503."""
    fields = {"max_attempts": 4, "backoff_seconds": 0.02, "max_backoff_seconds": 0.05}
    waits = []
    for responder in (json_reply({}, 503), stream_cut("chat", "chunked", [READ])):
        server.play(*[responder] * 4)
        with (
            structlog.testing.capture_logs() as logs,
            provider_for(server, "chat", stream=True, **fields) as provider,
            pytest.raises(ProviderError, match="gave up after 4 attempts"),
        ):
            provider.next_turn([])
        waits.append(retry_waits(logs))
    assert waits[0] == waits[1] == [(1, 0.02), (2, 0.04), (3, 0.05)]
    assert len(server.received) == 8


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize(
    "cut",
    [
        {"framed": True},
        {"framed": False},
        {"framed": True, "reset": True},
    ],
    ids=["content-length", "unframed", "reset"],
)
def test_non_streamed_answer_cut_mid_body(
    server: LoopbackServer, api: str, cut: dict[str, bool]
) -> None:
    body = body_of(api, [READ, SEARCH], "Reading.")
    server.play(partial_body(body, **cut), json_reply(body))
    with provider_for(server, api) as provider:
        turn = provider.next_turn([])
    assert [c.id for c in turn.tool_calls] == [READ[0], SEARCH[0]]
    assert len(server.received) == 2
    server.play(*[partial_body(body, **cut)] * 3)
    with provider_for(server, api) as provider, pytest.raises(ProviderError) as caught:
        provider.next_turn([])
    assert "the server disconnected mid-answer (" in caught.value.message
    assert caught.value.message.endswith("; gave up after 3 attempts")
    assert len(server.received) == 5


@pytest.mark.parametrize(("api", "stream"), MODES)
def test_a_whole_unframed_answer_is_read(server: LoopbackServer, api: str, stream: bool) -> None:
    if stream:
        server.play(unframed(b"".join(events_of(api, [READ])), "text/event-stream"))
    else:
        server.play(unframed(body_of(api, [READ])))
    with provider_for(server, api, stream) as provider:
        assert [c.id for c in provider.next_turn([]).tool_calls] == [READ[0]]
    assert len(server.received) == 1


def test_unframed_junk_is_not_a_disconnect(server: LoopbackServer) -> None:
    """An unframed answer that is not JSON at all (rather than JSON cut short) fails at once."""
    server.play(unframed(b"not json{"))
    with provider_for(server) as provider, pytest.raises(ProviderError) as caught:
        provider.next_turn([])
    assert caught.value.message == named(server) + "answer is not valid JSON"
    assert len(server.received) == 1


@pytest.mark.parametrize(("status", "attempts"), [(503, 3), (401, 1)])
def test_a_refusal_cut_mid_body_keeps_its_status(
    server: LoopbackServer, status: int, attempts: int
) -> None:
    """A refusal's body only serves to find its error code: cut, the status still decides."""
    body = json.dumps({"error": {"code": "some_code", "message": KEY}}).encode()
    server.play(*[partial_body(body, status=status)] * attempts)
    with provider_for(server) as provider, pytest.raises(ProviderError) as caught:
        provider.next_turn([])
    assert f"HTTP {status}" in caught.value.message
    assert "disconnected" not in caught.value.message
    key_free(caught.value)
    assert len(server.received) == attempts


def test_ends_early() -> None:
    """Every proper prefix of an answer ends early; no whole answer and no junk does."""
    value = chat_json([READ, SEARCH], 'héllo "x"') | {"n": [-1.5e-3, 1e5, True, False, None]}
    for ascii_only in (True, False):
        whole = json.dumps(value, ensure_ascii=ascii_only, indent=1).encode()
        assert not ends_early(whole)
        assert all(ends_early(whole[:n]) for n in range(len(whole)))
    junk = [b"not json{", b"{}}", b"{}.", b"[1 2]", b'{"a": nope}', b'"\\uzz"', b"\xff\xfe"]
    for body in [*junk, b'{"a": 1, "a": 2}', b"[" * 100_000 + b"]"]:
        assert not ends_early(body), body[:20]
