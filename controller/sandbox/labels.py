"""Labels on every Docker resource patchbox creates, so a reaper can find them all."""

from __future__ import annotations

import hashlib
import os
import socket
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from controller.paths import patchbox_home

OWNER = "io.patchbox.owner"
OWNER_VALUE = "patchbox"
JOB = "io.patchbox.job"
CONTROLLER = "io.patchbox.controller"
HOST = "io.patchbox.host"
KIND = "io.patchbox.kind"
RECIPE = "io.patchbox.recipe"
HOME = "io.patchbox.home"
"""Which state directory (``$PATCHBOX_HOME``) a spare belongs to: only that home uses it."""

OWNER_FILTER = f"{OWNER}={OWNER_VALUE}"


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


def home_id(home: Path | None = None) -> str:
    """A short, path-free name of a state directory, for the ``HOME`` label."""
    where = str((home or patchbox_home()).resolve())
    return hashlib.sha256(where.encode("utf-8", "surrogateescape")).hexdigest()[:16]


def labels_of(container: object) -> dict[str, str]:
    """The labels of a container from a sparse listing or a full inspection alike."""
    attrs = getattr(container, "attrs", {}) or {}
    found = attrs.get("Labels")
    if found is None:
        found = (attrs.get("Config") or {}).get("Labels")
    return dict(found or {})


def status_of(container: object) -> str:
    """``running``, ``exited``, ... from a sparse listing or a full inspection alike."""
    state = (getattr(container, "attrs", {}) or {}).get("State")
    if isinstance(state, dict):
        return str(state.get("Status", ""))
    return str(state or "")


def new_job_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:8]


_CURRENT: ControllerIdentity | None = None


def current_identity() -> ControllerIdentity:
    """The identity of this controller process (one per process)."""
    global _CURRENT  # noqa: PLW0603 - one identity per process, made on first use
    if _CURRENT is None or _CURRENT.pid != os.getpid():
        _CURRENT = ControllerIdentity()
    return _CURRENT
