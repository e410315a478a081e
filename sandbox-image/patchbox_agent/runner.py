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


def collect(
    proc: subprocess.Popen[bytes], out: IO[bytes], deadline: float, cap: int
) -> tuple[bytes, int, bool]:
    """Reads the process output (keeping the last ``cap`` bytes) until exit or deadline.

    When the process exits, or the deadline passes, its whole process group is killed, so
    background children cannot keep the pipe open. Returns the tail, the total output size
    and whether the deadline passed.
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
        if proc.poll() is not None:
            kill_group(proc)
    kill_group(proc)
    proc.wait()
    # Drain what was written before the kill, without waiting on stragglers.
    while chunk := _read_ready(fd, 0):
        tail.add(chunk)
    out.close()
    return bytes(tail.data), tail.total, timed_out
