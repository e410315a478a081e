"""The user's work tree, reached only through folder descriptors.

Every folder is opened with ``O_NOFOLLOW``, relative to its parent's descriptor (kept open
while the tree is): a symlink anywhere in a path makes it ``other``, never followed. Files
are read to a SHA-256 (with their mode), and new contents go to temp files beside their
targets, written and flushed by a few threads at once, then renamed over them. No git
command runs here and the index is never opened.
"""

from __future__ import annotations

import hashlib
import os
import stat
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Self

from controller.changes.journal import Side

if TYPE_CHECKING:
    from controller.repo.pin import RepoPin

IO_THREADS = 8
"""Threads that write and flush files at once (their flushes share the disk's commits);
started once per process and kept (starting them per call cost more than the writes)."""

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_READ_CHUNK = 1 << 24
_TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True)
class FileState:
    """What a path holds: nothing, a regular file (its SHA-256 and mode, with its bytes when
    asked for), or something else (a folder, a symlink, a device, unreadable)."""

    kind: Literal["missing", "file", "other"]
    sha256: str | None = None
    mode: int = 0
    data: bytes | None = None

    def matches(self, side: Side | None) -> bool:
        """Same content and executable bit, or both absent."""
        if side is None:
            return self.kind == "missing"
        return (
            self.kind == "file"
            and self.sha256 == side.sha256
            and bool(self.mode & 0o111) == bool(side.mode & 0o111)
        )


class FolderReplacedError(Exception):
    """The work tree's top is not the folder an operation recorded: moved, replaced, or a
    link put in its place. Nothing was read or written through it."""


class WorkTree:
    """A work tree reached through folder descriptors opened with ``O_NOFOLLOW``: a
    symlink anywhere in a path makes it ``other``, never followed. Close it (context
    manager) to release the descriptors.

    With ``pin`` (a service job's repository) the top itself is opened by the pin's walk
    from its root, no link followed, and must be the folder pinned (``REPO_NOT_ALLOWED``
    otherwise): every read and write is then relative to that folder, wherever its path
    leads later. With ``identity`` (the top's device and inode, as an apply recorded them)
    the top must be that folder (:class:`FolderReplacedError` otherwise).
    """

    def __init__(
        self,
        top: Path,
        *,
        pin: RepoPin | None = None,
        identity: tuple[int, int] | None = None,
    ) -> None:
        if pin is not None:
            self._root = pin.open_top(top)
        else:
            self._root = os.open(top, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self._fds: dict[str, int] = {"": self._root}
        if identity is not None and self.identity() != identity:
            self.close()
            raise FolderReplacedError(str(top))

    def identity(self) -> tuple[int, int]:
        """The top folder's device and inode: what an operation records, so that whatever
        finishes or undoes it later writes that folder or nothing."""
        info = os.fstat(self._root)
        return info.st_dev, info.st_ino

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def _folder(self, folder: str, *, create: bool = False) -> int:
        fd = self._fds.get(folder)
        if fd is not None:
            return fd
        parent, _, name = folder.rpartition("/")
        parent_fd = self._folder(parent, create=create)
        try:
            fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
        except FileNotFoundError:
            if not create:
                raise
            os.mkdir(name, 0o777, dir_fd=parent_fd)
            fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
        self._fds[folder] = fd
        return fd

    def folder_kind(self, folder: str) -> Literal["missing", "folder", "other"]:
        try:
            self._folder(folder)
        except FileNotFoundError:
            return "missing"
        except OSError:
            return "other"
        return "folder"

    def state(self, path: str, *, with_data: bool = False) -> FileState:
        folder, _, name = path.rpartition("/")
        try:
            fd = os.open(name, _READ_FLAGS, dir_fd=self._folder(folder))
        except FileNotFoundError:
            return FileState("missing")
        except OSError:
            return FileState("other")
        digest, chunks = hashlib.sha256(), []
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return FileState("other")
            while chunk := os.read(fd, min(max(st.st_size + 1, 1 << 16), _READ_CHUNK)):
                digest.update(chunk)
                if with_data:
                    chunks.append(chunk)
        except OSError:
            return FileState("other")
        finally:
            os.close(fd)
        data = b"".join(chunks) if with_data else None
        return FileState("file", digest.hexdigest(), stat.S_IMODE(st.st_mode), data)

    def write_temps(self, items: Sequence[tuple[str, str, bytes, int]]) -> None:
        """Writes each ``(path, temp name, content, mode)`` to the temp file beside ``path``
        (created exclusively, never through a symlink) and flushes it to disk; the files
        are written by a few threads at once, so their flushes share disk commits."""
        folders = [self._folder(path.rpartition("/")[0], create=True) for path, *_ in items]
        jobs = [
            (fd, temp, data, mode) for fd, (_, temp, data, mode) in zip(folders, items, strict=True)
        ]
        _in_threads(_write_temp, jobs)

    def sync_folders(self, folders: Iterable[str]) -> None:
        """Flushes the entries of these folders (renames, removals) to disk; folders that
        are gone are skipped."""
        fds = []
        for folder in set(folders):
            try:
                fds.append(self._folder(folder))
            except OSError:
                continue
        _in_threads(os.fsync, fds)

    def replace(self, path: str, temp: str) -> None:
        folder, _, name = path.rpartition("/")
        fd = self._folder(folder)
        os.rename(temp, name, src_dir_fd=fd, dst_dir_fd=fd)

    def remove(self, path: str) -> None:
        folder, _, name = path.rpartition("/")
        try:
            os.unlink(name, dir_fd=self._folder(folder))
        except FileNotFoundError:
            pass

    def remove_temp(self, path: str, temp: str) -> None:
        try:
            os.unlink(temp, dir_fd=self._folder(path.rpartition("/")[0]))
        except OSError:
            pass

    def make_folders(self, folders: Sequence[str]) -> None:
        for folder in folders:
            self._folder(folder, create=True)

    def remove_empty_folders(self, folders: Sequence[str]) -> None:
        """Removes those of ``folders`` that are empty, deepest first."""
        for folder in sorted(folders, key=lambda f: f.count("/"), reverse=True):
            parent, _, name = folder.rpartition("/")
            fd = self._fds.pop(folder, None)
            if fd is not None:
                os.close(fd)
            try:
                os.rmdir(name, dir_fd=self._folder(parent))
            except OSError:
                pass


def _write_temp(folder_fd: int, temp: str, data: bytes, mode: int) -> None:
    fd = os.open(temp, _TEMP_FLAGS, 0o600, dir_fd=folder_fd)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fchmod(fd, mode)
        os.fdatasync(fd)
    finally:
        os.close(fd)


_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _io_pool() -> ThreadPoolExecutor:
    """The process's I/O threads, started when first needed."""
    global _pool  # noqa: PLW0603 - one pool per process
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=IO_THREADS, thread_name_prefix="patchbox-io")
        return _pool


def _forget_pool() -> None:
    """In a forked child: the parent's threads are not there, nor is its lock's holder."""
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_pool)


def _in_threads(fn: Callable[..., object], jobs: Sequence[Any]) -> None:
    """Runs ``fn`` on every job (a tuple of arguments, or one argument) on up to
    ``IO_THREADS`` threads; the first error is raised after all have run."""
    calls = [job if isinstance(job, tuple) else (job,) for job in jobs]
    if len(calls) <= 1:
        for args in calls:
            fn(*args)
        return
    futures = [_io_pool().submit(fn, *args) for args in calls]
    wait(futures)
    for future in futures:
        future.result()
