"""``patchbox mcp``: the server of :mod:`controller.mcp.server` over stdio, or over Streamable
HTTP on 127.0.0.1 with ``--http PORT``.

Stdio: the protocol is stdin and stdout, so nothing else may reach stdout. While the server
runs, fd 1 points at stderr (the SDK's ``stdio_server`` claims it), ``sys.stdout`` is
``sys.stderr``, and fd 0 reads ``/dev/null``; the client's lines are read from a private
copy of stdin by a daemon thread, so a signal never waits for the client's next line. The
server ends at stdin's end (the client went away).

Both: SIGINT, SIGTERM and SIGHUP stop the server. However it stops, every session's job is
closed before the process exits (cancelled unless it was proposed; its containers removed).
The exit status is 0, 128 plus the signal's number after a signal, or, when no session ever
opened because opening failed (``JOB_ALREADY_RUNNING``, ``CONSENT_REQUIRED``, ...), that
error's exit status.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, cast

import anyio
import anyio.from_thread
import anyio.lowlevel

from controller.errors import UsageError
from controller.logs import write_line
from controller.mcp.server import build_server
from controller.mcp.slot import Options, Sessions, Slot
from controller.signals import CANCEL_SIGNALS, exit_code_for

if TYPE_CHECKING:
    import argparse

    from anyio.streams.memory import MemoryObjectSendStream
    from mcp.server.lowlevel import Server

Progress = Callable[[str], None]
HOST = "127.0.0.1"
GRACEFUL_SHUTDOWN_SECONDS = 5
MAX_IDLE_TIMEOUT_SECONDS = 86400.0
"""How long HTTP requests still running at a stop get before they are cancelled."""


def options_from(args: argparse.Namespace) -> Options:
    """The server's options from the command line; the files are read and checked now, so a
    bad task, configuration or repository path fails at once (exit 2)."""
    from controller import api
    from controller.config.host import load_config
    from controller.config.task import load_task
    from controller.repo.layout import locate
    from controller.version import version

    idle = args.idle_timeout
    if not 0 < idle <= MAX_IDLE_TIMEOUT_SECONDS:
        msg = (
            "--idle-timeout takes seconds above 0 and at most "
            f"{MAX_IDLE_TIMEOUT_SECONDS:g}, not {idle:g}"
        )
        raise UsageError(msg)
    config = load_config(Path(args.config) if args.config else None)
    task = load_task(Path(args.task)) if args.task else None
    repo = Path(args.repo)
    locate(repo)
    return Options(
        repo=repo,
        task=task or api.default_task(config),
        config=config,
        task_given=task is not None,
        include_local_changes=args.include_local_changes,
        trust_repo_config=args.trust_repo_config,
        runtime=args.runtime,
        version=version(),
        idle_seconds=idle,
    )


def serve(args: argparse.Namespace, progress: Progress) -> int:
    """Runs the server until the client goes (stdio) or a signal; returns the exit status."""
    port: int | None = args.http
    if port is not None and not 0 <= port <= 65535:
        msg = f"--http takes a port number (0 for any free one), not {port}"
        raise UsageError(msg)
    options = options_from(args)
    sessions = Sessions(lambda: Slot(options, progress))
    server = build_server(options, sessions, http=port is not None)
    stop = _Stop(progress)
    try:
        if port is None:
            anyio.run(_stdio, server, stop)
        else:
            anyio.run(_http, server, _listen(port), stop)
    finally:
        with _signals_ignored():
            sessions.close_all()
    if stop.signum is not None:
        return exit_code_for(stop.signum)
    return sessions.exit_code()


@dataclass
class _Stop:
    """The first SIGINT, SIGTERM or SIGHUP stops the server; later ones are ignored."""

    progress: Progress
    signum: int | None = None

    async def watch(self, stop: Callable[[], None]) -> None:
        with anyio.open_signal_receiver(*CANCEL_SIGNALS) as received:
            async for signum in received:
                if self.signum is None:
                    self.signum = signum
                    with contextlib.suppress(OSError, ValueError):
                        self.progress(f"stopping ({signal.Signals(signum).name})")
                    stop()


@contextlib.contextmanager
def _signals_ignored() -> Iterator[None]:
    """While the sessions close: a second signal (the SDK's stdio client sends SIGTERM two
    seconds after closing stdin) must not cut the cleanup short."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, lambda *_: None) for sig in CANCEL_SIGNALS}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


# -- stdio --------------------------------------------------------------------------------


async def _stdio(server: Server[None], stop: _Stop) -> None:
    from mcp.server.stdio import stdio_server

    lines = _WireLines(_claim_stdin())
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(stop.watch, tasks.cancel_scope.cancel)
        # stdio_server reads with ``async for line in stdin``; _WireLines is such an iterator
        # (not an AsyncFile, whose reads a cancellation has to wait for).
        async with stdio_server(stdin=cast("anyio.AsyncFile[str]", lines)) as (read, write):
            with contextlib.redirect_stdout(sys.stderr):
                await server.run(read, write, server.create_initialization_options())
        tasks.cancel_scope.cancel()


def _claim_stdin() -> int:
    """A private descriptor of the client's stdin; fd 0 then reads ``/dev/null``, so no
    process the server starts can read the protocol."""
    try:
        wire = fcntl.fcntl(0, fcntl.F_DUPFD_CLOEXEC, 3)
    except OSError as exc:
        msg = "stdin is not open: an MCP client starts the server with pipes"
        raise UsageError(msg) from exc
    null = os.open(os.devnull, os.O_RDONLY)
    try:
        os.dup2(null, 0)
    finally:
        os.close(null)
    return wire


class _WireLines:
    """The client's lines, read from ``fd`` by a daemon thread: the server can be cancelled
    while it waits for one, and the thread never keeps the process alive."""

    CHUNK = 1 << 16

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._send, self._receive = anyio.create_memory_object_stream[str](1)
        self._thread: threading.Thread | None = None

    def __aiter__(self) -> _WireLines:
        if self._thread is None:
            token = anyio.lowlevel.current_token()
            self._thread = threading.Thread(
                target=self._pump, args=(self._send, token), name="mcp-stdin", daemon=True
            )
            self._thread.start()
        return self

    async def __anext__(self) -> str:
        try:
            return await self._receive.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    def _pump(
        self, send: MemoryObjectSendStream[str], token: anyio.lowlevel.EventLoopToken
    ) -> None:
        pending = bytearray()
        try:
            while chunk := os.read(self._fd, self.CHUNK):
                start = len(pending)
                pending += chunk
                end = pending.find(b"\n", start)
                while end != -1:
                    line = pending[:end].decode("utf-8", "replace")
                    del pending[: end + 1]
                    anyio.from_thread.run(send.send, line, token=token)
                    end = pending.find(b"\n")
            if pending.strip():
                anyio.from_thread.run(send.send, pending.decode("utf-8", "replace"), token=token)
            anyio.from_thread.run_sync(send.close, token=token)
        except (OSError, RuntimeError, anyio.BrokenResourceError, anyio.ClosedResourceError):
            return  # the server stopped first (RunFinishedError is a RuntimeError)


# -- HTTP ---------------------------------------------------------------------------------


def _listen(port: int) -> socket.socket:
    """The listening address, bound before the server starts (so port 0 names its port)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((HOST, port))
    except OSError as exc:
        sock.close()
        msg = f"cannot listen on {HOST}:{port}: {exc.strerror}"
        raise UsageError(msg) from exc
    return sock


async def _http(server: Server[None], sock: socket.socket, stop: _Stop) -> None:
    import uvicorn

    class Web(uvicorn.Server):
        """uvicorn without signal handlers of its own (the server's stop it); says where it
        listens once it does."""

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            if self.started:
                write_line(f"patchbox: MCP server listening on http://{HOST}:{port}/mcp")

    port = sock.getsockname()[1]
    app = server.streamable_http_app(host=HOST)
    config = uvicorn.Config(
        app,
        host=HOST,
        port=port,
        lifespan="on",
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS,
    )
    web = Web(config)

    def halt() -> None:
        web.should_exit = True

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(stop.watch, halt)
        await web.serve(sockets=[sock])
        tasks.cancel_scope.cancel()
