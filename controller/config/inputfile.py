"""Reading the operator's input files (the task file, the calls file): one rule for both.

Only a regular file is read, and only up to a cap. The path is looked at first (so a device
is never even opened), then opened with ``O_NONBLOCK`` (so a FIFO swapped in meanwhile
never blocks the open) and checked again on the descriptor with ``fstat``, which is what is
then read: a FIFO, ``/dev/zero``, a directory or an endless file can never hang the CLI or
fill its memory. Every refusal is a :class:`~controller.errors.UsageError` (exit 2) naming
the file by its name only, never by its host path.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from controller.errors import UsageError

_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY


def read_input_file(path: Path | str, what: str, limit: int) -> bytes:
    """The bytes of ``path``, at most ``limit`` of them.

    ``what`` names the file in messages (``"task file"``). Raises :class:`UsageError` when
    the file is missing, is not a regular file (FIFO, device, directory, socket), cannot be
    read, or holds more than ``limit`` bytes (whatever its size claims: a file that grows
    while read is caught too)."""
    path = Path(path)
    label = f"{what} {str(path)!r}"
    try:
        _require_regular(path.stat().st_mode, label)
        fd = os.open(path, _FLAGS)
    except FileNotFoundError:
        raise UsageError(f"{label} not found") from None
    except OSError as exc:
        raise UsageError(f"{label} cannot be read: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        _require_regular(info.st_mode, label)
        if info.st_size > limit:
            raise UsageError(f"{label} is larger than {limit} bytes")
        chunks: list[bytes] = []
        size = 0
        while size <= limit:
            chunk = os.read(fd, min(1024 * 1024, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise UsageError(f"{label} cannot be read: {exc.strerror}") from None
    finally:
        os.close(fd)
    if size > limit:
        raise UsageError(f"{label} is larger than {limit} bytes")
    return b"".join(chunks)


def _require_regular(mode: int, label: str) -> None:
    if not stat.S_ISREG(mode):
        raise UsageError(f"{label} is not a regular file")
