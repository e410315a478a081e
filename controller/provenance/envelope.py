"""DSSE envelopes of in-toto statements, one JSON object per line
(``provenance.intoto.jsonl``), signed and verified through securesystemslib's ``dsse``."""

from __future__ import annotations

import json

from securesystemslib.dsse import Envelope
from securesystemslib.exceptions import FormatError, VerificationError
from securesystemslib.signer import Key, Signer

from controller.errors import ErrorCode, PatchboxError
from controller.provenance.statement import PAYLOAD_TYPE, Statement

MAX_LINES = 1000


def sign(statement: Statement, signer: Signer) -> str:
    """One line of JSON: ``statement`` in a DSSE envelope with one signature."""
    payload = statement.model_dump_json(exclude_none=False).encode()
    envelope = Envelope(payload=payload, payload_type=PAYLOAD_TYPE, signatures={})
    envelope.sign(signer)
    return json.dumps(envelope.to_dict(), sort_keys=True)


def signed_lines(statements: list[Statement], signer: Signer) -> bytes:
    """The JSON Lines file of ``statements``, each signed."""
    return "".join(sign(s, signer) + "\n" for s in statements).encode()


def read_envelopes(text: str) -> list[Envelope]:
    """The envelopes of a JSON Lines file (``VERIFY_INPUT_INVALID`` naming the first line
    that is not one)."""
    envelopes = []
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines or len(lines) > MAX_LINES:
        msg = f"the attestations hold {len(lines)} envelopes (1 to {MAX_LINES} expected)"
        raise PatchboxError(msg, code=ErrorCode.VERIFY_INPUT_INVALID)
    for number, line in enumerate(lines, 1):
        try:
            data = json.loads(line)
            envelopes.append(Envelope.from_dict(data))
        except (ValueError, KeyError, TypeError, FormatError, AttributeError) as exc:
            msg = f"line {number} of the attestations is not a DSSE envelope"
            raise PatchboxError(msg, code=ErrorCode.VERIFY_INPUT_INVALID) from exc
    return envelopes


def verified(envelope: Envelope, key: Key) -> bool:
    """Whether ``envelope`` carries a valid signature by ``key``."""
    try:
        envelope.verify([key], 1)
    except (VerificationError, FormatError, ValueError):
        return False
    return True
