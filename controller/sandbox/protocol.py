"""The controller's side of the agent protocol (version 1): framing and strict decoding.

A frame is ``b"PB" | kind | uint32 length`` and a payload; the version, the header and the
kinds are the agent's (``patchbox_agent.frames``), imported rather than copied.
Everything that comes from the container is untrusted: the header is checked
and the size cap enforced before the payload is read; JSON is decoded with no duplicate
keys, no NaN or Infinity, bounded numbers and bounded nesting.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from typing import Any

from controller import strictjson
from controller.errors import ProtocolError
from patchbox_agent.frames import (
    HEADER,
    HEADER_SIZE,
    KIND_BINARY,
    KIND_JSON,
    KIND_SIGNED,
    MAGIC,
    PROTOCOL_VERSION,
)

__all__ = [
    "BINARY_CHUNK",
    "HEADER",
    "HEADER_SIZE",
    "KIND_BINARY",
    "KIND_JSON",
    "KIND_SIGNED",
    "MAGIC",
    "MAX_DEPTH",
    "MAX_INT_DIGITS",
    "MAX_RESPONSE_FRAME",
    "PROTOCOL_VERSION",
    "TAG_SIZE",
    "FrameVerifier",
    "decode_json",
    "encode",
    "encode_request",
    "parse_header",
]

TAG_SIZE = 32

MAX_RESPONSE_FRAME = 4 * 1024 * 1024
"""The largest frame the controller accepts from the container."""
MAX_DEPTH = 16
MAX_INT_DIGITS = 19
BINARY_CHUNK = 1024 * 1024


def encode(kind: bytes, payload: bytes) -> bytes:
    return HEADER.pack(MAGIC, kind, len(payload)) + payload


ArgValue = str | int | float | bool | list[str] | dict[str, str]
"""A value of a request's arguments (strings, numbers, flags, argv lists, variables)."""
CallArgs = Mapping[str, ArgValue]
"""A request's ``args`` object."""


def encode_request(rid: int, op: str, args: CallArgs) -> bytes:
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


def decode_json(payload: bytes) -> dict[str, Any]:
    """Strictly decodes one JSON object payload from the container
    (:func:`controller.strictjson.loads` with this protocol's limits)."""
    try:
        value = strictjson.loads(
            payload, max_depth=MAX_DEPTH, max_int_digits=MAX_INT_DIGITS, max_number_chars=40
        )
    except strictjson.StrictJSONError as exc:
        raise ProtocolError(f"{exc} in a frame from the sandbox") from exc
    except ValueError as exc:
        raise ProtocolError("undecodable frame from the sandbox") from exc
    if not isinstance(value, dict):
        raise ProtocolError("a frame from the sandbox is not a JSON object")
    return value
