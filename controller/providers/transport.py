"""The provider's HTTP plumbing: one request in flight that the waiting side can abort (its
sockets shut down, so a blocked read returns), and the verifying TLS context, made once per
CA setting."""

from __future__ import annotations

import functools
import os
import socket
import ssl
import threading
from collections.abc import Mapping

import httpx


class AbortedError(Exception):
    """Raised in the worker after the waiting side gave up on the request."""


class Request:
    """One HTTP request in flight: its sockets, its outcome, and who is waiting for it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self.aborted = False
        self.wake = threading.Event()
        self.reply: tuple[int, httpx.Headers, bytes] | None = None
        self.error: BaseException | None = None

    def trace(self, name: str, info: Mapping[str, object]) -> None:
        if name not in ("connection.connect_tcp.complete", "connection.start_tls.complete"):
            return
        stream = info.get("return_value")
        sock = getattr(stream, "get_extra_info", lambda _: None)("socket")
        if not isinstance(sock, socket.socket):
            return
        with self._lock:
            self._sockets.append(sock)
            aborted = self.aborted
        if aborted:
            shut(sock)

    def abort(self) -> None:
        """Shuts every socket of the request down; a blocked read in the worker returns."""
        with self._lock:
            self.aborted = True
            sockets = list(self._sockets)
        for sock in sockets:
            shut(sock)
        self.wake.set()

    def finish(self) -> None:
        self.wake.set()


def shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


@functools.cache
def _tls_context(trust_env: bool, _cafile: str | None, _capath: str | None) -> ssl.SSLContext:
    # Keyed on the variables httpx reads, so a changed environment gets a new context.
    return httpx.create_ssl_context(trust_env=trust_env)


def tls_context(trust_env: bool) -> ssl.SSLContext:
    """httpx's default verifying context, made once per CA setting (loading CAs is slow)."""
    return _tls_context(trust_env, os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))
