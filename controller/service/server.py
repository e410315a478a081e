"""How ``patchbox serve`` runs its application on uvicorn: the server's settings, and a
deadline for each request's head, which uvicorn does not have.

uvicorn bounds the size of a request's head (h11's 16 KiB) but not the time it takes: its
keep-alive timer only runs between requests and stops at the first byte, so a client that
sends a header a byte at a time holds its connection for ever, and enough such clients hold
every connection the process can have. :func:`head_deadline_protocol` is uvicorn's own h11
protocol with a timer on each request's head: armed when the connection opens and when the
previous answer has been sent, stopped once the whole head (request line and headers) has
been read. A head still incomplete at the deadline gets ``408`` (when some of it came) and
the connection is closed; no application code has run for it. The body and the answer have
no such deadline (a bundle upload may take long; an event stream lasts as long as its job).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from controller.service.config import ServiceConfig


def _timeout_answer(seconds: float) -> bytes:
    message = f"the request's head did not arrive within {seconds:g} s (header_timeout_seconds)"
    body = json.dumps({"error": {"code": "BAD_REQUEST", "message": message}}).encode()
    head = (
        "HTTP/1.1 408 Request Timeout\r\n"
        "content-type: application/json\r\n"
        f"content-length: {len(body)}\r\n"
        "connection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


class HeadDeadlineProtocol(H11Protocol):
    """uvicorn's h11 protocol, closing a connection whose request head is not complete
    :attr:`head_seconds` after the connection opened or the previous answer ended."""

    head_seconds = 10.0
    _head_timer: asyncio.TimerHandle | None = None
    _head_bytes = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[arg-type]
        self._await_head()

    def data_received(self, data: bytes) -> None:
        if self.conn.their_state is h11.IDLE:
            self._head_bytes += len(data)
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:
            self._stop_head_timer()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
            self._await_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_head_timer()
        super().connection_lost(exc)

    def _await_head(self) -> None:
        self._stop_head_timer()
        self._head_bytes = 0
        self._head_timer = self.loop.call_later(self.head_seconds, self._head_late)

    def _stop_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_late(self) -> None:
        self._head_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        if self._head_bytes:  # some of a head came: say why the connection ends
            self.transport.write(_timeout_answer(self.head_seconds))
        self.transport.close()


def head_deadline_protocol(seconds: float) -> type[HeadDeadlineProtocol]:
    """:class:`HeadDeadlineProtocol` with a deadline of ``seconds``."""
    return type("HeadDeadlineProtocol", (HeadDeadlineProtocol,), {"head_seconds": seconds})


def server_config(app: Any, service: ServiceConfig, **settings: Any) -> uvicorn.Config:
    """The uvicorn settings of the service's application: ``settings`` (host, port, log
    level, graceful shutdown) and the head deadline of ``header_timeout_seconds``."""
    protocol = head_deadline_protocol(service.header_timeout_seconds)
    return uvicorn.Config(app, http=protocol, **settings)
