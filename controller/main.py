"""The ``patchbox`` command (and ``python3 -m controller``): the CLI, with the other front
doors as two of its commands, ``patchbox mcp`` (the MCP server) and ``patchbox serve`` (the
HTTP service). Each front door is imported only when its command runs."""

from __future__ import annotations

import argparse
import gc
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


def run() -> None:
    """The entry point of ``patchbox``."""
    gc.disable()  # while the command's modules load; resumed by the CLI's run, below
    from controller.cli.main import run as run_cli

    run_cli(DOORS)
