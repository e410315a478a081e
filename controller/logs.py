"""Redaction, and the structlog set-up (entry points only).

One rule says which names are secret (:data:`SECRET_NAME`: an environment variable, a log
field, a task's ``env`` entry) and one :class:`Scrubber` makes text safe to show or store:
the log processor :func:`redact`, the evidence, crash reports and the CLI's error lines all
use it. Every log line passes :func:`redact`: values of secret-named keys are dropped, and
every string loses its control and bidi characters, the values of secret-named environment
variables and absolute host paths under a known private root.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import sys
import threading
from collections.abc import Iterable, MutableMapping
from pathlib import Path, PurePosixPath
from typing import Any

import structlog

from controller.text import strip_control

SECRET_NAME = re.compile(
    r"(?i)(key|token|secret|password|passwd|credential|auth(?!or(?!i[sz]ation))|cookie)"
    r"|(^|_)(creds?|pw|pat)(_|$)"
    r"|^(?!(old)?pwd$)(.*_)?[a-z0-9]*(pass|pwd|passphrase)(_|$)"
)
"""A name that looks like it holds a secret: one holding ``key``, ``token``, ``secret``,
``password``, ``passwd``, ``credential``, ``auth`` (``authorization`` too, not ``author``) or
``cookie``; one with a ``_``-separated part that is ``cred``, ``creds``, ``pw`` or ``pat``, or
that ends in ``pass``, ``pwd`` or ``passphrase`` (``PGPASS``, ``DB_PASS``, ``MYSQL_PWD``), but
for ``PWD`` and ``OLDPWD``, the working folders."""
REDACTED = "[redacted]"


def secret_values() -> list[str]:
    """Values of this process's secret-named environment variables (six characters or more:
    shorter ones would mask ordinary words)."""
    return [v for k, v in os.environ.items() if SECRET_NAME.search(k) and len(v) >= 6]


def private_roots() -> list[str]:
    roots = [str(Path.home())]
    home = os.environ.get("PATCHBOX_HOME")
    if home:
        roots.append(home)
    return sorted({r for r in roots if r not in ("", "/")}, key=len, reverse=True)


class Scrubber:
    """Makes every string of a JSON-like value safe to show and store: control and bidi
    characters removed (:func:`controller.text.strip_control`), secrets and host paths
    replaced. Keys are scrubbed like values.

    The repository's parents are host paths too (an error may name the work tree a folder
    is inside): each one of two or more components becomes ``<repo>/..``, ``<repo>/../..``
    and so on. A path is replaced only where its name ends (``/a/b`` not in ``/a/bc``)."""

    def __init__(self, repo: str, secrets: Iterable[str] = (), *, paths: bool = True) -> None:
        """``paths=False`` keeps host paths (the local CLI's own output names the user's
        paths; evidence and crash reports, which may be shared, never do)."""
        self.secrets = sorted(
            {s for s in [*secret_values(), *secrets] if s and len(s) >= 6},
            key=len,
            reverse=True,
        )
        roots = (_repo_roots(repo) + [(r, "<path>") for r in private_roots()]) if paths else []
        self.roots = [
            (re.compile(re.escape(root) + r"(?![\w-]|\.[\w.-])"), mark)
            for root, mark in sorted(roots, key=lambda item: len(item[0]), reverse=True)
        ]

    def text(self, value: str) -> str:
        """``value`` without control or bidi characters (first, so a control cannot split a
        secret out of reach; :func:`controller.text.strip_control`), secrets or host
        paths."""
        value = strip_control(value)
        for secret in self.secrets:
            value = value.replace(secret, REDACTED)
        for pattern, mark in self.roots:
            value = pattern.sub(mark, value)  # marks hold no backslash
        return value

    def value(self, data: Any) -> Any:
        if isinstance(data, str):
            return self.text(data)
        if isinstance(data, dict):
            return {self.text(str(k)): self.value(v) for k, v in data.items()}
        if isinstance(data, (list, tuple)):
            return [self.value(v) for v in data]
        return data


def _repo_roots(repo: str) -> list[tuple[str, str]]:
    path = PurePosixPath(repo)
    if len(path.parts) < 2 or not path.is_absolute():
        return []
    roots = [(repo.rstrip("/"), "<repo>")]
    mark = "<repo>"
    for parent in path.parents:
        mark += "/.."
        if len(parent.parts) < 3:  # "/" and "/tmp" name nobody
            break
        roots.append((str(parent), mark))
    return roots


def redact(_logger: Any, _name: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """The structlog processor: a secret-named field becomes :data:`REDACTED`, every other
    string field is scrubbed by a :class:`Scrubber` that knows no repository."""
    scrub = Scrubber("")
    for key in list(event):
        value = event[key]
        if SECRET_NAME.search(key):
            event[key] = REDACTED
        elif isinstance(value, str):
            event[key] = scrub.text(value)
    return event


_LINE_LOCK = threading.Lock()
LOG_FILE_BYTES = 10 * 1024 * 1024
"""The log file is rotated (one older copy kept) past this size."""


def write_line(text: str) -> None:
    """One whole line to ``sys.stderr`` as it is at that moment (a test or a daemon may swap
    it), in one write under one lock, so progress and log lines never interleave. A closed
    stream loses the line and never raises into the caller."""
    with _LINE_LOCK, contextlib.suppress(ValueError, OSError):
        sys.stderr.write(text + "\n")
        sys.stderr.flush()


class _StderrLogger:
    """Writes each rendered line with :func:`write_line`."""

    def msg(self, message: str) -> None:
        write_line(message)

    log = debug = info = warning = warn = error = critical = exception = fatal = msg


class _FileSink:
    """Appends every event, as one JSON line, to the log file in the state directory
    (rotated past :data:`LOG_FILE_BYTES`); an unwritable file loses the line, nothing else."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __call__(
        self, _logger: Any, _name: str, event: MutableMapping[str, Any]
    ) -> MutableMapping[str, Any]:
        line = json.dumps(dict(event), default=str, sort_keys=True) + "\n"
        with _LINE_LOCK, contextlib.suppress(OSError):
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            with contextlib.suppress(FileNotFoundError):
                if self.path.stat().st_size > LOG_FILE_BYTES:
                    self.path.replace(self.path.with_suffix(".log.1"))
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, line.encode("utf-8", "replace"))
            finally:
                os.close(fd)
        return event


def _below(level: int) -> Any:
    """Drops an event under ``level`` from stderr (after the file sink saw it)."""

    def drop(_logger: Any, name: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
        if logging.getLevelName(name.upper()) < level:
            raise structlog.DropEvent
        return event

    return drop


def configure(
    *, json_output: bool = False, level: int = logging.INFO, log_file: Path | None = None
) -> None:
    """Sends logs at ``level`` and above to stderr (console lines, or JSON lines), and every
    event from debug up to ``log_file`` when given; called once by the CLI."""
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if json_output
        else structlog.dev.ConsoleRenderer(
            colors=False, exception_formatter=structlog.dev.plain_traceback
        )
    )
    processors: list[Any] = [
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso"),
        redact,
    ]
    if log_file is not None:
        processors.append(_FileSink(log_file))
    processors += [_below(level), renderer]
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.DEBUG if log_file is not None else level
        ),
        logger_factory=lambda *_args: _StderrLogger(),
        cache_logger_on_first_use=True,
    )
