"""Crash reports: what an unexpected exception leaves behind instead of a bare traceback.

A report is a text file under ``$PATCHBOX_HOME/crash/``: when, which versions, what was being
done, and the traceback, scrubbed like the evidence (no secret, no environment value, no path
of the user's repository). The user sees one line naming it.
"""

from __future__ import annotations

import os
import platform
import sys
import time
import traceback
import uuid
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path

from controller.errormap import map_error, mapped_class
from controller.errors import InternalError, PatchboxError
from controller.logs import Scrubber
from controller.paths import patchbox_home

_VERSIONED = ("patchbox", "docker", "pydantic", "httpx", "structlog")
MAX_REPORTS = 100
"""The newest reports kept; older ones are removed when a new one is written."""


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def write_report(
    exc: BaseException, *, context: str, repo: str = "", secrets: Iterable[str] = ()
) -> str:
    """Writes the report of ``exc`` and returns its path relative to ``$PATCHBOX_HOME``.

    Never raises: if the report cannot be written, the returned name says so."""
    scrub = Scrubber(repo, secrets)
    now = time.time_ns()
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now // 1_000_000_000))
    name = f"{stamp}.{now % 1_000_000_000:09d}-{os.getpid()}-{uuid.uuid4().hex[:6]}.txt"
    lines = [
        f"patchbox crash report, {time.strftime('%Y-%m-%d %H:%M:%S %z')}",
        f"context: {context}",
        f"python: {sys.version.split()[0]} on {platform.platform(terse=True)}",
        *(f"{pkg}: {_version(pkg)}" for pkg in _VERSIONED),
        "",
        *traceback.format_exception(exc),
    ]
    text = scrub.text("\n".join(line.rstrip("\n") for line in lines) + "\n")
    try:
        folder = patchbox_home() / "crash"
        folder.mkdir(mode=0o700, exist_ok=True)
        path = folder / name
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8", errors="backslashreplace") as out:
            out.write(text)
    except OSError as err:
        return f"(not written: {err.strerror})"
    _prune(folder)
    return f"crash/{name}"


def _prune(folder: Path) -> None:
    """Keeps the newest :data:`MAX_REPORTS` reports (names sort by time)."""
    try:
        reports = sorted(p for p in folder.iterdir() if p.suffix == ".txt")
    except OSError:
        return
    for old in reports[:-MAX_REPORTS]:
        old.unlink(missing_ok=True)


def internal_message(exc: BaseException, report: str) -> str:
    """The one line a user sees for an unexpected exception."""
    return (
        f"an unexpected error ({type(exc).__name__}) stopped patchbox; the crash report is "
        f"{report} in the state directory (PATCHBOX_HOME): please include it in a bug report"
    )


def internal_error(
    exc: BaseException, *, context: str, repo: str = "", secrets: Iterable[str] = ()
) -> InternalError:
    """The :class:`InternalError` of an unexpected exception: its report written
    (:func:`write_report`), its message the one line a user sees, its cause ``exc``."""
    report = write_report(exc, context=context, repo=repo, secrets=secrets)
    error = InternalError(internal_message(exc, report), report=report)
    error.__cause__ = exc
    return error


def failure_of(
    exc: BaseException, *, context: str, repo: str = "", secrets: Iterable[str] = ()
) -> PatchboxError:
    """What an exception that nothing below expected becomes: a docker-py or transport
    error that was not translated where it was raised is still the Docker engine's failure
    (``SANDBOX_FAILED`` for an engine that went away under the job, no report); anything
    else is an :func:`internal_error`, its report written."""
    if not isinstance(exc, PatchboxError) and mapped_class(exc) is not None:
        return map_error(exc, context)
    return internal_error(exc, context=context, repo=repo, secrets=secrets)
