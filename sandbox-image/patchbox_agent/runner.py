"""The ``run`` operation's process: started in a session of its own, its output read until
it exits or its deadline passes (keeping the last bytes), then its whole process group
killed, so background children cannot keep the pipe open or outlive the call.

The operations (:mod:`patchbox_agent.ops`) import this module on first use (a faster start,
see docs/performance.md); they keep the request's arguments and the bookkeeping of running
calls (``cancel``).
"""

from __future__ import annotations

import os
import select
import subprocess
import time

from . import procs

TYPE_CHECKING = False
if TYPE_CHECKING:
    import signal as _signal
    from collections.abc import Callable
    from typing import IO, Any
else:
    import _signal  # the C module behind signal, without its enums


def spawn(argv: list[str], env: dict[str, str], cwd: str) -> subprocess.Popen[bytes]:
    """Starts ``argv`` in ``cwd`` with exactly ``env``, in a new session (its own process
    group), stdin from /dev/null and stdout and stderr into one pipe. Raises OSError when
    it cannot start."""
    return procs.popen(
        argv,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        close_fds=True,
    )


def result(  # noqa: PLR0913 - one field per keyword of the wire result
    started: float,
    *,
    code: int | None = None,
    timed_out: bool = False,
    cancelled: bool = False,
    tail: bytes = b"",
    total: int = 0,
    spawn_error: str | None = None,
    oom_kills: int | None = None,
) -> dict[str, Any]:
    """The wire result of a run that began at ``started`` (``time.monotonic``): a negative
    ``code`` is a signal; ``tail`` is the output kept out of ``total`` bytes; ``oom_kills``
    is how many processes the kernel OOM-killed in the container during the run."""
    return {
        "exitCode": code if code is not None and code >= 0 else None,
        "signal": -code if code is not None and code < 0 else None,
        "timedOut": timed_out,
        "cancelled": cancelled,
        "spawnError": spawn_error,
        "output": tail.decode("utf-8", "replace"),
        "outputBytes": total,
        "truncated": total > len(tail),
        "durationMs": int((time.monotonic() - started) * 1000),
        "oomKills": oom_kills,
    }


# Where the kernel counts the OOM kills of the container's memory cgroup (v1, then v2).
_OOM_COUNTERS = ("/sys/fs/cgroup/memory/memory.oom_control", "/sys/fs/cgroup/memory.events")


def oom_kills() -> int | None:
    """The container's OOM-kill count so far, or None where the kernel does not show it.

    A hint only: the controller takes the verdict from Docker, and uses a rise in this
    count to know that Docker's word is on its way.
    """
    for path in _OOM_COUNTERS:
        try:
            with open(path, "rb") as stream:
                text = stream.read(4096)
        except OSError:
            continue
        for line in text.splitlines():
            name, _, value = line.partition(b" ")
            if name == b"oom_kill" and value.strip().isdigit():
                return int(value)
    return None


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL to the process group of ``proc`` (a session leader); nothing if it is gone."""
    try:
        os.killpg(proc.pid, _signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class _Tail:
    """Keeps the last ``cap`` bytes of a stream and counts all of it."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.data = bytearray()
        self.total = 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        self.data += chunk
        if len(self.data) > self.cap:
            del self.data[: len(self.data) - self.cap]


def _read_ready(fd: int, wait: float) -> bytes | None:
    """A chunk from ``fd`` if one is ready within ``wait`` seconds; b"" at end of stream."""
    ready, _, _ = select.select([fd], [], [], wait)
    if not ready:
        return None
    try:
        return os.read(fd, 65536)
    except BlockingIOError:
        return None
    except OSError:
        return b""


def _outlives(proc: subprocess.Popen[bytes], deadline: float) -> bool:
    """Waits for a process whose output ended before it did: True when it still runs at
    the deadline."""
    if proc.poll() is not None:
        return False
    try:
        proc.wait(max(deadline - time.monotonic(), 0))
    except subprocess.TimeoutExpired:
        return True
    return False


def collect(
    proc: subprocess.Popen[bytes],
    out: IO[bytes],
    deadline: float,
    cap: int,
    sink: Callable[[bytes], object] | None = None,
) -> tuple[bytes, int, bool]:
    """Reads the process output (keeping the last ``cap`` bytes) until exit or deadline.

    When the process exits, or the deadline passes, its whole process group is killed, so
    background children cannot keep the pipe open. The end of its output is not its end: a
    process that closes its output first (coreutils do, at exit) is waited for until the
    deadline, never killed before it exits. Returns the tail, the total output size and
    whether the deadline passed.
    """
    fd = out.fileno()
    os.set_blocking(fd, False)
    tail = _Tail(cap)
    timed_out = False
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            timed_out = True
            break
        chunk = _read_ready(fd, min(remaining, 0.5))
        if chunk == b"":
            break
        if chunk:
            tail.add(chunk)
            if sink is not None:
                sink(chunk)
        if proc.poll() is not None:
            kill_group(proc)
    timed_out = timed_out or _outlives(proc, deadline)
    kill_group(proc)
    proc.wait()
    # Drain what was written before the kill, without waiting on stragglers.
    while chunk := _read_ready(fd, 0):
        tail.add(chunk)
        if sink is not None:
            sink(chunk)
    out.close()
    return bytes(tail.data), tail.total, timed_out


UNREAD_CAP = 64 * 1024
"""The most output a watched run keeps for its next poll (the newest bytes win)."""


class Watch:
    """A run that goes on while the controller does other calls (``run_start``): its
    output as it comes, kept for the next ``run_poll`` (the newest :data:`UNREAD_CAP`
    bytes, with a count of those dropped), and its result once it ended."""

    def __init__(self) -> None:
        import threading  # imported on first use: a faster start

        self._cond = threading.Condition()
        self._unread = bytearray()
        self._dropped = 0
        self.result: dict[str, Any] | None = None
        self.error: tuple[str, str] | None = None

    def add(self, chunk: bytes) -> None:
        with self._cond:
            self._unread += chunk
            if len(self._unread) > UNREAD_CAP:
                cut = len(self._unread) - UNREAD_CAP
                del self._unread[:cut]
                self._dropped += cut
            self._cond.notify_all()

    def end(self, result: dict[str, Any] | None, error: tuple[str, str] | None = None) -> None:
        with self._cond:
            self.result, self.error = result, error
            self._cond.notify_all()

    @property
    def done(self) -> bool:
        return self.result is not None or self.error is not None

    def take(self, wait: float) -> dict[str, Any]:
        """Waits up to ``wait`` seconds for output or the end; returns the output not yet
        taken (``output``, ``dropped`` bytes before it) and ``done``, with the ``result``
        once the run ended."""
        deadline = time.monotonic() + wait
        with self._cond:
            while not self.done and len(self._unread) <= _partial_tail(self._unread):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
            done = self.done
            keep = 0 if done else _partial_tail(self._unread)
            data = bytes(self._unread[: len(self._unread) - keep])
            del self._unread[: len(data)]
            dropped, self._dropped = self._dropped, 0
            out: dict[str, Any] = {
                "output": data.decode("utf-8", "replace"),
                "dropped": dropped,
                "done": done,
            }
            if done and self.result is not None:
                out["result"] = self.result
            return out


def _partial_tail(data: bytearray) -> int:
    """How many bytes at the end of ``data`` begin a UTF-8 character not yet whole (kept
    for the next poll, so a character cut between two reads is not mangled)."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte < 0x80:
            return 0
        if byte >= 0xC0:  # a lead byte: whole when its sequence is as long as what follows
            need = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return back if need > back else 0
    return 0
