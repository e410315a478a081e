"""The ``patchbox`` command (and ``python3 -m controller``): the CLI, with the other front
doors as two of its commands, ``patchbox mcp`` (the MCP server) and ``patchbox serve`` (the
HTTP service). Each front door is imported only when its command runs."""

from __future__ import annotations

import argparse
import gc
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from controller.cli.main import Door

Progress = Callable[[str], None]


def mcp(args: argparse.Namespace, progress: Progress) -> int:
    """``patchbox mcp``: serves until the client goes or a signal (``docs/mcp.md``); nothing
    but the protocol reaches stdout."""
    from controller.cli.main import settle_leftovers
    from controller.mcp.serve import serve

    settle_leftovers()
    return serve(args, progress)


def serve(args: argparse.Namespace, _progress: Progress) -> int:
    """``patchbox serve``: the HTTP service until SIGINT or SIGTERM (``docs/service.md``)."""
    from controller.errors import ExitCode
    from controller.service.app import serve as serve_http

    serve_http(Path(args.config) if args.config else None, args.host, args.port)
    return ExitCode.OK


DOORS: dict[str, Door] = {"mcp": mcp, "serve": serve}

CONSOLE_EXTRAS = ("rich", "better_exceptions", "colorama")
"""What structlog looks for when it is first imported, to pick its console's traceback format
and colours. patchbox's console lines are plain text, the same whatever else is installed
(``logs.configure``), so the command's start does not load them (rich alone is about 50 ms of
every command's start where it is installed)."""


def import_logging() -> None:
    """Imports structlog with :data:`CONSOLE_EXTRAS` out of its sight; any of them can still
    be imported afterwards by whatever needs it."""
    hidden = [name for name in CONSOLE_EXTRAS if name not in sys.modules]
    for name in hidden:
        sys.modules[name] = None  # type: ignore[assignment]  # "not installed", for now
    try:
        import structlog  # noqa: F401 - loaded here, before the CLI's modules
    finally:
        for name in hidden:
            if name in sys.modules and sys.modules[name] is None:
                del sys.modules[name]


def run() -> None:
    """The entry point of ``patchbox``."""
    gc.disable()  # while the command's modules load; resumed by the CLI's run, below
    import_logging()
    from controller.cli.main import run as run_cli

    run_cli(DOORS)
