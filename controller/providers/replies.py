"""A server's answer read strictly, for the OpenAI-compatible adapters (:mod:`.chat`,
:mod:`.responses`): the body decoded as strict JSON or as a server-sent event stream, the
fields read validated into :class:`Wire` models (typed, other fields ignored), the server's
error code kept only when it is a plain token, the token counts, a ``Retry-After`` header,
and whether a body stops inside its JSON (an answer cut short, which
:mod:`.openai` retries).
"""

from __future__ import annotations

import email.utils
import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from controller.errormap import describe_validation
from controller.errors import ProviderError
from controller.providers.base import MAX_JSON_DEPTH
from controller.strictjson import loads

_TOKEN = re.compile(r"[A-Za-z0-9_.:-]{1,64}")


@dataclass(frozen=True)
class Reply:
    """A successful (HTTP 200) answer, read whole."""

    content_type: str
    body: bytes
    framed: bool = True
    """The body's end was announced (``Content-Length`` or chunked), so a cut was seen by
    httpx; an unframed body simply ends where the connection closed."""


_LITERAL_HEADS = frozenset(w[:n] for w in ("null", "true", "false") for n in range(1, len(w)))
_NUMBER_TAIL = re.compile(r"(?:\.[0-9]*)?(?:[eE][-+]?[0-9]*)?")
_ESCAPE_HEAD = re.compile(r"u[0-9a-fA-F]{0,4}")


def ends_early(body: bytes) -> bool:
    """Whether ``body`` stops inside a JSON document, as an answer cut short does: decoding
    fails at its very end, inside a string, a literal, a number, an escape or a UTF-8
    sequence, and never before."""
    try:
        json.loads(body.decode("utf-8"))
    except json.JSONDecodeError as exc:
        return _cut_at(exc.msg, exc.doc[exc.pos :])
    except UnicodeDecodeError as exc:
        return exc.reason == "unexpected end of data"
    except (ValueError, RecursionError):
        return False
    return False


def _cut_at(problem: str, rest: str) -> bool:
    """Whether a JSON decoding ``problem`` with ``rest`` left to read is the end of the text
    arriving too soon."""
    if problem.startswith("Unterminated string"):
        return True
    if problem.startswith("Invalid \\uXXXX escape"):
        return _ESCAPE_HEAD.fullmatch(rest) is not None
    if problem.startswith("Expecting value"):
        return rest in ("", "-") or rest in _LITERAL_HEADS
    if problem.startswith("Expecting ',' delimiter"):
        return _NUMBER_TAIL.fullmatch(rest) is not None  # "1." or "1e" and no more
    return not rest


def retry_after_seconds(value: str | None, now: datetime | None = None) -> float | None:
    """The wait a ``Retry-After`` header asks for (delta seconds or an HTTP date), or None."""
    if value is None or len(value) > 64:
        return None
    value = value.strip()
    if value.isdigit():
        return float(int(value[:10]))
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())


class Wire(BaseModel):
    """Base of the models of a server's answer: typed fields, unknown fields ignored."""

    model_config = ConfigDict(extra="ignore", frozen=True, strict=True, hide_input_in_errors=True)


_M = TypeVar("_M", bound=BaseModel)


def decode_json(body: bytes, what: str) -> Any:
    """Strictly decoded JSON, or :class:`ProviderError` naming ``what`` was malformed."""
    try:
        return loads(body, max_depth=MAX_JSON_DEPTH)
    except ValueError:
        raise ProviderError(f"{what} is not valid JSON") from None


def sse_events(body: bytes) -> list[tuple[str, str]]:
    """The complete events of a server-sent event stream as ``(event, data)``.

    An event missing its closing blank line (a stream cut mid-way) is dropped, as the
    standard says. Raises :class:`ProviderError` for a stream that is not UTF-8.
    """
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise ProviderError("event stream is not UTF-8") from None
    events: list[tuple[str, str]] = []
    name = ""
    data: list[str] = []
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    # The last element follows the final newline: an unterminated line, never dispatched.
    for line in lines[:-1]:
        if not line:
            if data:
                events.append((name or "message", "\n".join(data)))
            name, data = "", []
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if field == "event":
            name = value
        elif field == "data":
            data.append(value)
    return events


def token(value: Any) -> str | None:
    """``value`` when it is a short identifier-like string (safe to show), else None."""
    return value if isinstance(value, str) and _TOKEN.fullmatch(value) else None


def error_code(body: bytes) -> str | None:
    """The server's error code or type when it is a plain token (never its message)."""
    try:
        value = loads(body, max_depth=MAX_JSON_DEPTH)
    except ValueError:
        return None
    error = value.get("error") if isinstance(value, dict) else None
    if not isinstance(error, dict):
        return None
    return token(error.get("code")) or token(error.get("type"))


def usage_counts(
    usage: BaseModel | None, names: dict[str, str], response_bytes: int
) -> dict[str, int]:
    """Token counts under the provider-neutral names, plus the bytes received."""
    out = {"response_bytes": response_bytes}
    if usage is not None:
        for wire, ours in names.items():
            value = getattr(usage, wire, None)
            if isinstance(value, int) and value >= 0:
                out[ours] = value
    return out


def parse_with(model: type[_M], value: Any, what: str) -> _M:
    """``model.model_validate(value)``, or :class:`ProviderError` describing the wrong shape."""
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        detail = describe_validation(exc, subject="answer", max_items=3, max_chars=10_000)
        raise ProviderError(f"{what} has an unexpected shape: {detail}") from None
