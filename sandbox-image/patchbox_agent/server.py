"""The agent's request loop: one framed request in, one framed response out.

Requests are ``{"id": int, "op": str, "args": object}``; responses are
``{"id": int, "ok": true, "result": object}`` or
``{"id": int, "ok": false, "error": {"code": str, "message": str}}``.
The first request must be ``hello`` with the controller's protocol version.
``run`` executes in a worker thread so that ``cancel`` can reach it; ``run_start`` starts
the same on a thread and answers at once, and ``run_poll`` (inline) waits a bounded time for
its output and its end, so reads go on between polls; every other operation runs inline,
in order. The operations themselves are those of a
:class:`patchbox_agent.ops.Workspace`.
"""

from __future__ import annotations

import os
import select
import sys
import time
from _thread import allocate_lock, start_new_thread

from . import jail, procs, wire
from .frames import KIND_JSON, PROTOCOL_VERSION, FdReader, FrameError, Signer, grow_pipe
from .globs import GlobError
from .opargs import OpError
from .ops import Workspace

# The start path imports as little as it can: a sandbox reads every module cold (under
# gVisor through its gofer), so ``json``, ``re``, ``typing``, ``threading``, ``collections``
# and ``signal`` (which brings ``enum``) stay out of it; see docs/performance.md.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import signal as _signal
    from collections.abc import Callable
    from typing import Any
else:
    import _signal  # the C module behind signal, without its enums

AGENT_VERSION = "0.1.0"
WORKSPACE = "/workspace"
WRITE_OPS = frozenset({"replace_text", "apply_patch", "run", "run_start"})
"""Operations that may change the workspace: the first one marks the baseline state."""


class Agent:
    def __init__(
        self,
        in_fd: int,
        out_fd: int,
        workspace: str = WORKSPACE,
        wake: tuple[int, Callable[[], object]] | None = None,
    ) -> None:
        grow_pipe(in_fd)
        self._reader = FdReader(in_fd, wake=wake)
        self._out_fd = out_fd
        self._write_lock = allocate_lock()
        self._ops = Workspace(workspace)
        self._greeted = False
        self._preload: dict[str, Any] | None = None
        self._signer: Signer | None = None

    # -- output ---------------------------------------------------------------------------

    def _send(self, obj: object) -> None:
        if self._signer is None:
            return  # nothing is ever answered without the controller's key
        with self._write_lock:
            data = self._signer.encode(obj)
            view = memoryview(data)
            while view:
                n = os.write(self._out_fd, view)
                view = view[n:]

    def _reply(self, rid: int, fn: Callable[[], dict[str, Any]]) -> None:
        try:
            self._send({"id": rid, "ok": True, "result": fn()})
        except OpError as exc:
            self._send(
                {"id": rid, "ok": False, "error": {"code": exc.code, "message": exc.message}}
            )
        except jail.PathDeniedError as exc:
            err = {"code": exc.code, "message": exc.message[:1000]}
            self._send({"id": rid, "ok": False, "error": err})
        except FrameError:
            raise
        except Exception as exc:
            err = {"code": "SANDBOX_FAILED", "message": f"agent fault: {type(exc).__name__}"}
            self._send({"id": rid, "ok": False, "error": err})

    # -- loop -----------------------------------------------------------------------------

    def _next_request(self) -> tuple[int, str, dict[str, Any]] | None:
        """The next well-formed request, or None when the stream ends or breaks the protocol."""
        frame = self._reader.read()
        if frame is None or frame[0] != KIND_JSON:
            return None
        try:
            req = wire.loads(frame[1])
        except ValueError:
            return None
        if not isinstance(req, dict) or not isinstance(req.get("id"), int):
            return None
        op, args = req.get("op"), req.get("args", {})
        if not isinstance(op, str) or not isinstance(args, dict):
            return None
        if not self._greeted and op != "hello":
            return None
        return req["id"], op, args

    def serve(self) -> int:
        """Serves until end of input or ``shutdown``; returns the process exit code
        (0 on a clean end, 3 on a protocol violation)."""
        try:
            while True:
                req = self._next_request()
                if req is None:
                    return 0 if self._reader.at_eof else 3
                rid, op, args = req
                if op in WRITE_OPS and self._greeted:
                    self._ops.mark_base()
                if op == "shutdown":
                    self._send({"id": rid, "ok": True, "result": {}})
                    return 0
                if op == "run":
                    import threading  # imported on first use: a faster start
                    from functools import partial

                    work = partial(self._ops.run, rid, args)
                    threading.Thread(target=self._reply, args=(rid, work), daemon=True).start()
                    continue
                self._dispatch(rid, op, args)
        except FrameError:
            return 3

    def _dispatch(self, rid: int, op: str, args: dict[str, Any]) -> None:
        ops = self._ops
        handlers: dict[str, Callable[[], dict[str, Any]]] = {
            "hello": lambda: self._hello(args),
            "list_files": lambda: ops.locked(ops.list_files, args),
            "search_text": lambda: ops.locked(ops.search_text, args),
            "replace_text": lambda: ops.locked(ops.replace_text, args),
            "apply_patch": lambda: ops.locked(ops.apply_patch, args),
            "read_file": lambda: ops.read_file(args),
            "cancel": lambda: ops.cancel(args),
            "run_start": lambda: ops.run_start(rid, args),
            "run_poll": lambda: ops.run_poll(args),
            "put_archive": lambda: ops.put_archive(self._reader, args),
            "changes": lambda: ops.locked(ops.changes, args),
            "read_raw": lambda: ops.read_raw(args),
            "check_paths": lambda: ops.check_paths(args),
        }
        handler = handlers.get(op)
        if handler is None:
            err = {"code": "TOOL_ARGUMENTS_INVALID", "message": "unknown operation"}
            self._send({"id": rid, "ok": False, "error": err})
            return
        self._reply(rid, handler)

    # -- greeting -------------------------------------------------------------------------

    def _hello(self, args: dict[str, Any]) -> dict[str, Any]:
        if self._greeted:
            raise OpError("SANDBOX_FAILED", "hello may come only once")
        key = args.get("key")
        if not isinstance(key, str) or len(key) != 64:
            raise OpError("SANDBOX_FAILED", "hello needs a 32-byte key")
        self._signer = Signer(bytes.fromhex(key))
        if args.get("protocol") != PROTOCOL_VERSION:
            raise OpError("SANDBOX_FAILED", "protocol version mismatch")
        protected = args.get("protected", [])
        if not isinstance(protected, list) or not all(isinstance(p, str) for p in protected):
            raise OpError("SANDBOX_FAILED", "protected must be a list of globs")
        try:
            jail.set_operator_protected(protected)
        except GlobError as exc:
            raise OpError("SANDBOX_FAILED", "a protected glob is invalid") from exc
        self._ops.open()
        self._greeted = True
        return {
            "protocol": PROTOCOL_VERSION,
            "agent": AGENT_VERSION,
            "python": sys.version.split()[0],
            "uid": os.getuid(),
            "gid": os.getgid(),
            **({"preload": self._preload} if self._preload is not None else {}),
        }

    def preload(self, path: str) -> None:
        """Unpacks the baseline archive at ``path`` (a file or FIFO the controller mounted
        read-only) before the first request; the result goes into the hello answer."""
        self._preload = self._ops.preload(path)


def _not_dumpable() -> None:
    """Makes the agent non-dumpable, so processes it starts (same uid) cannot open its
    channel through /proc/PID/fd or attach to it."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4
    except (OSError, AttributeError):
        pass


def _on_term(*_: object) -> None:
    """SIGTERM (``docker stop``): the agent, the container's init, ends; the kernel then
    kills every other process of the sandbox."""
    os._exit(143)


HANGUP_GRACE = 1.0
"""How long the agent, once its channel hung up, leaves its request loop to see the end (and
exit with its own status) before it ends anyway."""


def _end_with_channel(in_fd: int) -> None:
    """Ends the agent once its channel hangs up, whatever it is doing then.

    The channel's end is the controller's end: Docker closes the container's stdin when the
    controller's attach stream closes (``StdinOnce``), for any reason, SIGKILL included. The
    request loop sees that end when it next reads; this watch (a thread of its own, blocked
    in ``poll`` on hang-up alone, never on data) also covers the times it does not read:
    while the baseline is unpacked, while the open of a FIFO that nobody will feed waits, and
    during a long call. The agent is the container's init, so its exit ends the sandbox. A
    spare nobody attached to has no hang-up: it waits for its claim or its idle exit.
    """
    poller = select.poll()
    poller.register(in_fd, 0)  # POLLHUP, POLLERR and POLLNVAL are always reported
    while not poller.poll():
        pass
    time.sleep(HANGUP_GRACE)
    os._exit(0)


def main() -> int:
    """Entry point: takes private copies of stdin/stdout and points fds 0 and 1 at /dev/null.

    Nothing the agent starts can then write into the channel by accident. As pid 1 (the
    container's init) the agent also reaps orphans (see :mod:`patchbox_agent.procs`). The
    agent ends when its channel hangs up (:func:`_end_with_channel`).
    """
    _not_dumpable()
    wake = None
    if os.getpid() == 1:
        _signal.signal(_signal.SIGTERM, _on_term)
        wake = procs.install_reaper()
    in_fd = os.dup(0)
    out_fd = os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)
    sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the process
    start_new_thread(_end_with_channel, (in_fd,))
    workspace = os.environ.get("PATCHBOX_WORKSPACE", WORKSPACE)
    agent = Agent(in_fd, out_fd, workspace, wake)
    preload = os.environ.get("PATCHBOX_PRELOAD")
    if preload:
        agent.preload(preload)
    idle = os.environ.get("PATCHBOX_IDLE_EXIT")
    if idle and not select.select([in_fd], [], [], float(idle))[0]:
        return 0  # a spare nobody claimed in time: the container ends (and is removed)
    return agent.serve()
