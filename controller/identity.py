"""Who this controller process is (host, boot, pid, process start), and whether the one that
wrote a token still runs: what every resource and temp folder patchbox makes is labelled
with, so that whatever a dead controller left behind can be found and removed."""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass, field
from pathlib import Path

OWNER = "io.patchbox.owner"
OWNER_VALUE = "patchbox"
JOB = "io.patchbox.job"
CONTROLLER = "io.patchbox.controller"
HOST = "io.patchbox.host"
KIND = "io.patchbox.kind"


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text(encoding="ascii").strip()
    except OSError:
        return "unknown"


@dataclass(frozen=True)
class ControllerIdentity:
    """Who started a resource: host, boot, pid and process start time.

    A controller is alive when its pid exists on this host and boot and has the same start
    time; anything labelled by a controller that is not alive is left over from a crash.
    """

    host: str = field(default_factory=socket.gethostname)
    boot: str = field(default_factory=_boot_id)
    pid: int = field(default_factory=os.getpid)
    started: str = field(default_factory=lambda: _process_start(os.getpid()))
    nonce: str = field(default_factory=lambda: uuid.uuid4().hex[:8])

    @property
    def token(self) -> str:
        return f"{self.boot}:{self.pid}:{self.started}:{self.nonce}"

    def labels(self, job_id: str, kind: str) -> dict[str, str]:
        return {
            OWNER: OWNER_VALUE,
            JOB: job_id,
            CONTROLLER: self.token,
            HOST: self.host,
            KIND: kind,
        }


def _process_start(pid: int) -> str:
    """The process start time in clock ticks since boot (field 22 of /proc/PID/stat)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii")
    except OSError:
        return "0"
    return stat.rsplit(")", 1)[1].split()[19]


def controller_alive(token: str, host: str) -> bool:
    """Whether the controller that wrote ``token`` still runs.

    Tokens from another host cannot be judged here and count as alive.
    """
    if host != socket.gethostname():
        return True
    try:
        boot, pid_s, started, _ = token.split(":")
        pid = int(pid_s)
    except ValueError:
        return False
    if boot != _boot_id():
        return False
    return _process_start(pid) == started and started != "0"


_CURRENT: ControllerIdentity | None = None


def current_identity() -> ControllerIdentity:
    """The identity of this controller process (one per process)."""
    global _CURRENT  # noqa: PLW0603 - one identity per process, made on first use
    if _CURRENT is None or _CURRENT.pid != os.getpid():
        _CURRENT = ControllerIdentity()
    return _CURRENT
