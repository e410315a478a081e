"""Framing of the controller <-> agent channel (protocol version 1).

A frame is a 7-byte header and a payload::

    b"PB" | kind (1 byte) | length (uint32, big endian)

Kinds: ``J`` a JSON object (controller to agent), ``B`` a binary chunk, ``S`` a signed JSON
object (agent to controller): a 32-byte HMAC-SHA256 tag, then the JSON. The tag covers the
frame's sequence number (8 bytes, big endian, from 1) and the JSON, under the key the
controller sent in ``hello``, before any repository code ran. A process in the sandbox that
gets hold of the channel can therefore break it, but never forge an answer.

JSON payloads are UTF-8 objects. Binary frames only follow a request that announced
them (``put_archive``). The header is checked before the payload is read, so an
oversized frame is refused without buffering it.
"""

from __future__ import annotations

import os
import select
import struct

from . import wire

TYPE_CHECKING = False

# SHA-256 from the interpreter's own module, not hashlib: hashlib and hmac load OpenSSL's
# libcrypto, which costs a sandbox start time and, under gVisor, about 1 MB of memory.
if TYPE_CHECKING:
    from collections.abc import Callable
    from hashlib import sha256
else:
    try:
        from _sha2 import sha256  # Python >= 3.12
    except ImportError:
        try:
            from _sha256 import sha256  # Python <= 3.11
        except ImportError:
            from hashlib import sha256

PROTOCOL_VERSION = 1
MAGIC = b"PB"
KIND_JSON = b"J"
KIND_BINARY = b"B"
KIND_SIGNED = b"S"
HEADER = struct.Struct(">2scI")
HEADER_SIZE = HEADER.size

MAX_REQUEST_FRAME = 8 * 1024 * 1024


class FrameError(Exception):
    """The peer sent something that is not a valid frame; the channel is dead."""


def encode(kind: bytes, payload: bytes) -> bytes:
    return HEADER.pack(MAGIC, kind, len(payload)) + payload


_BLOCK = 64
_IPAD = bytes(x ^ 0x36 for x in range(256))
_OPAD = bytes(x ^ 0x5C for x in range(256))


class Hmac:
    """HMAC-SHA256 (RFC 2104) with a fixed key."""

    def __init__(self, key: bytes) -> None:
        if len(key) > _BLOCK:
            key = sha256(key).digest()
        key = key.ljust(_BLOCK, b"\0")
        self._inner = sha256(key.translate(_IPAD))
        self._outer = sha256(key.translate(_OPAD))

    def digest(self, message: bytes) -> bytes:
        inner = self._inner.copy()
        inner.update(message)
        outer = self._outer.copy()
        outer.update(inner.digest())
        return outer.digest()


class Signer:
    """Signs the agent's frames: HMAC-SHA256 over (sequence number, JSON)."""

    def __init__(self, key: bytes) -> None:
        self._mac = Hmac(key)
        self._seq = 0

    def encode(self, obj: object) -> bytes:
        body = wire.dumps_utf8(obj)
        self._seq += 1
        tag = self._mac.digest(self._seq.to_bytes(8, "big") + body)
        return encode(KIND_SIGNED, tag + body)


class FdReader:
    """Reads frames from a file descriptor with a bounded buffer."""

    def __init__(
        self,
        fd: int,
        max_frame: int = MAX_REQUEST_FRAME,
        wake: tuple[int, Callable[[], object]] | None = None,
    ) -> None:
        """``wake``: a descriptor to watch while waiting for input, and what to call when it
        becomes readable (the agent's orphan reaping, as the container's init)."""
        self._fd = fd
        self._buf = bytearray()
        self._max = max_frame
        self._wake = wake
        self.at_eof = False

    def _wait(self, wake_fd: int, on_wake: Callable[[], object]) -> None:
        while True:
            ready = select.select([self._fd, wake_fd], [], [])[0]
            if wake_fd in ready:
                on_wake()
            if self._fd in ready:
                return

    def _fill(self, n: int) -> bool:
        while len(self._buf) < n:
            if self._wake is not None:
                self._wait(*self._wake)
            chunk = os.read(self._fd, max(1 << 20, n - len(self._buf)))
            if not chunk:
                self.at_eof = True
                return False
            self._buf += chunk
        return True

    def read(self) -> tuple[bytes, bytes] | None:
        """Returns ``(kind, payload)``, or None on a clean end of stream."""
        if not self._fill(HEADER_SIZE):
            if self._buf:
                raise FrameError("truncated frame header")
            return None
        magic, kind, length = HEADER.unpack_from(self._buf)
        if magic != MAGIC or kind not in (KIND_JSON, KIND_BINARY):
            raise FrameError("bad frame header")
        if length > self._max:
            raise FrameError("frame too large")
        if not self._fill(HEADER_SIZE + length):
            raise FrameError("truncated frame")
        payload = bytes(self._buf[HEADER_SIZE : HEADER_SIZE + length])
        del self._buf[: HEADER_SIZE + length]
        return kind, payload


def grow_pipe(fd: int) -> None:
    """Asks for a 1 MiB pipe buffer (fewer wake-ups on bulk transfers); harmless if refused."""
    try:
        import fcntl

        fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), 1 << 20)
    except OSError:
        pass
