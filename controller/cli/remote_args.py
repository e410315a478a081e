"""The arguments of ``patchbox remote`` (:mod:`controller.cli.remote` runs it), parsed only:
building the parser imports nothing of the service's client."""

from __future__ import annotations

import argparse
from typing import Any

TOKEN_VARIABLE = "PATCHBOX_TOKEN"  # noqa: S105 - the variable's name, not a token
SERVER_VARIABLE = "PATCHBOX_SERVER"


def add_parser(sub: Any, parser_class: type[argparse.ArgumentParser]) -> None:
    """The ``remote`` command and its sub-commands."""
    remote = sub.add_parser(
        "remote", help="jobs on a patchbox service: submit, jobs, show, events, apply, ..."
    )
    commands = remote.add_subparsers(
        dest="remote_command", required=True, parser_class=parser_class
    )

    def command(name: str, what: str, *, job: bool = True) -> argparse.ArgumentParser:
        cmd: argparse.ArgumentParser = commands.add_parser(name, help=what)
        if job:
            cmd.add_argument("job")
        cmd.add_argument(
            "--server", metavar="URL", help=f"the service (default ${SERVER_VARIABLE})"
        )
        cmd.add_argument(
            "--token-file",
            metavar="FILE",
            help=f"read the token from this file (default ${TOKEN_VARIABLE})",
        )
        cmd.add_argument("--json", action="store_true")
        cmd.add_argument(
            "--allow-insecure-http",
            action="store_true",
            help="allow a plain http:// service that is not on loopback (token and diffs in clear)",
        )
        return cmd

    submit = command("submit", "send a job", job=False)
    submit.add_argument("--repo", help="the repository (default: the one the current folder is in)")
    submit.add_argument("--task", required=True, help="the task file")
    submit.add_argument("--calls", help="drive the tools from this calls file")
    submit.add_argument("--include-local-changes", action="store_true")
    submit.add_argument(
        "--bundle",
        action="store_true",
        help="upload the repository's HEAD as a git bundle (the service cannot see the path)",
    )
    submit.add_argument("--wait", action="store_true", help="follow the job to its end")
    submit.add_argument(
        "--no-change-ok",
        action="store_true",
        help="with --wait: exit 0 when the job made no change (else exit 5)",
    )
    command("jobs", "this tenant's jobs", job=False)
    show = command("show", "a job, as run --json prints it")
    show.add_argument("--diff", action="store_true", help="and its diff")
    attest = command("attestations", "a job's signed attestations and the diff they sign")
    attest.add_argument(
        "--out-dir",
        required=True,
        metavar="DIR",
        help="write diff.patch, provenance.intoto.jsonl and the service's provenance.pub",
    )
    events = command("events", "a job's events as they come, until it ends")
    events.add_argument("--last-event-id", type=int, default=0, metavar="N", help="start after N")
    apply = command("apply", "apply a job (a bundle job: to the local repository)")
    apply.add_argument(
        "--repo", help="for a bundle job: the local repository (default: the current folder)"
    )
    apply.add_argument(
        "--task",
        metavar="FILE",
        help="for a bundle job: a local task file whose allowed_paths the diff may write",
    )
    apply.add_argument(
        "--allow-path",
        action="append",
        metavar="PATH",
        help="for a bundle job: a path the diff may write, config paths included (repeatable)",
    )
    apply.add_argument(
        "--merge",
        action="store_true",
        help="for a bundle job: merge files you changed meanwhile three-way",
    )
    revert = command("revert", "undo an applied job (a bundle job: its local apply)")
    revert.add_argument(
        "--repo", help="for a bundle job: undo its apply to this repository only (default: all)"
    )
    command("discard", "drop a job awaiting review, failed or cancelled")
    command("cancel", "cancel a queued or running job")
    command("rebase", "queue a new job that carries a job awaiting review onto its repository now")
