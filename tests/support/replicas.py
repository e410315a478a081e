"""``patchbox serve`` processes for the replica tests: real processes on free loopback
ports, sharing the test run's ``$PATCHBOX_HOME`` and one PostgreSQL database."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
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


def start_replica(config: Path, log: Path) -> Replica:
    """``patchbox serve --config CONFIG`` on a free port, once it answers ``/healthz``."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    argv = [sys.executable, "-m", "controller", "serve", "--config", str(config)]
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [*argv, "--port", str(port)], cwd=ROOT, stdout=out, stderr=out, env=dict(os.environ)
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
