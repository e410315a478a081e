"""Strict decoding of everything that comes from the container (pure, no Docker)."""

from __future__ import annotations

import json

import pytest

from controller.errors import ProtocolError
from controller.sandbox.protocol import (
    HEADER,
    KIND_BINARY,
    KIND_JSON,
    MAX_DEPTH,
    FrameVerifier,
    decode_json,
    encode,
    encode_request,
    parse_header,
)
from patchbox_agent.frames import Hmac, Signer


def test_request_round_trip() -> None:
    frame = encode_request(7, "read_file", {"path": "a.py"})
    kind, length = parse_header(frame[: HEADER.size])
    assert kind == KIND_JSON
    assert length == len(frame) - HEADER.size
    assert decode_json(frame[HEADER.size :]) == {
        "id": 7,
        "op": "read_file",
        "args": {"path": "a.py"},
    }


@pytest.mark.parametrize(
    "header",
    [
        b"XX" + KIND_JSON + b"\x00\x00\x00\x01",  # wrong magic
        b"PB" + b"Z" + b"\x00\x00\x00\x01",  # unknown kind
        b"\x00" * 7,
    ],
)
def test_malformed_header_is_refused(header: bytes) -> None:
    with pytest.raises(ProtocolError, match="malformed frame header"):
        parse_header(header)


def test_oversized_frame_is_refused_from_its_header() -> None:
    header = encode(KIND_BINARY, b"")[:3] + (10_000_001).to_bytes(4, "big")
    with pytest.raises(ProtocolError, match="oversized frame"):
        parse_header(header, max_frame=10_000_000)
    assert parse_header(header, max_frame=10_000_001) == (KIND_BINARY, 10_000_001)


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (b'{"id": 1, "id": 2}', "duplicate key"),
        (b'{"x": NaN}', "non-finite"),
        (b'{"x": Infinity}', "non-finite"),
        (b'{"x": -Infinity}', "non-finite"),
        (b'{"x": 1e999}', "non-finite"),
        (b'{"x": 12345678901234567890123}', "number too large"),
        (b'{"x": 1.' + b"1" * 60 + b"}", "number too long"),
        (b"[1, 2]", "not a JSON object"),
        (b'"text"', "not a JSON object"),
        (b'{"x": "\xff"}', "undecodable"),
        (b'{"x": ', "undecodable"),
        (b"", "undecodable"),
        (b'{"a":' * (MAX_DEPTH + 2) + b"1" + b"}" * (MAX_DEPTH + 2), "nested too deeply"),
        (b"[" * 100_000 + b"]" * 100_000, "undecodable|not a JSON object|nested too deeply"),
    ],
)
def test_hostile_payloads_are_refused(payload: bytes, message: str) -> None:
    with pytest.raises(ProtocolError, match=message):
        decode_json(payload)


def test_nesting_at_the_limit_is_accepted() -> None:
    value: object = 1
    for _ in range(MAX_DEPTH):
        value = {"a": value}
    assert decode_json(json.dumps(value).encode()) == value


# RFC 4231 HMAC-SHA-256 test cases 1, 2 and 6 (a key longer than the block).
RFC4231 = [
    (b"\x0b" * 20, b"Hi There", "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"),
    (
        b"Jefe",
        b"what do ya want for nothing?",
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843",
    ),
    (
        b"\xaa" * 131,
        b"Test Using Larger Than Block-Size Key - Hash Key First",
        "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54",
    ),
]


@pytest.mark.parametrize(("key", "message", "want"), RFC4231)
def test_agent_hmac_matches_rfc4231(key: bytes, message: bytes, want: str) -> None:
    """The agent signs with its own HMAC on the interpreter's SHA-256 (no OpenSSL)."""
    mac = Hmac(key)
    assert mac.digest(message).hex() == want
    assert mac.digest(message).hex() == want  # the keyed state is reused, not consumed


def test_agent_signatures_open_with_the_controller_verifier() -> None:
    key = bytes(range(32))
    signer, verifier = Signer(key), FrameVerifier(key)
    for obj in ({"id": 1, "ok": True}, {"id": 2, "ok": False, "text": "é" * 100}):
        frame = signer.encode(obj)
        kind, length = parse_header(frame[: HEADER.size])
        assert (kind, length) == (b"S", len(frame) - HEADER.size)
        assert json.loads(verifier.open(frame[HEADER.size :])) == obj
    forged = Signer(bytes(32)).encode({"id": 3})
    with pytest.raises(ProtocolError, match="bad signature"):
        verifier.open(forged[HEADER.size :])
