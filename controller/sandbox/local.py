"""A sandbox that runs the agent as a plain host process: NO isolation.

It speaks the same protocol over pipes, so the agent's tool semantics and the
controller's session logic can be tested in milliseconds without Docker. Never use it for
untrusted repositories.
"""

from __future__ import annotations

import os
import select
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

from controller.errors import SandboxError
from controller.paths import sandbox_image_dir
from controller.sandbox.base import HelloResult
from controller.sandbox.calls import DEFAULT_CALL_TIMEOUT, AgentCalls
from controller.sandbox.protocol import CallArgs
from controller.sandbox.session import AgentSession


class PipeChannel:
    """stdin/stdout pipes of a local agent process."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdin is not None  # noqa: S101 - Popen contract with PIPE
        assert proc.stdout is not None  # noqa: S101 - Popen contract with PIPE
        self._proc = proc
        self._in = proc.stdin
        self._out = proc.stdout.fileno()

    def sendall(self, data: bytes) -> None:
        self._in.write(data)
        self._in.flush()

    def recv(self, timeout: float) -> bytes:
        ready, _, _ = select.select([self._out], [], [], max(timeout, 0))
        if not ready:
            raise TimeoutError
        return os.read(self._out, 1 << 18)

    def stderr_tail(self) -> str:
        return ""

    def close(self) -> None:
        try:
            self._in.close()
        except OSError:
            pass
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        if self._proc.stdout is not None:
            self._proc.stdout.close()


class LocalSandbox(AgentCalls):
    """The agent in a host subprocess, serving ``workspace`` (tests and development only)."""

    def __init__(
        self,
        workspace: Path,
        timeout: float = 30.0,
        env: dict[str, str] | None = None,
        protected: tuple[str, ...] = (),
    ) -> None:
        self.workspace = workspace
        self._tmp = tempfile.mkdtemp(prefix="patchbox-local-")
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-B", str(sandbox_image_dir() / "agent.py")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env={
                "PATCHBOX_WORKSPACE": str(workspace),
                "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                "TMPDIR": self._tmp,
                **(env or {}),
            },
        )
        self.channel = PipeChannel(self.proc)
        self.session = AgentSession(self.channel)
        try:
            self._hello = self.session.hello(timeout, protected)
        except BaseException:
            self.close()
            raise

    @property
    def hello(self) -> HelloResult:
        return self._hello

    def _call(
        self,
        op: str,
        args: CallArgs,
        timeout: float = DEFAULT_CALL_TIMEOUT,
        binary: bytes | Iterable[bytes] | None = None,
    ) -> dict[str, object]:
        return self.session.call(op, args, timeout, binary)

    def close(self) -> None:
        try:
            self.channel.close()
        except SandboxError:
            pass
        shutil.rmtree(self._tmp, ignore_errors=True)
