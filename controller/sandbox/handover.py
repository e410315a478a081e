"""Spare starts this process sent that the daemon has not answered yet, handed to a helper
process when this one ends, so that a command need not wait for them.

A spare's start is sent on a connection of its own
(:func:`~controller.sandbox.dockerclient.request_start`); the daemon carries it out whether
or not the sender is still there. Two things still wait for the answer: the folder holding
the archive's mount name (:func:`~controller.sandbox.cache.mount_alias`) is removed once the
container has mounted it, and the pool key's lock stays held until the spare is running, so
that the next job on the same baseline does not start a second one. :func:`hand_over` gives
both to a small process of their own (the standard library only, no output, a session of its
own), which reads the answer, removes the folder and ends; the command exits meanwhile."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

HELPER = """\
import shutil, socket, sys
connection = socket.socket(fileno=int(sys.argv[1]))
connection.settimeout(float(sys.argv[3]))
try:
    while connection.recv(65536):
        pass
except OSError:
    pass
if sys.argv[2]:
    shutil.rmtree(sys.argv[2], ignore_errors=True)
"""
"""The helper: reads the daemon's answer to the end, removes the folder, and ends (the lock
is released with it)."""

ANSWER_TIMEOUT = 120.0
"""Seconds the helper waits for the daemon's answer at most."""


@dataclass(frozen=True, eq=False)
class PendingStart:
    """What waits for a spare's start: the pool key's lock (a descriptor) and the folder of
    the archive's mount name (None when the spare has no archive)."""

    lock: int
    folder: Path | None


_pending: dict[int, tuple[PendingStart, socket.socket]] = {}
_guard = threading.Lock()
_helpers: list[subprocess.Popen[bytes]] = []
"""The helpers started, kept so that none is reaped as garbage while it runs."""


@contextlib.contextmanager
def pending(start: PendingStart, connection: socket.socket) -> Iterator[None]:
    """Registers ``start`` (and the connection its answer comes on) while the caller waits
    for the answer; a :func:`hand_over` meanwhile takes it."""
    with _guard:
        _pending[id(start)] = (start, connection)
    try:
        yield
    finally:
        with _guard:
            _pending.pop(id(start), None)


def hand_over(timeout: float = ANSWER_TIMEOUT) -> int:
    """Starts a helper for each start still waiting for its answer, holding its connection
    and lock, so that this process may end now; returns how many. A helper that cannot be
    started leaves its folder to the reaper (which removes the temp folders of controllers
    that are gone)."""
    with _guard:
        starts = list(_pending.values())
        _pending.clear()
    for start, connection in starts:
        fd = connection.fileno()
        if fd < 0:
            continue  # answered and closed meanwhile
        folder = "" if start.folder is None else str(start.folder)
        with contextlib.suppress(OSError):
            helper = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", HELPER, str(fd), folder, str(timeout)],
                pass_fds=(fd, start.lock),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            _helpers.append(helper)
    return len(starts)
