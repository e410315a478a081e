"""JSON for the channel, on the interpreter's ``_json`` accelerator.

The ``json`` package imports ``re`` (and through it ``enum``), the largest part of the
agent's start-up imports under gVisor, where every module is read cold (docs/performance.md
has the measurements). The accelerator's scanner
and encoder are what ``json.loads`` and ``json.dumps`` use anyway; this module drives them
directly and falls back to ``json`` where an interpreter lacks them. The tests check that
both give the same answers.

``loads`` takes UTF-8 (bytes) or text, and refuses anything but exactly one JSON value
(surrounding whitespace allowed), like ``json.loads``. ``dumps`` writes compact JSON,
non-ASCII kept as is, and refuses NaN and the infinities (``ValueError``) and types JSON
does not have (``TypeError``). ``dumps_utf8`` is ``dumps`` as UTF-8 bytes, and never fails
on a lone surrogate: a file name that is not UTF-8 reaches Python as one (``os`` decodes
names with ``surrogateescape``), and UTF-8 cannot hold it, so such a text is written with
every non-ASCII character as a JSON escape (``"bad\\udcff"``), which decodes to the same
string on the other side.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from typing import Any

_WHITESPACE = " \t\n\r"


def _refuse(obj: object) -> object:
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")


def _refuse_constant(name: str) -> object:
    raise ValueError(f"{name} is not valid JSON")


class _Options:
    """The attributes ``_json.make_scanner`` reads."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = staticmethod(_refuse_constant)


_scan: Callable[[str, int], tuple[Any, int]] | None = None
_encode: Callable[[object, int], Iterable[str]] | None = None
_encode_ascii: Callable[[object, int], Iterable[str]] | None = None
try:
    import _json

    _scan = _json.make_scanner(_Options())  # type: ignore[arg-type] # duck-typed options
    _encode = _json.make_encoder(
        None,  # markers: no cycle check (the agent sends trees)
        _refuse,  # default
        _json.encode_basestring,  # non-ASCII kept as is
        None,  # indent
        ":",
        ",",
        False,  # noqa: FBT003 - sort_keys
        False,  # noqa: FBT003 - skipkeys
        False,  # noqa: FBT003 - allow_nan
    )
    _encode_ascii = _json.make_encoder(
        None,
        _refuse,
        _json.encode_basestring_ascii,  # every non-ASCII character escaped
        None,
        ":",
        ",",
        False,  # noqa: FBT003 - sort_keys
        False,  # noqa: FBT003 - skipkeys
        False,  # noqa: FBT003 - allow_nan
    )
except (ImportError, AttributeError, TypeError):  # pragma: no cover - depends on the build
    _scan = _encode = _encode_ascii = None


def loads(data: bytes | str) -> Any:
    """The one JSON value in ``data``; ``ValueError`` for anything else (NaN included)."""
    text = data.decode("utf-8") if isinstance(data, (bytes, bytearray)) else data
    if _scan is None:  # pragma: no cover - depends on the build
        import json

        return json.loads(text, parse_constant=_refuse_constant)
    start = len(text) - len(text.lstrip(_WHITESPACE))
    try:
        obj, end = _scan(text, start)
    except StopIteration as exc:
        raise ValueError(f"expecting a JSON value at offset {exc.value}") from None
    if end != len(text) and text[end:].strip(_WHITESPACE):
        raise ValueError(f"extra data at offset {end}")
    return obj


def dumps(obj: object) -> str:
    """Compact JSON text for ``obj``."""
    if _encode is None:  # pragma: no cover - depends on the build
        import json

        return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return "".join(_encode(obj, 0))


def dumps_utf8(obj: object) -> bytes:
    """``dumps(obj)`` as UTF-8; with every non-ASCII character escaped when the text holds
    a lone surrogate (only then: escaping costs up to six bytes a character)."""
    text = dumps(obj)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        pass
    if _encode_ascii is None:  # pragma: no cover - depends on the build
        import json

        text = json.dumps(obj, ensure_ascii=True, separators=(",", ":"), allow_nan=False)
    else:
        text = "".join(_encode_ascii(obj, 0))
    return text.encode("ascii")
