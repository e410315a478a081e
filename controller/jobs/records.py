"""Jobs: the state machine (pure), their records on disk, and one write job per repository.

::

    created -> preparing -> running -> validating -> checking -> awaiting_review -> applied
       |           |           |           |             |    \\            \\-> discarded
       +-----------+-----------+-----------+-------------+-----+-> failed | cancelled
                                                          checking -> applied (gated auto)
    applied -> reverted

A record is rewritten atomically (temp file, fsync, rename) at every transition, so
``jobs``, ``show``, ``apply`` and ``revert`` work from a later process.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from controller.errors import ErrorCode, PatchboxError, UsageError
from controller.paths import patchbox_home
from controller.sandbox.labels import controller_alive

JobState = Literal[
    "created",
    "preparing",
    "running",
    "validating",
    "checking",
    "awaiting_review",
    "applied",
    "reverted",
    "discarded",
    "failed",
    "cancelled",
]

_ABORTABLE = frozenset({"failed", "cancelled"})
TRANSITIONS: dict[str, frozenset[str]] = {
    "created": frozenset({"preparing"}) | _ABORTABLE,
    "preparing": frozenset({"running"}) | _ABORTABLE,
    "running": frozenset({"validating"}) | _ABORTABLE,
    "validating": frozenset({"checking"}) | _ABORTABLE,
    "checking": frozenset({"awaiting_review", "applied"}) | _ABORTABLE,
    "awaiting_review": frozenset({"applied", "discarded"}),
    "applied": frozenset({"reverted"}),
    "reverted": frozenset(),
    "discarded": frozenset(),
    "failed": frozenset({"discarded"}),
    "cancelled": frozenset({"discarded"}),
}
"""Every allowed move; anything else is a bug or a user asking for the impossible."""

ACTIVE = frozenset({"created", "preparing", "running", "validating", "checking"})
"""A job in one of these states has a controller working on it."""
FINAL = frozenset({"reverted", "discarded", "failed", "cancelled"})
"""Nothing more happens to these by itself (a failed job may still be discarded)."""


class InvalidTransitionError(PatchboxError):
    """A job cannot move from its state to the one asked for (e.g. revert of a discarded
    job); the record is unchanged."""

    code = ErrorCode.USAGE_ERROR


def check_transition(current: str, new: str) -> None:
    if new not in TRANSITIONS.get(current, frozenset()):
        msg = f"a job that is {current} cannot become {new}"
        raise InvalidTransitionError(msg)


class JobRecord(BaseModel):
    """Everything a later process needs about a job. Paths of the user's machine live here
    (the job's own state), never in the evidence bundle."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    job_id: str
    repo: str
    state: JobState = "created"
    created_at: float = Field(default_factory=time.time)
    updated_at: float = Field(default_factory=time.time)
    history: list[tuple[str, float]] = Field(default_factory=list)
    task: dict[str, Any] = Field(default_factory=dict)
    mode: str = "review"
    consent: dict[str, bool] = Field(default_factory=dict)
    runtime: str = "runc"
    baseline: dict[str, Any] | None = None
    error: dict[str, str] | None = None
    diagnostics: dict[str, Any] = Field(default_factory=dict)
    tool_calls: list[dict[str, Any]] = Field(default_factory=list)
    ledger: list[dict[str, Any]] = Field(default_factory=list)
    diff_sha256: str | None = None
    files: list[dict[str, Any]] = Field(default_factory=list)
    checks: list[dict[str, Any]] = Field(default_factory=list)
    decision: dict[str, Any] = Field(default_factory=dict)
    timings_ms: dict[str, int] = Field(default_factory=dict)
    final_message: str | None = None
    controller: str = ""
    """The token of the controller running the job (see :mod:`controller.sandbox.labels`)."""
    controller_host: str = ""

    def move(self, new: JobState) -> None:
        check_transition(self.state, new)
        now = time.time()
        self.state = new
        self.updated_at = now
        self.history = [*self.history, (new, now)]


class JobStore:
    """Job records under ``$PATCHBOX_HOME/jobs/<id>/``: ``job.json``, the ``.patch``, the
    evidence bundle and the JUnit XML of the checks."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = root or patchbox_home() / "jobs"

    def folder(self, job_id: str) -> Path:
        if not job_id or "/" in job_id or job_id.startswith("."):
            msg = f"not a job id: {job_id[:64]!r}"
            raise UsageError(msg)
        return self.root / job_id

    def save(self, record: JobRecord) -> None:
        folder = self.folder(record.job_id)
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_atomic(folder / "job.json", record.model_dump_json(indent=2).encode())

    def load(self, job_id: str) -> JobRecord:
        path = self.folder(job_id) / "job.json"
        try:
            data = path.read_bytes()
        except FileNotFoundError as exc:
            msg = f"no job {job_id[:64]!r}"
            raise UsageError(msg) from exc
        return JobRecord.model_validate_json(data)

    def all(self, repo: str | None = None) -> list[JobRecord]:
        out = []
        if self.root.is_dir():
            for folder in self.root.iterdir():
                with contextlib.suppress(OSError, ValueError, UsageError):
                    record = self.load(folder.name)
                    if repo is None or record.repo == repo:
                        out.append(record)
        return sorted(out, key=lambda r: r.created_at)


INTERRUPTED_MESSAGE = (
    "the controller that ran this job is gone (killed or crashed); its sandboxes are removed"
)


def is_orphaned(record: JobRecord) -> bool:
    """Whether ``record`` is active but its controller is gone. A record without a
    controller token (written by an older version) is judged by its repository's write
    lock: free means nobody works on it."""
    if record.state not in ACTIVE:
        return False
    if record.controller:
        return not controller_alive(record.controller, record.controller_host)
    try:
        with write_lock(record.repo):
            return True
    except PatchboxError:
        return False


def mark_interrupted(store: JobStore, record: JobRecord) -> JobRecord:
    """Ends an orphaned job ``failed`` with ``INTERRUPTED`` (a no-op for any other job).
    Safe to race with another process doing the same."""
    if not is_orphaned(record):
        return record
    record.error = {"code": str(ErrorCode.INTERRUPTED), "message": INTERRUPTED_MESSAGE}
    record.move("failed")
    store.save(record)
    return record


def write_atomic(path: Path, data: bytes) -> None:
    """Temp file in the same folder, fsync, rename, fsync of the folder."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    with tmp.open("wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
    tmp.replace(path)
    fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def repo_key(repo: str) -> str:
    return hashlib.sha256(repo.encode()).hexdigest()[:24]


@contextlib.contextmanager
def write_lock(repo: str, root: Path | None = None) -> Iterator[None]:
    """Held for the whole of a write job on ``repo``: a second one gets
    ``JOB_ALREADY_RUNNING`` at once (no queue). The kernel drops the lock if the process
    dies, so a crash never leaves a repository locked."""
    folder = root or patchbox_home() / "locks"
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    with (folder / f"{repo_key(repo)}.lock").open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            msg = "another job is already running on this repository"
            raise PatchboxError(msg, code=ErrorCode.JOB_ALREADY_RUNNING) from exc
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def dumps(data: object) -> str:
    return json.dumps(data, indent=2, sort_keys=True, default=str)
