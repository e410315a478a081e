"""``patchbox serve`` processes for the replica tests: real processes on free loopback
ports, sharing the test run's ``$PATCHBOX_HOME`` and one PostgreSQL database."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.support.cli import ROOT
from tests.support.service import TOKENS


@dataclass
class Replica:
    proc: subprocess.Popen[bytes]
    url: str

    def client(self, tenant: str = "alpha") -> httpx.Client:
        headers = {"Authorization": f"Bearer {TOKENS[tenant]}"}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30)

    def stop(self) -> None:
        """SIGTERM (the service drains), SIGKILL after 60 seconds."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


def start_replica(config: Path, log: Path, env: dict[str, str] | None = None) -> Replica:
    """``patchbox serve --config CONFIG`` on a free port, once it answers ``/healthz``
    (``env``: more of its environment, such as its ``DOCKER_HOST``)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    argv = [sys.executable, "-m", "controller", "serve", "--config", str(config)]
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [*argv, "--port", str(port)],
            cwd=ROOT,
            stdout=out,
            stderr=out,
            env={**os.environ, **(env or {})},
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            httpx.get(f"{url}/healthz", timeout=2)
            return Replica(proc, url)
        except httpx.TransportError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                msg = f"patchbox serve did not start: {log.read_text()[-2000:]}"
                raise RuntimeError(msg) from None
            time.sleep(0.1)


class EngineGate:
    """The machine's Docker daemon behind a loopback TCP port that can stop answering: a
    replica's own engine (``DOCKER_HOST=tcp://127.0.0.1:PORT``) that the test takes away
    (every connection cut, new ones refused) and gives back on the same port."""

    def __init__(self, unix_path: str = "/var/run/docker.sock") -> None:
        self.unix_path = unix_path
        self._lock = threading.Lock()
        self._open: list[socket.socket] = []
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        self.url = f"tcp://127.0.0.1:{self.port}"
        self._serve(self._server)

    def _serve(self, server: socket.socket) -> None:
        threading.Thread(target=self._accept, args=(server,), daemon=True).start()

    def _accept(self, server: socket.socket) -> None:
        while True:
            try:
                client, _ = server.accept()
            except OSError:
                return
            upstream = socket.socket(socket.AF_UNIX)
            upstream.connect(self.unix_path)
            with self._lock:
                self._open += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)

    def cut(self) -> None:
        """The engine stops answering: the listener closed, every open connection reset."""
        self._server.close()
        with self._lock:
            sockets, self._open = self._open, []
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def restore(self) -> None:
        """The engine answers again, on the same port."""
        self._server = socket.create_server(("127.0.0.1", self.port))
        self._serve(self._server)

    def close(self) -> None:
        self.cut()


def max_overlap(spans: list[tuple[float, float]]) -> int:
    """The most of ``spans`` (start, end) running at one moment."""
    edges = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    most = now = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most
