"""The one strict JSON decoder, for every text that comes from outside: the agent's frames,
a model's answers and tool arguments, the calls file.

It refuses what :func:`json.loads` lets through: a duplicate key, NaN or Infinity (also a
number that overflows to one), an overlong number and nesting deeper than the caller allows.
Each caller names its own limits and turns :class:`StrictJSONError` into its own error.
"""

from __future__ import annotations

import json
from typing import Any


class StrictJSONError(ValueError):
    """The text is JSON that breaks one of the rules above; the message says which
    (``duplicate key``, ``non-finite number``, ``number too large``, ``number too long``,
    ``nested too deeply``). Not a :class:`~controller.errors.PatchboxError`: callers map it."""


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            msg = "duplicate key"
            raise StrictJSONError(msg)
        out[key] = value
    return out


def _no_constant(_name: str) -> Any:
    msg = "non-finite number"
    raise StrictJSONError(msg)


def _depth(value: Any, limit: int) -> int:
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, level = stack.pop()
        deepest = max(deepest, level)
        if deepest > limit:
            break
        if isinstance(item, dict):
            stack.extend((v, level + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, level + 1) for v in item)
    return deepest


def loads(
    data: bytes | str,
    *,
    max_depth: int,
    max_number_chars: int = 40,
    max_int_digits: int | None = None,
) -> Any:
    """Decodes untrusted JSON.

    ``max_depth`` counts containers around the deepest value (a top-level scalar is at 0);
    ``max_number_chars`` bounds the text of any number, ``max_int_digits`` the digits of an
    integer. Raises :class:`StrictJSONError` for a broken rule, ``UnicodeDecodeError`` for
    bytes that are not UTF-8 and :class:`json.JSONDecodeError` for text that is not JSON
    (both ``ValueError``)."""

    def bounded_int(text: str) -> int:
        if max_int_digits is not None and len(text.lstrip("-")) > max_int_digits:
            msg = "number too large"
            raise StrictJSONError(msg)
        if len(text) > max_number_chars:
            msg = "number too long"
            raise StrictJSONError(msg)
        return int(text)

    def bounded_float(text: str) -> float:
        if len(text) > max_number_chars:
            msg = "number too long"
            raise StrictJSONError(msg)
        value = float(text)
        if value in (float("inf"), float("-inf")):
            msg = "non-finite number"
            raise StrictJSONError(msg)
        return value

    text = data.decode("utf-8") if isinstance(data, bytes) else data
    try:
        value = json.loads(
            text,
            object_pairs_hook=_no_duplicates,
            parse_constant=_no_constant,
            parse_int=bounded_int,
            parse_float=bounded_float,
        )
    except RecursionError as exc:
        msg = "nested too deeply"
        raise StrictJSONError(msg) from exc
    if _depth(value, max_depth) > max_depth:
        msg = "nested too deeply"
        raise StrictJSONError(msg)
    return value
