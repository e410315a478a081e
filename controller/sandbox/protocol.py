"""The controller's side of the agent protocol (version 1): framing and strict decoding.

A frame is ``b"PB" | kind | uint32 length`` and a payload (see the agent's ``frames.py``).
Everything that comes from the container is untrusted: the header is checked
and the size cap enforced before the payload is read; JSON is decoded with no duplicate
keys, no NaN or Infinity, bounded numbers and bounded nesting.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import struct
from typing import Any

from controller.errors import ProtocolError

PROTOCOL_VERSION = 1
MAGIC = b"PB"
KIND_JSON = b"J"
KIND_BINARY = b"B"
KIND_SIGNED = b"S"
TAG_SIZE = 32
HEADER = struct.Struct(">2scI")
HEADER_SIZE = HEADER.size

MAX_RESPONSE_FRAME = 4 * 1024 * 1024
"""The largest frame the controller accepts from the container."""
MAX_DEPTH = 16
MAX_INT_DIGITS = 19
BINARY_CHUNK = 1024 * 1024


def encode(kind: bytes, payload: bytes) -> bytes:
    return HEADER.pack(MAGIC, kind, len(payload)) + payload


def encode_request(rid: int, op: str, args: dict[str, Any]) -> bytes:
    body = json.dumps(
        {"id": rid, "op": op, "args": args},
        ensure_ascii=False,
        separators=(",", ":"),
        allow_nan=False,
    )
    return encode(KIND_JSON, body.encode("utf-8"))


def parse_header(header: bytes, max_frame: int = MAX_RESPONSE_FRAME) -> tuple[bytes, int]:
    """Checks a frame header; returns ``(kind, length)`` or raises ProtocolError."""
    magic, kind, length = HEADER.unpack(header)
    if magic != MAGIC or kind not in (KIND_JSON, KIND_BINARY, KIND_SIGNED):
        raise ProtocolError("malformed frame header from the sandbox")
    if length > max_frame:
        raise ProtocolError(f"oversized frame from the sandbox ({length} bytes > {max_frame})")
    return kind, length


class FrameVerifier:
    """Checks the agent's signed frames: HMAC-SHA256 over (sequence number, JSON) under the
    key sent in ``hello``. A frame that fails is a forgery or a corruption: the job fails."""

    def __init__(self, key: bytes) -> None:
        self._key = key
        self._seq = 0

    def open(self, payload: bytes) -> bytes:
        if len(payload) < TAG_SIZE:
            raise ProtocolError("unauthenticated frame from the sandbox")
        self._seq += 1
        tag, body = payload[:TAG_SIZE], payload[TAG_SIZE:]
        want = hmac.new(self._key, self._seq.to_bytes(8, "big") + body, hashlib.sha256).digest()
        if not hmac.compare_digest(tag, want):
            raise ProtocolError("unauthenticated frame from the sandbox (bad signature)")
        return body


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ProtocolError("duplicate key in a frame from the sandbox")
        out[key] = value
    return out


def _no_constant(name: str) -> Any:
    raise ProtocolError(f"non-finite number {name} in a frame from the sandbox")


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise ProtocolError("number too large in a frame from the sandbox")
    return int(text)


def _bounded_float(text: str) -> float:
    if len(text) > 40:
        raise ProtocolError("number too long in a frame from the sandbox")
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ProtocolError("non-finite number in a frame from the sandbox")
    return value


def _depth_ok(value: Any, depth: int = 0) -> bool:
    if depth > MAX_DEPTH:
        return False
    if isinstance(value, dict):
        return all(_depth_ok(v, depth + 1) for v in value.values())
    if isinstance(value, list):
        return all(_depth_ok(v, depth + 1) for v in value)
    return True


def decode_json(payload: bytes) -> dict[str, Any]:
    """Strictly decodes one JSON object payload from the container."""
    try:
        text = payload.decode("utf-8")
        value = json.loads(
            text,
            object_pairs_hook=_no_duplicates,
            parse_constant=_no_constant,
            parse_int=_bounded_int,
            parse_float=_bounded_float,
        )
    except ProtocolError:
        raise
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ProtocolError("undecodable frame from the sandbox") from exc
    if not isinstance(value, dict):
        raise ProtocolError("a frame from the sandbox is not a JSON object")
    if not _depth_ok(value):
        raise ProtocolError("a frame from the sandbox is nested too deeply")
    return value
