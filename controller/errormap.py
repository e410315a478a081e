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
from typing import TYPE_CHECKING

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


def describe_validation(
    error: ValidationError,
    *,
    subject: str,
    max_items: int = 5,
    max_chars: int = 500,
    names: Mapping[str, str] | None = None,
) -> str:
    """``where: problem; ...`` for the first ``max_items`` problems of a pydantic
    ``ValidationError``, cut at ``max_chars``. ``where`` is the dotted field path (``subject``
    for the whole value); with ``names`` only the top field is named, as ``names`` says (a
    setting's environment variable, say). Never echoes an input value."""
    parts = []
    for item in error.errors()[:max_items]:
        loc = item["loc"]
        if names is not None:
            field = str(loc[0]) if loc else ""
            where = names.get(field, field or subject)
        else:
            where = ".".join(str(p) for p in loc)[:100] or subject
        parts.append(f"{where}: {item['msg']}")
    return "; ".join(parts)[:max_chars]
