"""Job records on disk: each job's folder and append-only log under the state folder (its
id, a unique prefix or ``last`` found), the write lock one job per repository holds, and a
dead controller's job marked interrupted.

A record is appended to its job's log (:mod:`controller.jobs.log`) at every transition,
durably, so ``jobs``, ``show``, ``apply`` and ``revert`` work from a later process.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import re
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

from controller.errorinfo import ErrorInfo
from controller.errors import ErrorCode, PatchboxError, UsageError
from controller.jobs.log import RecordLog, Saved
from controller.jobs.records import ACTIVE, JobRecord
from controller.paths import patchbox_home
from controller.sandbox.labels import controller_alive

LOGGED = (
    "history",
    "tool_calls",
    "transcript",
    "ledger",
    "files",
    "control_characters",
    "checks",
)
"""The record's lists, appended to its log item by item (:mod:`controller.jobs.log`)."""

RECORDS = RecordLog(JobRecord, LOGGED)
LEGACY_FILE = "job.json"
"""A record of format 1, written whole at every save before the log: read, and replaced by
the log at its next save."""


ATTESTATIONS = "provenance.intoto.jsonl"
"""A job's signed attestations, in its folder (:mod:`controller.jobs.attest`)."""

LAST = "last"
"""The job id that names the job of a state folder created last."""
AMBIGUOUS_SHOWN = 10
"""The candidates an ambiguous id prefix names."""
CANCEL_REQUEST = "cancel.request"
"""A file in a job's folder asking its controller to cancel it."""


UNSAVED_WAIT = 30.0
"""Seconds a reader waits at most for a turn's save this process has yet to write."""


class _Unsaved:
    """The job folders whose last turn this process has yet to save (:meth:`JobStore.turn_saver`):
    a reader in this process waits for that save, so it sees every call that returned."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[Path, threading.Event] = {}

    def hold(self, folder: Path) -> threading.Event:
        event = threading.Event()
        with self._lock:
            self._held[folder] = event
        return event

    def release(self, folder: Path, event: threading.Event) -> None:
        event.set()
        with self._lock:
            if self._held.get(folder) is event:
                del self._held[folder]

    def wait(self, folder: Path) -> None:
        with self._lock:
            event = self._held.get(folder)
        if event is not None:
            event.wait(UNSAVED_WAIT)


_UNSAVED = _Unsaved()


class JobStore:
    """Job records under ``$PATCHBOX_HOME/jobs/<id>/``: ``log.jsonl``
    (:mod:`controller.jobs.log`), the ``.patch``, the evidence bundle and the JUnit XML of
    the checks."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = root or patchbox_home() / "jobs"

    def folder(self, job_id: str) -> Path:
        if not job_id or "/" in job_id or job_id.startswith("."):
            msg = f"not a job id: {job_id[:64]!r}"
            raise UsageError(msg)
        return self.root / job_id

    def save(self, record: JobRecord, *, durable: bool = True) -> Saved:
        """Appends what the record has new since this process last loaded or saved it to
        its log, as one save: a reader sees the record of one save or of the next, never a
        mix. ``durable=False`` skips the fsyncs (as the tool loop's save after each turn,
        :meth:`save_turn`): a killed process loses nothing (the page cache has it), a
        machine that loses power may come back with the record of an earlier turn; every
        state change is written durably. A record read from a ``job.json`` goes whole into
        the log at its first save, and the ``job.json`` is removed."""
        folder = self.folder(record.job_id)
        if RECORDS.knows(record, folder):
            with contextlib.suppress(FileNotFoundError):  # else its folder went: made again
                return RECORDS.write(folder, record, durable=durable)
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        saved = RECORDS.write(folder, record, durable=durable)
        (folder / LEGACY_FILE).unlink(missing_ok=True)
        return saved

    def save_turn(self, record: JobRecord) -> Saved:
        """The tool loop's save after each turn, which changes only the record's lists (its
        tool calls, transcript and ledger): their new entries appended, not fsynced, as
        ``save(record, durable=False)`` would, without looking at the other fields."""
        folder = self.folder(record.job_id)
        if RECORDS.knows(record, folder):
            with contextlib.suppress(FileNotFoundError):
                return RECORDS.write(folder, record, durable=False, fields=False)
        return self.save(record, durable=False)

    def turn_saver(self, record: JobRecord) -> Callable[[], Saved]:
        """:meth:`save_turn` of ``record``, to be run a moment later by another thread (a
        session's job thread saves a turn while its result goes back to the caller); it
        writes what the record holds then. Until it ran, :meth:`load` of the job in this
        process waits for it."""
        folder = self.folder(record.job_id)
        event = _UNSAVED.hold(folder)

        def save() -> Saved:
            try:
                return self.save_turn(record)
            finally:
                _UNSAVED.release(folder, event)

        return save

    def load(self, job_id: str) -> JobRecord:
        """The job's record as its last save left it: from its log, or from the
        ``job.json`` of a job saved before the log (``USAGE_ERROR`` for an unknown id, or a
        record of a format this version does not read)."""
        folder = self.folder(job_id)
        _UNSAVED.wait(folder)
        record = RECORDS.read(folder)
        if record is not None:
            return record
        try:
            data = (folder / LEGACY_FILE).read_bytes()
        except FileNotFoundError as exc:
            msg = f"no job {job_id[:64]!r} in {self.root}"
            raise UsageError(msg) from exc
        return JobRecord.model_validate_json(data)

    def resolve(self, ref: str) -> str:
        """The id of the job ``ref`` names: a whole id, a prefix only one job's id starts
        with, or ``last`` (the job of this state folder created last). ``USAGE_ERROR``
        naming the state folder when none matches, and listing the candidates when a
        prefix is ambiguous."""
        if ref == LAST:
            records = self.all()
            if not records:
                msg = f"no job in {self.root}: 'last' names the newest job there"
                raise UsageError(msg)
            return records[-1].job_id
        self.folder(ref)  # a name that can be an id at all
        names = self._names()
        if ref in names:
            return ref
        candidates = sorted(n for n in names if n.startswith(ref))
        if not candidates:
            msg = f"no job {ref[:64]!r} in {self.root}"
            raise UsageError(msg)
        if len(candidates) > 1:
            shown = ", ".join(candidates[:AMBIGUOUS_SHOWN])
            more = len(candidates) - AMBIGUOUS_SHOWN
            rest = f" and {more} more" if more > 0 else ""
            msg = (
                f"{ref[:64]!r} is the start of {len(candidates)} job ids: {shown}{rest}; "
                "give more of the id"
            )
            raise UsageError(msg)
        return candidates[0]

    def _names(self) -> set[str]:
        """The names of the job folders (each a job id)."""
        try:
            return {
                entry.name
                for entry in self.root.iterdir()
                if not entry.name.startswith(".") and entry.is_dir()
            }
        except FileNotFoundError:
            return set()

    def request_cancel(self, job_id: str) -> None:
        """Asks the controller running the job to cancel it: a file in the job's folder that
        its engine watches (:data:`CANCEL_REQUEST`), whichever process or host runs it."""
        path = self.folder(job_id) / CANCEL_REQUEST
        with contextlib.suppress(FileExistsError):
            path.touch(mode=0o600, exist_ok=False)

    def cancel_requested(self, job_id: str) -> bool:
        """Whether :meth:`request_cancel` asked for the job's end."""
        return (self.folder(job_id) / CANCEL_REQUEST).exists()

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
    return end_interrupted(store, record)


def end_interrupted(store: JobStore, record: JobRecord) -> JobRecord:
    """Ends an active job ``failed`` with ``INTERRUPTED``, whoever ran it (the caller knows
    it is gone: :func:`mark_interrupted`, or a service replica that took its job over)."""
    record.error = ErrorInfo(code=str(ErrorCode.INTERRUPTED), message=INTERRUPTED_MESSAGE)
    record.move("failed")
    store.save(record)
    return record


def repo_key(repo: str) -> str:
    return hashlib.sha256(repo.encode()).hexdigest()[:24]


_HOLDER = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
"""What a lock file may name as its holder: a job id."""


def lock_holder(handle: IO[bytes]) -> str | None:
    """The job id a repository's lock file names (its holder's), if it names one."""
    with contextlib.suppress(OSError):
        handle.seek(0)
        text = handle.read(256).decode("ascii", "replace").strip()
        if _HOLDER.fullmatch(text):
            return text
    return None


def already_running(holder: str | None) -> PatchboxError:
    """``JOB_ALREADY_RUNNING``, naming the job that holds the repository when it is known:
    the one message every front door shows for a repository another job writes."""
    if holder:
        msg = f"another job is already running on this repository: job {holder} holds it"
    else:
        msg = "another job is already running on this repository"
    return PatchboxError(msg, code=ErrorCode.JOB_ALREADY_RUNNING)


@contextlib.contextmanager
def write_lock(repo: str, root: Path | None = None, *, holder: str = "") -> Iterator[None]:
    """Held for the whole of a write job on ``repo``: a second one gets
    ``JOB_ALREADY_RUNNING`` at once (no queue), naming ``holder`` (the job id of the one
    that holds it) when it gave one. The kernel drops the lock if the process dies, so a
    crash never leaves a repository locked."""
    folder = root or patchbox_home() / "locks"
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    with (folder / f"{repo_key(repo)}.lock").open("a+b") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            raise already_running(lock_holder(handle)) from exc
        try:
            with contextlib.suppress(OSError):  # the name is a courtesy, the lock the rule
                handle.truncate(0)
                handle.write(holder.encode("ascii", "replace"))
                handle.flush()
            yield
        finally:
            with contextlib.suppress(OSError):
                handle.truncate(0)
            fcntl.flock(handle, fcntl.LOCK_UN)


def dumps(data: object) -> str:
    return json.dumps(data, indent=2, sort_keys=True, default=str)
