"""The one translation of third-party errors, and of a service's error answers, into ours:
:func:`map_error` for docker-py (and the ``requests`` transport errors docker-py lets
through) and httpx, :func:`map_git_error` for a git process that could not run,
:func:`map_service_error` for httpx errors of a client of the service (``patchbox remote``),
:func:`service_error` for the service's error answers. Callers write
``raise map_error(exc, "doing what") from exc``. A pydantic ``ValidationError`` becomes a
message with :func:`describe_validation`, which names fields and problems but never echoes a
value."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Mapping
from types import UnionType
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union, get_args, get_origin

from controller.errors import (
    ErrorCode,
    GitError,
    InternalError,
    PatchboxError,
    ProviderError,
    SandboxError,
    ServiceError,
    ServiceUnreachableError,
    ServiceUsageError,
    TransientProviderError,
)

if TYPE_CHECKING:
    from pydantic import ValidationError

    from controller.errorinfo import Hint


SERVICE_USAGE_CODES = frozenset(
    {
        ErrorCode.UNAUTHORIZED,
        ErrorCode.NOT_FOUND,
        ErrorCode.BAD_REQUEST,
        ErrorCode.METHOD_NOT_ALLOWED,
        ErrorCode.REPO_NOT_ALLOWED,
        ErrorCode.TASK_NOT_ALLOWED,
        ErrorCode.USAGE_ERROR,
    }
)
"""Service codes that mean the request was wrong: :class:`ServiceUsageError`, exit 2 (as the
local commands exit with ``USAGE_ERROR``, a job in the wrong state included)."""


def service_error(status: int, code: str, message: str, hint: Hint | None = None) -> ServiceError:
    """The error of ours for the service's answer ``status`` with ``{"code", "message"}``
    (and its remedy, ``hint``, when it gave one)."""
    known = code in ErrorCode.__members__
    ours = ErrorCode(code) if known else ErrorCode.SERVICE_BAD_RESPONSE
    if not known:
        message = f"the service answered {status} with the unknown code {code[:64]!r}: {message}"
    cls = ServiceUsageError if ours in SERVICE_USAGE_CODES else ServiceError
    return cls(message[:2000], code=ours, status=status, service_code=code[:64], hint=hint)


def map_service_error(
    exc: BaseException, doing: str, *, scrub: Callable[[str], str] = str
) -> PatchboxError:
    """The error of ours for an httpx error of a service client: a transport failure (no
    connection, a timeout, a cut connection) is :class:`ServiceUnreachableError`, anything
    else as :func:`map_error` says. The message is ``doing: detail``, never a header."""
    if isinstance(exc, PatchboxError):
        return exc
    names = [_qualified(cls) for cls in type(exc).__mro__]
    if "httpx.TransportError" in names:
        kind = type(exc).__name__
        if "Timeout" in kind:
            detail = f"timed out ({kind})"
        elif "Connect" in kind:
            detail = f"cannot connect ({scrub(str(exc))[:160]})"
        else:
            detail = f"the connection failed ({kind})"
        return ServiceUnreachableError(f"{doing}: {detail}")
    return map_error(exc, doing, scrub=scrub)


_THIRD_PARTY: tuple[tuple[str, type[PatchboxError]], ...] = (
    ("httpx.TimeoutException", TransientProviderError),
    ("httpx.ConnectError", TransientProviderError),
    ("httpx.HTTPError", ProviderError),
    ("httpx.InvalidURL", ProviderError),
    ("httpx.CookieConflict", ProviderError),
    ("httpx.StreamError", ProviderError),
    ("docker.errors.DockerException", SandboxError),
    ("docker.errors.StreamParseError", SandboxError),
    ("requests.exceptions.RequestException", SandboxError),
)
"""Third-party roots, by qualified class name (so this module imports neither library), and
the class of ours each becomes. The first entry on an exception's class chain wins."""


def _qualified(cls: type) -> str:
    module = cls.__module__
    # httpx defines its errors in a private module and exports them from the package.
    if module.startswith("httpx."):
        module = "httpx"
    return f"{module}.{cls.__qualname__}"


def mapped_class(exc: BaseException) -> type[PatchboxError] | None:
    """The class of ours a third-party exception becomes, or None when it is not known."""
    names = [_qualified(cls) for cls in type(exc).__mro__]
    for name, ours in _THIRD_PARTY:
        if name in names:
            return ours
    return None


def _detail(exc: BaseException, scrub: Callable[[str], str]) -> str:
    """What may be said about a third-party error: Docker's explanation or a build log line,
    the cause of a failed connection, otherwise only the class name."""
    name = _qualified(type(exc))
    if name.startswith("docker.errors."):
        text = getattr(exc, "explanation", None) or getattr(exc, "msg", None)
        return str(text) if text else type(exc).__name__
    if name.startswith("httpx.") and isinstance(exc, Exception):
        if mapped_class(exc) is TransientProviderError and "Timeout" not in type(exc).__name__:
            return f"cannot connect ({scrub(str(exc))[:120]})"
        kind = "timed out" if "Timeout" in type(exc).__name__ else "transport failed"
        return f"{kind} ({type(exc).__name__})"
    return type(exc).__name__


def map_error(
    exc: BaseException, doing: str = "", *, scrub: Callable[[str], str] = str
) -> PatchboxError:
    """The error of ours for ``exc``: itself when it is already ours, the mapped class for a
    docker-py, ``requests`` (under docker-py) or httpx error, :class:`InternalError` for
    anything else (a bug: nobody expected it). The message is ``doing: detail``; ``scrub``
    cleans any text taken from the exception (a secret may be in a URL) before it is cut.
    Never raises; the caller writes ``raise map_error(exc, ...) from exc``."""
    if isinstance(exc, PatchboxError):
        return exc
    ours = mapped_class(exc)
    detail = _detail(exc, scrub)
    message = f"{doing}: {detail}" if doing else detail
    if ours is None:
        return InternalError(message)
    return ours(message)


def map_git_error(exc: OSError | subprocess.SubprocessError, command: str) -> GitError:
    """The :class:`GitError` for a git process that could not run or finish."""
    if isinstance(exc, subprocess.TimeoutExpired):
        return GitError(f"git {command} did not finish in {exc.timeout:g} s")
    if isinstance(exc, FileNotFoundError):
        return GitError("git is not installed on this machine")
    return GitError(f"git {command} could not run ({type(exc).__name__})")


Syntax = Literal["json", "toml"]
"""How the user wrote the value being validated: a JSON file (a task, a calls file) or TOML
(the host configuration), for the examples of an expected form."""

_EXAMPLES: dict[str, tuple[str, str]] = {
    "argv": ('"argv": ["pytest", "-q"]', 'argv = ["pytest", "-q"]'),
    "setup": (
        '"setup": [["pip", "install", "-e", "."]]',
        'setup = [["pip", "install", "-e", "."]]',
    ),
    "inputs": ('"inputs": ["requirements.txt"]', 'inputs = ["requirements.txt"]'),
    "allowed_paths": ('"allowed_paths": ["src/", "tests/"]', 'allowed_paths = ["src/", "tests/"]'),
    "protected": ('"protected": ["secrets/**"]', 'protected = ["secrets/**"]'),
}
"""A field's example, as JSON and as TOML, shown with a type error of that field."""


def describe_validation(  # noqa: PLR0913 - the error, then keyword-only presentation
    error: ValidationError,
    *,
    subject: str,
    max_items: int = 5,
    max_chars: int = 500,
    names: Mapping[str, str] | None = None,
    model: object = None,
    syntax: Syntax = "json",
) -> str:
    """``where: problem; ...`` for the first ``max_items`` problems of a pydantic
    ``ValidationError``, cut at ``max_chars``. ``where`` is the dotted field path (``subject``
    for the whole value); with ``names`` only the top field is named, as ``names`` says (a
    setting's environment variable, say). Never echoes an input value.

    With ``model`` (the model validated, or the type annotation a ``TypeAdapter``
    validated, such as ``dict[str, CheckSpec]``), the path is the user's own (a union's internal
    tag, such as an environment given inline, is left out, and fields by their alias), an
    unknown key gets the closest known name (``did you mean 'allowed_paths'?``, else the
    known names), and a value of the wrong type says the form expected, with an example in
    ``syntax`` for the usual fields (``argv: expected a list of strings, e.g. argv =
    ["pytest", "-q"]``)."""
    parts = []
    for item in error.errors()[:max_items]:
        loc = item["loc"]
        problem = _plain(item)
        if names is not None:
            field = str(loc[0]) if loc else ""
            where = names.get(field, field or subject)
        elif model is not None:
            path, known, expected = _user_path(model, loc)
            where = ".".join(path)[:100] or subject
            problem = _problem(item, path, known, expected, syntax)
        else:
            where = ".".join(str(p) for p in loc)[:100] or subject
        parts.append(f"{where}: {problem}")
    return "; ".join(parts)[:max_chars]


def _problem(
    item: Mapping[str, Any], path: list[str], known: list[str], expected: object, syntax: Syntax
) -> str:
    """The problem of one error in the user's words (see :func:`describe_validation`)."""
    kind = str(item.get("type", ""))
    name = path[-1] if path else ""
    if kind == "extra_forbidden":
        import difflib

        close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
        if close:
            return f"unknown key; did you mean {close[0]!r}?"
        shown = ", ".join(sorted(known)[:20])
        return f"unknown key (known keys: {shown})" if known else "unknown key"
    if kind.endswith("_type") or kind in {"int_parsing", "float_parsing", "int_from_float"}:
        form = _form(expected, syntax)
        if form:
            example = _EXAMPLES.get(name)
            shown = f", e.g. {example[0 if syntax == 'json' else 1]}" if example else ""
            return f"expected {form}{shown}"
    return _plain(item)


def _plain(item: Mapping[str, Any]) -> str:
    """The problem's text without pydantic's ``Value error, `` (or ``Assertion failed, ``)
    prefix: a validator's own message, as it wrote it."""
    text = str(item.get("msg", ""))
    if item.get("type") in {"value_error", "assertion_error"}:
        for prefix in ("Value error, ", "Assertion failed, "):
            text = text.removeprefix(prefix)
    return text


def _form(tp: object, syntax: Syntax) -> str:
    """How a value of the annotation ``tp`` is written: ``a list of strings``, ``a whole
    number``, ``an object``; empty when there is no plain word for it."""
    from pydantic import BaseModel

    tp = _unwrap(tp)
    origin, args = get_origin(tp), get_args(tp)
    table = "an object" if syntax == "json" else "a table"
    if origin in {UnionType, Union}:
        forms = [f for f in (_form(a, syntax) for a in args if a is not type(None)) if f]
        return " or ".join(dict.fromkeys(forms))
    if origin in {list, tuple, set, frozenset}:
        inner = _form(args[0], syntax) if args else ""
        plural = {
            "a string": "strings",
            "a list of strings": "lists of strings",
            "a whole number": "whole numbers",
        }.get(inner)
        return f"a list of {plural}" if plural else "a list"
    if origin is dict or (isinstance(tp, type) and issubclass(tp, BaseModel)):
        return table
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    simple = {str: "a string", bool: "true or false", int: "a whole number", float: "a number"}
    return simple.get(tp, "") if isinstance(tp, type) else ""


def _unwrap(tp: object) -> object:
    """``tp`` without ``Annotated``'s metadata."""
    while get_origin(tp) is Annotated:
        tp = get_args(tp)[0]
    return tp


def _tags(tp: object) -> dict[str, object]:
    """The members of a tagged union (``Annotated[X, Tag("name")] | ...``) by tag."""
    from pydantic import Tag

    out: dict[str, object] = {}
    for member in get_args(tp):
        if get_origin(member) is Annotated:
            for meta in get_args(member)[1:]:
                if isinstance(meta, Tag):
                    out[meta.tag] = member
    return out


def _user_path(model: object, loc: tuple[int | str, ...]) -> tuple[list[str], list[str], object]:
    """The location ``loc`` as the user wrote it (union tags left out, fields by alias),
    the keys known where it ends (for an unknown key: its object's), and the annotation of
    the value there."""
    from pydantic import BaseModel

    path: list[str] = []
    known: list[str] = []
    tp: object = model
    for index, part in enumerate(loc):
        last = index == len(loc) - 1
        tp, tag = _through_union(tp, str(part), last=last)
        if tag:  # an internal tag: not the user's
            continue
        path.append(str(part))
        origin, args = get_origin(tp), get_args(tp)
        if origin in {list, tuple, set, frozenset}:
            tp = args[0] if args else object
        elif origin is dict:
            tp = args[1] if len(args) > 1 else object
        elif isinstance(tp, type) and issubclass(tp, BaseModel):
            fields = {(f.alias or n): f for n, f in tp.model_fields.items()}
            field = fields.get(str(part)) or tp.model_fields.get(str(part))
            if field is not None:
                path[-1] = field.alias or str(part)
            elif last:
                known = list(fields)
            tp = field.annotation if field is not None else object
        else:
            tp = object
    return path, known, _unwrap_optional(tp)


def _through_union(tp: object, part: str, *, last: bool) -> tuple[object, bool]:
    """``tp`` unwrapped (``Annotated``, an optional's ``None``) for the location part
    ``part``, and whether ``part`` is a tagged union's internal tag: then the member it
    names, or the union itself when ``part`` ends the location (the value fits none)."""
    tp = _unwrap_optional(tp)
    tagged = _tags(tp) if get_origin(tp) in {UnionType, Union} else {}
    if part in tagged:
        return (tp if last else _unwrap(tagged[part])), True
    return tp, False


def _unwrap_optional(tp: object) -> object:
    tp = _unwrap(tp)
    if get_origin(tp) in {UnionType, Union}:
        plain = [a for a in get_args(tp) if a is not type(None)]
        if len(plain) == 1:
            return _unwrap(plain[0])
    return tp
