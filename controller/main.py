"""The ``patchbox`` command (and ``python3 -m controller``): the CLI, with the other front
doors as two of its commands, ``patchbox mcp`` (the MCP server) and ``patchbox serve`` (the
HTTP service). Each front door is imported only when its command runs."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from controller.cli.main import Door, settle_leftovers
from controller.cli.main import run as run_cli

Progress = Callable[[str], None]


def mcp(args: argparse.Namespace, progress: Progress) -> int:
    """``patchbox mcp``: serves until the client goes or a signal (``docs/mcp.md``); nothing
    but the protocol reaches stdout."""
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
    run_cli(DOORS)
