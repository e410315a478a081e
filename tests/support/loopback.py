"""A real HTTP server on 127.0.0.1 for provider tests.

The server plays the responders queued with :meth:`LoopbackServer.play`, one per request, in
order, and records every request it received. Responders write to the socket themselves, so
they can misbehave the way a hostile or broken endpoint would: hang, trickle, cut a stream,
lie about sizes. A request with nothing queued gets HTTP 599 and is recorded, so a test that
sends more requests than it planned fails on its own assertions. Hanging responders end when
the server stops.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

HANG_LIMIT_SECONDS = 30.0
"""The longest a hanging responder holds on, whatever the test does."""


@dataclass(frozen=True)
class Received:
    """One request as the server read it."""

    method: str
    path: str
    headers: dict[str, str]
    """Header names in lower case."""
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        body = self.rfile.read(length)
        owner = self.server.owner
        owner.record(
            Received(
                method="POST",
                path=self.path,
                headers={k.lower(): v for k, v in self.headers.items()},
                body=body,
            )
        )
        self.close_connection = True
        responder = owner.next_responder()
        if responder is None:
            send_body(self, 599, b"nothing queued", "text/plain")
            return
        try:
            responder(self)
        except OSError:
            pass  # the client went away (cancel, deadline): nothing left to say

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        """Quiet."""

    @property
    def stopping(self) -> threading.Event:
        return self.server.owner.stopping


Responder = Callable[[Handler], None]


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    owner: LoopbackServer


class LoopbackServer:
    """Serves on ``url`` while entered; stops and releases hanging responders on exit."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        """``host``: the address to listen on (another of this machine's addresses stands
        for a model server on a private network)."""
        self._lock = threading.Lock()
        self._queue: deque[Responder] = deque()
        self._received: list[Received] = []
        self.stopping = threading.Event()
        self._httpd = _Server((host, 0), Handler)
        self._httpd.owner = self
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.005}, daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def received(self) -> list[Received]:
        with self._lock:
            return list(self._received)

    def play(self, *responders: Responder) -> None:
        with self._lock:
            self._queue.extend(responders)

    def record(self, request: Received) -> None:
        with self._lock:
            self._received.append(request)

    def next_responder(self) -> Responder | None:
        with self._lock:
            return self._queue.popleft() if self._queue else None

    def __enter__(self) -> LoopbackServer:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stopping.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)


def send_body(
    handler: Handler,
    status: int,
    body: bytes,
    content_type: str,
    headers: dict[str, str] | None = None,
) -> None:
    handler.send_response(status)
    handler.send_header("Content-Type", content_type)
    handler.send_header("Content-Length", str(len(body)))
    for name, value in (headers or {}).items():
        handler.send_header(name, value)
    handler.end_headers()
    handler.wfile.write(body)


def json_reply(value: Any, status: int = 200, headers: dict[str, str] | None = None) -> Responder:
    """A complete JSON answer (``value`` as bytes is sent as it is)."""
    body = value if isinstance(value, bytes) else json.dumps(value).encode()

    def respond(handler: Handler) -> None:
        send_body(handler, status, body, "application/json", headers)

    return respond


def sse_event(data: Any, event: str | None = None) -> bytes:
    """One server-sent event; ``data`` is JSON-encoded unless it is a str."""
    text = data if isinstance(data, str) else json.dumps(data)
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {text}\n\n".encode()


def sse_reply(
    events: list[bytes], *, cut_after: int | None = None, chunked: bool = True
) -> Responder:
    """An event stream, one chunk per event. ``cut_after=n`` closes the connection after n
    events: mid-chunked-body when ``chunked``, else as an end of a body without a length."""

    def respond(handler: Handler) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", "text/event-stream")
        if chunked:
            handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()
        for number, event in enumerate(events):
            if cut_after is not None and number >= cut_after:
                return
            write_chunk(handler, event, chunked=chunked)
        if chunked:
            handler.wfile.write(b"0\r\n\r\n")

    return respond


def write_chunk(handler: Handler, data: bytes, *, chunked: bool = True) -> None:
    if chunked:
        handler.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
    else:
        handler.wfile.write(data)


def hang() -> Responder:
    """Reads the request and never answers."""

    def respond(handler: Handler) -> None:
        handler.stopping.wait(HANG_LIMIT_SECONDS)

    return respond


def hang_after(events: list[bytes]) -> Responder:
    """Starts an event stream, sends ``events``, then goes silent."""

    def respond(handler: Handler) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", "text/event-stream")
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()
        for event in events:
            write_chunk(handler, event)
        handler.stopping.wait(HANG_LIMIT_SECONDS)

    return respond


def announce(length: int) -> Responder:
    """Promises a ``length``-byte JSON body, sends none of it, and goes silent."""

    def respond(handler: Handler) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(length))
        handler.end_headers()
        handler.stopping.wait(HANG_LIMIT_SECONDS)

    return respond


def trickle(interval: float) -> Responder:
    """Starts an event stream and sends a keep-alive comment every ``interval`` seconds."""

    def respond(handler: Handler) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", "text/event-stream")
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()
        while not handler.stopping.wait(interval):
            write_chunk(handler, b": ping\n\n")

    return respond


def streamed_bytes(total: int, content_type: str = "application/json") -> Responder:
    """``total`` bytes in a chunked body, without a length announced up front."""

    def respond(handler: Handler) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", content_type)
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()
        left = total
        while left > 0:
            size = min(left, 64 * 1024)
            write_chunk(handler, b" " * size)
            left -= size
        handler.wfile.write(b"0\r\n\r\n")

    return respond


def serve() -> Iterator[LoopbackServer]:
    """For a fixture: ``yield from serve()``."""
    with LoopbackServer() as server:
        yield server
