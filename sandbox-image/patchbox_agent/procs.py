"""The agent's child processes, and reaping of orphans when the agent is the container's init.

As pid 1 the agent inherits every orphan of the processes it starts (a test suite's
daemons, a double fork), and must reap them, or their zombies fill the pids limit. It must
never reap one of its own children, though: that child's ``Popen.wait`` would then see
ECHILD, and the subprocess module reports that as exit status 0, so a failing check would
pass. So every child the agent starts goes through :func:`popen`, which records its pid
under a lock, and :func:`reap_orphans` reaps, under the same lock, only zombies whose pid
is not a recorded child still waiting for its ``Popen``.

The agent is one process (no forked reaper: under gVisor a forked copy of the interpreter
costs about 7 MB). The reaping runs in the agent's main thread, woken through the signal
wakeup descriptor that :func:`install_reaper` sets up for SIGCHLD, and at the end of each
``run``.
"""

from __future__ import annotations

import os
import weakref
from _thread import allocate_lock

TYPE_CHECKING = False
if TYPE_CHECKING:
    import subprocess
    from collections.abc import Callable, Sequence
    from typing import Any

_lock = allocate_lock()
_installed: list[bool] = []
_ours: weakref.WeakValueDictionary[int, subprocess.Popen[bytes]] = weakref.WeakValueDictionary()


def popen(argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[bytes]:
    """``subprocess.Popen``, with the child recorded before any reaping can look at it."""
    import subprocess  # imported on first use: a faster start

    with _lock:
        proc: subprocess.Popen[bytes] = subprocess.Popen(argv, **kwargs)
        _ours[proc.pid] = proc
    return proc


def run(
    argv: Sequence[str],
    *,
    input: bytes | None = None,  # noqa: A002 - the name subprocess.run uses
    timeout: float | None = None,
    check: bool = False,
    **kwargs: Any,
) -> subprocess.CompletedProcess[bytes]:
    """``subprocess.run`` (output captured) on top of :func:`popen`."""
    import subprocess

    kwargs.setdefault("stdout", subprocess.PIPE)
    kwargs.setdefault("stderr", subprocess.PIPE)
    if input is not None:
        kwargs["stdin"] = subprocess.PIPE
    with popen(argv, **kwargs) as proc:
        try:
            out, err = proc.communicate(input, timeout=timeout)
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        code = proc.returncode
    if check and code:
        raise subprocess.CalledProcessError(code, list(argv), out, err)
    return subprocess.CompletedProcess(list(argv), code, out, err)


def _zombie_children(me: int) -> list[int]:
    """Pids of this process's children that have exited and wait to be reaped."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 1 and fields[0] == b"Z" and int(fields[1]) == me:
            found.append(int(name))
    return found


def reap_orphans() -> None:
    """Reaps every zombie child that is not a child of :func:`popen` still to be waited for."""
    if not _installed:
        return  # not the container's init: orphans go elsewhere
    with _lock:
        for pid in _zombie_children(os.getpid()):
            proc = _ours.get(pid)
            if proc is not None and proc.returncode is None:
                continue  # its Popen reaps it and reads its status
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass


def install_reaper() -> tuple[int, Callable[[], None]]:
    """Has SIGCHLD write to a pipe. Returns the pipe's read end, which becomes readable when
    a child may have exited, and what to call then. Call from the main thread."""
    if TYPE_CHECKING:
        import signal as _signal
    else:
        import _signal  # the C module behind signal, without its enums

    read_fd, write_fd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    _signal.signal(_signal.SIGCHLD, lambda *_: None)
    _signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    _installed.append(True)

    def on_wake() -> None:
        try:
            while os.read(read_fd, 4096):
                pass
        except BlockingIOError:
            pass
        reap_orphans()

    return read_fd, on_wake
