"""A spare's start still waiting for the daemon's answer when the command ends: handed to a
helper, which holds the pool key's lock until the answer comes, then removes the mount
name's folder and ends; the command itself exits at once, its output closed."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.support.locks import held

HOLDER = """\
import fcntl, os, socket, sys
from pathlib import Path
from controller.sandbox import handover
connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
connection.connect(sys.argv[1])
connection.sendall(b"POST /start\\r\\n\\r\\n")
lock = os.open(sys.argv[2], os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
folder = Path(sys.argv[3]) if sys.argv[3] else None
with handover.pending(handover.PendingStart(lock, folder), connection):
    print(handover.hand_over(timeout=float(sys.argv[4])), flush=True)
    os._exit(0)
"""


def _until(condition: object, wait: float = 20.0) -> bool:
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        if callable(condition) and condition():
            return True
        time.sleep(0.05)
    return False


class Daemon:
    """A unix socket that accepts one connection, reads the request and answers when told."""

    def __init__(self, path: Path) -> None:
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(str(path))
        self.server.listen(1)
        self.answer = threading.Event()
        self.got: bytes = b""
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        client, _ = self.server.accept()
        with client:
            self.got = client.recv(4096)
            self.answer.wait(60)
            with contextlib.suppress(OSError):  # the helper may have given up
                client.sendall(b"HTTP/1.1 204 No Content\r\n\r\n")

    def close(self) -> None:
        self.answer.set()
        self.thread.join(10)
        self.server.close()


@pytest.mark.parametrize("with_folder", [True, False])
def test_the_command_ends_at_once_and_the_helper_finishes_after_the_answer(
    tmp_path: Path, with_folder: bool
) -> None:
    daemon = Daemon(tmp_path / "d.sock")
    lock = tmp_path / "key.offer"
    folder = tmp_path / "patchbox-mount-x"
    folder.mkdir()
    (folder / "baseline.tar").write_bytes(b"tar")
    try:
        started = time.monotonic()
        argv = [sys.executable, "-c", HOLDER, str(tmp_path / "d.sock"), str(lock)]
        argv += [str(folder) if with_folder else "", "60"]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
        took = time.monotonic() - started
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "1"  # one start handed over
        # The command's output closed with it: the helper kept no copy of it open.
        assert took < 15
        assert daemon.got.startswith(b"POST /start")
        time.sleep(0.3)
        assert held(lock)  # the helper holds the key until the answer
        assert folder.exists()  # the mount name stays until the daemon answered
        daemon.answer.set()
        assert _until(lambda: not held(lock))
        if with_folder:
            assert _until(lambda: not folder.exists())
        else:
            assert folder.exists()  # not the helper's
    finally:
        daemon.close()


def test_a_helper_gives_up_after_its_timeout(tmp_path: Path) -> None:
    """A daemon that never answers: the helper ends after its time, the lock is free and
    the folder removed."""
    daemon = Daemon(tmp_path / "d.sock")
    lock = tmp_path / "key.offer"
    folder = tmp_path / "patchbox-mount-y"
    folder.mkdir()
    try:
        argv = [sys.executable, "-c", HOLDER, str(tmp_path / "d.sock"), str(lock), str(folder)]
        done = subprocess.run([*argv, "1"], capture_output=True, text=True, timeout=30, check=False)
        assert done.returncode == 0, done.stderr
        assert _until(lambda: not held(lock), wait=15)
        assert not folder.exists()
    finally:
        daemon.close()


def test_nothing_pending_starts_no_helper() -> None:
    from controller.sandbox import handover

    assert handover.hand_over() == 0
