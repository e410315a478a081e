"""Tar extraction into the workspace: the ``put_archive`` operation and the baseline preload.

GNU tar does the work where the image has it (a C extractor, several times faster than
``tarfile`` on many small files: docs/performance.md); otherwise ``tarfile`` does, with the
same rules: no absolute or ``..`` names, no write through a symlink of the archive, regular
files, folders and symlinks only. (GNU tar keeps the archive's modes less the umask; git's
archives carry 0664/0775, which both paths turn into 0644/0755. Neither restores the
archive's times.)

The operations (:mod:`patchbox_agent.ops`) import this module on first use (a faster start,
see docs/performance.md).
"""

from __future__ import annotations

import os
import stat

from . import jail, procs
from .frames import KIND_BINARY, FrameError, grow_pipe

TYPE_CHECKING = False
if TYPE_CHECKING:
    import subprocess
    import tarfile
    from typing import IO

    from .frames import FdReader


class ArchiveRefusedError(Exception):
    """The archive could not be unpacked; the message says why and may be shown as is."""


class Chunks:
    """A read-only file over the binary frames that follow a put_archive request: exactly
    ``size`` bytes, or (``size`` None) frames up to an empty one.

    Reads are served from one buffer by offset (no copy of the rest per read), so many small
    reads of a large frame stay linear."""

    def __init__(self, reader: FdReader, size: int | None) -> None:
        self._reader = reader
        self._left = size
        self._done = size == 0
        self._buf = bytearray()
        self._pos = 0
        self.total = 0

    def _more(self) -> None:
        frame = self._reader.read()
        if frame is None or frame[0] != KIND_BINARY:
            raise FrameError("archive stream broken")
        payload = frame[1]
        if self._left is None:
            if not payload:
                self._done = True
                return
        else:
            if len(payload) > self._left:
                raise FrameError("archive stream broken")
            self._left -= len(payload)
            self._done = self._left == 0
        self.total += len(payload)
        if self._pos:
            del self._buf[: self._pos]
            self._pos = 0
        self._buf += payload

    def read(self, n: int = -1) -> bytes:
        while (n < 0 or len(self._buf) - self._pos < n) and not self._done:
            self._more()
        end = len(self._buf) if n < 0 else min(len(self._buf), self._pos + n)
        out = bytes(self._buf[self._pos : end])
        self._pos = end
        return out

    def drain(self) -> None:
        while not self._done:
            self._more()
            self._buf.clear()
            self._pos = 0


class FileStream:
    """A tar source read from a file (the baseline mounted read-only into the container)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.total = 0

    def read(self, n: int = -1) -> bytes:
        data = os.read(self.fd, n if n >= 0 else 1 << 20)
        self.total += len(data)
        return data


def unpack(stream: Chunks | FileStream, workspace: str, root_fd: int) -> int:
    """Unpacks the tar ``stream`` into ``workspace`` (``root_fd`` is its descriptor); returns
    the number of entries. Raises ArchiveRefusedError for an archive the rules refuse or that
    does not fit, FrameError for a broken channel, OSError for an unreadable file. When
    this returns, ``stream.total`` is the archive size consumed."""
    tar = _gnu_tar()
    if tar is not None:
        return _extract_gnu(tar, stream, workspace)
    return _extract_py(stream, root_fd)


_TAR: list[str | None] = []


def _gnu_tar() -> str | None:
    """The path of GNU tar when the image has it (checked once), else None."""
    if not _TAR:
        if os.environ.get("PATCHBOX_AGENT_TAR") == "python":
            _TAR.append(None)
            return None
        import shutil  # imported on first use
        import subprocess

        found = shutil.which("tar", path="/usr/bin:/bin")
        if found is not None:
            try:
                out = procs.run([found, "--version"], timeout=10).stdout
            except (OSError, subprocess.SubprocessError):
                out = b""
            if b"GNU tar" not in out:
                found = None
        _TAR.append(found)
    return _TAR[0]


def _workspace_full(path: str) -> bool:
    try:
        st = os.statvfs(path)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < 64 * 1024


def _tail(pipe: IO[bytes], out: list[bytes]) -> None:
    while chunk := pipe.read(4096):
        out.append(chunk)
        while len(out) > 4:
            out.pop(0)


def _listing_file() -> int:
    """A descriptor for tar's list of names: a memory file (no thread woken per name, as a
    pipe would be), or an unnamed temp file where memfd_create is missing."""
    memfd = getattr(os, "memfd_create", None)
    if memfd is not None:
        try:
            fd: int = memfd("patchbox-tar-list", getattr(os, "MFD_CLOEXEC", 1))
        except OSError:
            pass
        else:
            return fd
    import tempfile  # imported on first use: a faster start

    with tempfile.TemporaryFile() as handle:
        return os.dup(handle.fileno())


def _count_names(fd: int) -> int:
    os.lseek(fd, 0, os.SEEK_SET)
    count = 0
    while chunk := os.read(fd, 1 << 20):
        count += chunk.count(b"\n")
    return count


def _extract_gnu(tar: str, stream: Chunks | FileStream, workspace: str) -> int:
    """GNU tar reads a mounted archive itself; a channel stream is relayed to it."""
    import subprocess  # imported on first use: a faster start
    import threading

    # -m: files get the time they were written, as from tarfile below (and as a checkout
    # gives); restoring the archive's times is one more system call per file.
    argv = [tar, "-x", "-v", "-m", "-f", "-", "-C", workspace, "--no-same-owner"]
    argv += ["--no-same-permissions", "--no-overwrite-dir", "--totals"]
    direct = isinstance(stream, FileStream)
    listing = _listing_file()
    try:
        with procs.popen(
            argv,
            stdin=stream.fd if isinstance(stream, FileStream) else subprocess.PIPE,
            stdout=listing,
            stderr=subprocess.PIPE,
            close_fds=True,
            start_new_session=True,
        ) as proc:
            assert proc.stderr is not None  # noqa: S101 - Popen contract with PIPE
            errors: list[bytes] = []
            reader = threading.Thread(target=_tail, args=(proc.stderr, errors), daemon=True)
            reader.start()
            broken = False if direct else _relay(stream, proc)
            code = proc.wait()
            reader.join()
        names = _count_names(listing)
    finally:
        os.close(listing)
    detail = b"".join(errors).decode("utf-8", "replace")
    if code != 0 or broken:
        lines = [ln for ln in detail.splitlines() if not ln.startswith("Total bytes")]
        text = "\n".join(lines).strip()[-500:]
        if _workspace_full(workspace):
            text = "No space left on device in the workspace; " + text
        raise ArchiveRefusedError(f"archive refused: {text or f'tar exit {code}'}")
    if isinstance(stream, FileStream):
        import re  # imported on first use: a faster start

        found = re.search(r"Total bytes read: (\d+)", detail)
        stream.total = int(found.group(1)) if found else 0
    return names


def _relay(stream: Chunks | FileStream, proc: subprocess.Popen[bytes]) -> bool:
    assert proc.stdin is not None  # noqa: S101 - Popen contract with PIPE
    grow_pipe(proc.stdin.fileno())
    broken = False
    try:
        while chunk := stream.read(1 << 20):
            if not broken:
                try:
                    proc.stdin.write(chunk)
                except BrokenPipeError:
                    broken = True
    finally:
        try:
            proc.stdin.close()
        except BrokenPipeError:
            broken = True
    return broken


def _extract_py(stream: Chunks | FileStream, root_fd: int) -> int:
    import tarfile  # imported on first use: a faster start

    count = 0
    with tarfile.open(fileobj=stream, mode="r|") as tar:  # type: ignore[call-overload]
        for member in tar:
            count += 1
            try:
                _extract_member(tar, member, root_fd)
            except (jail.PathDeniedError, OSError) as exc:
                raise ArchiveRefusedError("archive refused: a path is denied") from exc
    return count


def _extract_member(tar: tarfile.TarFile, member: tarfile.TarInfo, root_fd: int) -> int:
    parts = member.name.rstrip("/").split("/")
    if not member.name or member.name.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise ArchiveRefusedError("archive member name refused")
    dfd = jail.make_dirs(root_fd, parts[:-1])
    try:
        name = parts[-1]
        if member.isdir():
            try:
                os.mkdir(name, 0o755, dir_fd=dfd)
            except FileExistsError:
                if not stat.S_ISDIR(os.stat(name, dir_fd=dfd, follow_symlinks=False).st_mode):
                    raise
            return 0
        if member.issym():
            os.symlink(member.linkname, name, dir_fd=dfd)
            return 0
        if not member.isreg():
            raise ArchiveRefusedError("archive member type refused")
        mode = 0o755 if member.mode & 0o111 else 0o644
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(name, flags, mode, dir_fd=dfd)
        src = tar.extractfile(member)
        with os.fdopen(fd, "wb") as out:
            if src is not None:
                while chunk := src.read(1 << 20):
                    out.write(chunk)
            os.fchmod(out.fileno(), mode)
        return member.size
    finally:
        os.close(dfd)
