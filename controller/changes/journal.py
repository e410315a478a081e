"""The write-ahead journal of apply and revert, under ``$PATCHBOX_HOME/journal``.

One folder per job::

    journal/<job_id>/record        what the apply does: every touched path with its content
                                   and mode before and after (written to record.tmp, fsync'd,
                                   renamed, folder fsync'd: it exists whole or not at all)
    journal/<job_id>/apply.done    the apply finished (its files and folders flushed first)
    journal/<job_id>/apply.undone  an interrupted apply was rolled back
    journal/<job_id>/revert.begin  a revert started
    journal/<job_id>/revert.done   the revert finished
    journal/.locks/<key>           flocks: one per job, one per work tree

The markers give the :data:`Phase` of a job; :mod:`controller.changes.apply` acts on it. Every
marker is created or removed durably (the folder is fsync'd) before the next step.

Fault injection: :func:`fault_point` is called after every durable step; when the
environment variable ``PATCHBOX_FAULT_POINT`` names that step the process kills itself with
SIGKILL, so tests can stop a real process at each step (``STEP:stop`` stops it with SIGSTOP
instead, its locks held, for a test to look at it and then kill it).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import secrets
import shutil
import signal
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from controller.errors import JournalCorruptError, UsageError
from controller.paths import patchbox_home

FAULT_ENV = "PATCHBOX_FAULT_POINT"
MAGIC = b"patchbox-journal 1\n"
_JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")

Phase = Literal["none", "applying", "applied", "rolled_back", "reverting", "reverted"]
"""``none``: no record. ``applying``/``reverting``: interrupted (or running).
``rolled_back``: an interrupted apply was undone. ``reverted``: applied, then reverted."""

Marker = Literal["apply.done", "apply.undone", "revert.begin", "revert.done"]


def fault_point(step: str) -> None:
    """Test hook: SIGKILL this process when ``$PATCHBOX_FAULT_POINT`` names ``step``
    (SIGSTOP for ``step:stop``)."""
    wanted, _, action = os.environ.get(FAULT_ENV, "").partition(":")
    if wanted == step:
        os.kill(os.getpid(), signal.SIGSTOP if action == "stop" else signal.SIGKILL)


class Side(BaseModel):
    """A file's content (by hash and size) and its permission bits (``st_mode & 0o7777``)."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    sha256: str
    size: int
    mode: int


class PathRecord(BaseModel):
    """One touched path; ``None`` is an absent file."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    path: str
    before: Side | None
    after: Side | None
    merged: bool = False


class ApplyRecord(BaseModel):
    """Everything an apply will do, written before the work tree is touched."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    version: Literal[1] = 1
    job_id: str
    repo: str
    head: str
    baseline_tree: str
    diff_sha256: str
    nonce: str
    """Makes the names of this record's temp files unique."""
    paths: list[PathRecord]
    created_dirs: list[str]
    """Folders the apply creates (parents first); removed again when empty on the way back."""
    contents_sha256: str
    top_dev: int | None = None
    top_ino: int | None = None
    """The work tree's top folder (device and inode) the apply wrote: a revert or a
    recovery writes that folder or nothing (absent in records of older versions)."""

    @property
    def top(self) -> tuple[int, int] | None:
        if self.top_dev is None or self.top_ino is None:
            return None
        return self.top_dev, self.top_ino


@dataclass(frozen=True)
class Recorded:
    """A record with its contents: ``before[i]``/``after[i]`` belong to ``record.paths[i]``."""

    record: ApplyRecord
    before: list[bytes | None]
    after: list[bytes | None]


def new_nonce() -> str:
    return secrets.token_hex(6)


def check_job_id(job_id: str) -> str:
    if not _JOB_ID.match(job_id):
        raise UsageError(f"not a valid job id: {job_id[:64]!r}")
    return job_id


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_durably(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


class Journal:
    """The journal folder (default ``$PATCHBOX_HOME/journal``, created 0700)."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = root if root is not None else patchbox_home() / "journal"
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)

    def job_dir(self, job_id: str) -> Path:
        return self.root / check_job_id(job_id)

    def jobs(self) -> list[str]:
        """Every job with a folder in the journal, sorted."""
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and _JOB_ID.match(p.name))

    @contextlib.contextmanager
    def locked(self, what: str) -> Iterator[None]:
        """An exclusive lock named ``what`` (``job:<id>`` for a job's record, ``repo:<top>``
        for writing to a work tree); blocks until free, and a killed holder releases it.
        Take a job's lock before its repository's."""
        locks = self.root / ".locks"
        locks.mkdir(mode=0o700, exist_ok=True)
        key = hashlib.sha256(what.encode("utf-8", "surrogateescape")).hexdigest()[:32]
        with (locks / key).open("a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def phase(self, job_id: str) -> Phase:
        folder = self.job_dir(job_id)
        if not (folder / "record").is_file():
            return "none"
        if (folder / "apply.undone").exists():
            return "rolled_back"
        if not (folder / "apply.done").exists():
            return "applying"
        if (folder / "revert.done").exists():
            return "reverted"
        if (folder / "revert.begin").exists():
            return "reverting"
        return "applied"

    def write_record(
        self,
        record: ApplyRecord,
        before: Sequence[bytes | None],
        after: Sequence[bytes | None],
    ) -> None:
        """Writes the record durably (steps ``apply.record.tmp`` then ``apply.record``).
        ``record.contents_sha256`` must be :func:`contents_digest` of the contents."""
        folder = self.job_dir(record.job_id)
        created = not folder.exists()
        folder.mkdir(mode=0o700, exist_ok=True)
        if created:
            _fsync_dir(self.root)
        header = record.model_dump_json().encode("utf-8", "surrogateescape")
        tmp = folder / "record.tmp"
        _write_durably(tmp, b"".join([MAGIC, header, b"\n", *_blobs(before, after)]))
        fault_point("apply.record.tmp")
        tmp.replace(folder / "record")
        _fsync_dir(folder)
        fault_point("apply.record")

    def read_record(self, job_id: str) -> Recorded:
        """The record of a job, its contents checked against their hashes. Raises
        ``FileNotFoundError`` when there is none and :class:`JournalCorruptError`."""
        data = (self.job_dir(job_id) / "record").read_bytes()
        if not data.startswith(MAGIC):
            raise JournalCorruptError(f"journal record of {job_id} has no header")
        end = data.find(b"\n", len(MAGIC))
        try:
            record = ApplyRecord.model_validate(json.loads(data[len(MAGIC) : end]))
        except (ValueError, ValidationError) as exc:
            raise JournalCorruptError(f"journal record of {job_id} is unreadable") from exc
        body = memoryview(data)[end + 1 :]
        if hashlib.sha256(body).hexdigest() != record.contents_sha256:
            raise JournalCorruptError(f"journal record of {job_id} fails its checksum")
        before: list[bytes | None] = []
        after: list[bytes | None] = []
        pos = 0
        for entry in record.paths:
            for side, out in ((entry.before, before), (entry.after, after)):
                if side is None:
                    out.append(None)
                    continue
                blob = bytes(body[pos : pos + side.size])
                pos += side.size
                if hashlib.sha256(blob).hexdigest() != side.sha256:
                    raise JournalCorruptError(f"journal record of {job_id}: a content differs")
                out.append(blob)
        return Recorded(record=record, before=before, after=after)

    def mark(self, job_id: str, marker: Marker) -> None:
        """Creates a marker durably."""
        folder = self.job_dir(job_id)
        fd = os.open(folder / marker, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
        os.close(fd)
        _fsync_dir(folder)

    def unmark(self, job_id: str, marker: Marker) -> None:
        """Removes a marker durably."""
        folder = self.job_dir(job_id)
        with contextlib.suppress(FileNotFoundError):
            (folder / marker).unlink()
        _fsync_dir(folder)

    def discard(self, job_id: str) -> None:
        """Removes a job's folder (only for a job that is not applied)."""
        folder = self.job_dir(job_id)
        if not folder.exists():
            return
        trash = self.root / f".trash-{new_nonce()}"
        folder.rename(trash)
        _fsync_dir(self.root)
        shutil.rmtree(trash, ignore_errors=True)


def _blobs(before: Sequence[bytes | None], after: Sequence[bytes | None]) -> list[bytes]:
    out: list[bytes] = []
    for b, a in zip(before, after, strict=True):
        if b is not None:
            out.append(b)
        if a is not None:
            out.append(a)
    return out


def contents_digest(before: Sequence[bytes | None], after: Sequence[bytes | None]) -> str:
    """The ``contents_sha256`` of a record with these contents."""
    digest = hashlib.sha256()
    for blob in _blobs(before, after):
        digest.update(blob)
    return digest.hexdigest()
