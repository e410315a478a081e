"""The agent's JSON codec on the interpreter's accelerator agrees with ``json`` (pure)."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from patchbox_agent import wire


def _value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(8 if depth < 4 else 5)
    if kind == 0:
        return rng.choice([None, True, False])
    if kind == 1:
        return rng.randint(-(10**20), 10**20)
    if kind == 2:
        return rng.choice([0.0, -0.0, 1e-300, 1.5e300, rng.uniform(-1e6, 1e6)])
    if kind in (3, 4):
        alphabet = 'ab "\\/\b\f\n\r\t\x00\x1f\x7f\u00e9\u2028\u2029\ud7ff\U0001f600'
        return "".join(rng.choice(alphabet) for _ in range(rng.randrange(12)))
    if kind in (5, 6):
        return {str(_value(rng, 4)): _value(rng, depth + 1) for _ in range(rng.randrange(5))}
    return [_value(rng, depth + 1) for _ in range(rng.randrange(5))]


@pytest.mark.parametrize("seed", range(40))
def test_agrees_with_json(seed: int) -> None:
    value = _value(random.Random(seed))  # noqa: S311 - reproducible test data
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    assert wire.dumps(value) == text
    assert wire.loads(text.encode()) == json.loads(text)
    spaced = json.dumps(value, indent=2)  # any whitespace between tokens is read
    assert wire.loads(" \n" + spaced + "\r\n\t") == json.loads(spaced)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"   ",
        b"{",
        b"{} {}",
        b"[1] x",
        b'{"a":1,}',
        b"NaN",
        b"[Infinity]",
        b"-Infinity",
        b'"\x01"',
        b"\xff",
        b"'single'",
    ],
)
def test_refuses_what_is_not_one_json_value(data: bytes) -> None:
    with pytest.raises(ValueError):
        wire.loads(data)


@pytest.mark.parametrize(
    ("value", "error"),
    [(float("nan"), ValueError), ([float("inf")], ValueError), ({"a": {1, 2}}, TypeError)],
)
def test_refuses_what_json_cannot_hold(value: object, error: type[Exception]) -> None:
    with pytest.raises(error):
        wire.dumps(value)
