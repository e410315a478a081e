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
import logging
import os
import re
import sys
from collections.abc import Iterable, MutableMapping
from pathlib import Path, PurePosixPath
from typing import Any

import structlog

from controller.tools.text import strip_control

SECRET_NAME = re.compile(r"(?i)(key|token|secret|password|passwd|credential|auth|cookie)")
"""A name that looks like it holds a secret (``auth`` covers ``authorization``)."""
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
    characters removed (:func:`controller.tools.text.strip_control`), secrets and host paths
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
        secret out of reach; :func:`controller.tools.text.strip_control`), secrets or host
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


class _StderrLogger:
    """Writes each line to ``sys.stderr`` as it is at that moment (a test or a daemon may swap
    it); a closed stream loses the line and never raises into the caller."""

    def msg(self, message: str) -> None:
        with contextlib.suppress(ValueError, OSError):
            sys.stderr.write(message + "\n")
            sys.stderr.flush()

    log = debug = info = warning = warn = error = critical = exception = fatal = msg


def configure(*, json_output: bool = False, level: int = logging.INFO) -> None:
    """Sends logs to stderr; called once by the CLI."""
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if json_output
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso"),
            redact,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=lambda *_args: _StderrLogger(),
        cache_logger_on_first_use=True,
    )
