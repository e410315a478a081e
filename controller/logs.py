"""structlog set-up (entry points only) and the redaction processor.

Every log line passes :func:`redact`: values of secret-looking keys are dropped, control and
bidi characters are removed from every string (:func:`controller.tools.text.strip_control`), and any
string that contains an absolute host path under a known private root or the value of a
secret-looking environment variable is masked.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import structlog

from controller.tools.text import strip_control

_SECRET_KEY = re.compile(r"(?i)(key|token|secret|password|passwd|authorization|cookie|credential)")
REDACTED = "[redacted]"


def secret_values() -> list[str]:
    return [v for k, v in os.environ.items() if _SECRET_KEY.search(k) and len(v) >= 6]


def private_roots() -> list[str]:
    roots = [str(Path.home())]
    home = os.environ.get("PATCHBOX_HOME")
    if home:
        roots.append(home)
    return sorted({r for r in roots if r not in ("", "/")}, key=len, reverse=True)


def _scrub(text: str, secrets: list[str], roots: list[str]) -> str:
    # Controls first: a log line is read on a terminal, and an escape or bidi character
    # could split a secret out of reach of the replacement below.
    text = strip_control(text)
    for value in secrets:
        if value in text:
            text = text.replace(value, REDACTED)
    for root in roots:
        if root in text:
            text = text.replace(root, "<path>")
    return text


def redact(_logger: Any, _name: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    secrets = secret_values()
    roots = private_roots()
    for key in list(event):
        value = event[key]
        if _SECRET_KEY.search(key):
            event[key] = REDACTED
        elif isinstance(value, str):
            event[key] = _scrub(value, secrets, roots)
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
