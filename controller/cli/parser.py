"""The ``patchbox`` command's arguments: every command and its options, parsed only (the
commands are run by :mod:`controller.cli.main`, and ``mcp`` and ``serve`` by the entry point
:mod:`controller.main`)."""

from __future__ import annotations

import argparse
from typing import Any

from controller.errors import UsageError
from controller.version import version

OUTPUT_DIR_HELP = "write evidence.json, diff.patch, junit.xml and the transcript here (for CI)"
JOB_HELP = "a job id, a prefix of one, or 'last' (the newest job)"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:
        raise UsageError(message)


PRUNE_HELP = "remove ended jobs' records and evidence, or spare sandboxes"


def _prune_args(prune: argparse.ArgumentParser) -> None:
    prune.add_argument("--older-than", metavar="AGE", help="ended jobs older than: 90m, 12h, 7d")
    prune.add_argument(
        "--spares", action="store_true", help="this state directory's spare sandboxes"
    )
    prune.add_argument("--json", action="store_true", help="print JSON instead of text")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="patchbox",
        description="A hardened sandbox for AI coding agents.",
        epilog=(
            "Every command, file format, configuration key, error code and exit code is "
            "described in docs/reference.md."
        ),
    )
    parser.add_argument("--version", action="version", version=f"patchbox {version()}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    doctor = sub.add_parser("doctor", help="is this machine (and a repository) ready?")
    doctor.add_argument("--json", action="store_true", help="print JSON instead of text")
    doctor.add_argument("--repo", help="also check this repository's health")
    doctor.add_argument("--max-local-files", type=int, default=None, metavar="N")
    doctor.add_argument("--max-local-bytes", type=int, default=None, metavar="N")
    doctor.add_argument("--config", help="host configuration (default $PATCHBOX_HOME/config.toml)")
    image = sub.add_parser("image", help="the sandbox image")
    image_sub = image.add_subparsers(dest="image_command", required=True, parser_class=_Parser)
    build = image_sub.add_parser("build", help="build the default sandbox image")
    build.add_argument("--json", action="store_true", help="print JSON instead of text")
    _env_parsers(sub)
    _run_parser(sub)
    _rebase_parser(sub)
    jobs = sub.add_parser("jobs", help="jobs and their states")
    jobs.add_argument("--repo")
    jobs.add_argument(
        "--status", action="append", metavar="STATE", help="only jobs in these states (a,b)"
    )
    jobs.add_argument("--since", metavar="WHEN", help="only jobs created since: 2d, 2026-12-01")
    jobs.add_argument("--json", action="store_true", help="print JSON instead of text")
    _prune_args(sub.add_parser("prune", help=PRUNE_HELP))
    show = sub.add_parser("show", help="summary, ledger, checks, evidence path")
    show.add_argument("job", help=JOB_HELP)
    show.add_argument("--diff", action="store_true")
    show.add_argument(
        "--transcript", action="store_true", help="the conversation: messages, calls, results"
    )
    show.add_argument("--json", action="store_true", help="print JSON instead of text")
    for name, what in (
        ("apply", "apply a job's diff to the work tree"),
        ("revert", "undo an applied job"),
        ("discard", "drop a job awaiting review"),
        ("cancel", "cancel a running job (run by another patchbox process)"),
    ):
        cmd = sub.add_parser(name, help=what)
        cmd.add_argument("job", help=JOB_HELP)
        cmd.add_argument("--json", action="store_true", help="print JSON instead of text")
        if name == "apply":
            cmd.add_argument("--merge", action="store_true", help="three-way merge")
    _mcp_parser(sub)
    demo = sub.add_parser("demo", help="a sandbox on the bundled example repository")
    demo.add_argument("--runtime", choices=["runc", "runsc"], default="runc")
    demo.add_argument("--json", action="store_true", help="print JSON instead of text")
    _serve_parser(sub)
    _add_output_options(parser)
    return parser


def _add_output_options(parser: argparse.ArgumentParser) -> None:
    """``--quiet``, ``--verbose`` and ``--log-format`` on every command (before or after
    its name)."""
    leaves: list[argparse.ArgumentParser] = [parser]
    pending = [parser]
    while pending:
        current = pending.pop()
        for action in current._actions:  # noqa: SLF001 - argparse keeps subparsers there
            if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
                children = list(dict.fromkeys(action.choices.values()))
                leaves += children
                pending += children
    for leaf in leaves:
        group = leaf.add_argument_group("output")
        group.add_argument(
            "--quiet", action="store_true", default=argparse.SUPPRESS, help="no progress lines"
        )
        group.add_argument(
            "--verbose", action="store_true", default=argparse.SUPPRESS, help="info and debug logs"
        )
        group.add_argument(
            "--log-format",
            choices=["console", "json"],
            default=argparse.SUPPRESS,
            help="log lines on stderr (the log file is always JSON)",
        )


def _run_parser(sub: Any) -> None:
    run = sub.add_parser("run", help="one job, to its decision")
    run.add_argument("--repo", help="the repository (default: the one the current folder is in)")
    run.add_argument(
        "--task", help="the task file (with --from: its fields over the earlier job's task)"
    )
    run.add_argument(
        "--from",
        dest="from_job",
        metavar="JOB",
        help="a follow-up: start from JOB's result (awaiting review or applied), its task the "
        "default for this one's",
    )
    run.add_argument("--prompt", help="with --from: the follow-up's prompt")
    run.add_argument(
        "--calls",
        action="append",
        help="drive the tools from this calls file (with --attempts: once for all, or once "
        "per attempt)",
    )
    run.add_argument(
        "--attempts",
        type=int,
        default=1,
        metavar="N",
        help="N attempts of the task from the same baseline, ranked; apply the one you choose",
    )
    run.add_argument(
        "--include-local-changes",
        action="store_true",
        help="include uncommitted changes in the baseline (else a dirty tree is refused)",
    )
    run.add_argument(
        "--trust-repo-config",
        action="store_true",
        help="also read the checks the repository suggests in .patchbox/checks.json",
    )
    run.add_argument(
        "--consent-trusted-auto",
        action="store_true",
        help="consent to the trusted-auto mode of the task (applies without a review)",
    )
    run.add_argument(
        "--runtime",
        choices=["runc", "runsc"],
        default=None,
        help="the container runtime (default: the host configuration's, else runc)",
    )
    run.add_argument(
        "--no-spare", action="store_true", help="start no spare sandbox for the next job"
    )
    run.add_argument(
        "--output-dir",
        metavar="DIR",
        help=OUTPUT_DIR_HELP,
    )
    run.add_argument(
        "--no-change-ok",
        action="store_true",
        help="exit 0 when the job made no change (else exit 5)",
    )
    run.add_argument("--config", help="host configuration (default $PATCHBOX_HOME/config.toml)")
    run.add_argument("--json", action="store_true", help="print JSON instead of text")


def _rebase_parser(sub: Any) -> None:
    rebase = sub.add_parser(
        "rebase",
        help="carry a job awaiting review onto the repository as it is now, as a new job",
    )
    rebase.add_argument("job", help=JOB_HELP)
    rebase.add_argument(
        "--output-dir",
        metavar="DIR",
        help=OUTPUT_DIR_HELP,
    )
    rebase.add_argument("--config", help="host configuration (default $PATCHBOX_HOME/config.toml)")
    rebase.add_argument("--json", action="store_true", help="print JSON instead of text")


def _serve_parser(sub: Any) -> None:
    serve = sub.add_parser("serve", help="the multi-tenant HTTP service (docs/service.md)")
    serve.add_argument("--config", help="host configuration with a [service] table")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8765)
    serve.add_argument("--json", action="store_true", help="print JSON instead of text")
    _remote_parser(sub)
    _provenance_parsers(sub)


def _provenance_parsers(sub: Any) -> None:
    """The ``key`` and ``verify`` commands."""
    key = sub.add_parser("key", help="the key that signs each job's attestations")
    commands = key.add_subparsers(dest="key_command", required=True, parser_class=_Parser)
    init = commands.add_parser(
        "init", help="make a signing key (mode 0600) and print its public key"
    )
    public = commands.add_parser("public", help="print (or write) the signing key's public key")
    for cmd in (init, public):
        cmd.add_argument(
            "--path",
            metavar="FILE",
            help="the private key (default $PATCHBOX_HOME/keys/provenance.key)",
        )
        cmd.add_argument("--json", action="store_true", help="print JSON instead of text")
    init.add_argument("--force", action="store_true", help="replace a key that exists")
    init.add_argument(
        "--algorithm",
        choices=["ed25519", "ecdsa-p256"],
        default="ed25519",
        help="(default ed25519)",
    )
    public.add_argument("--out", metavar="FILE", help="write the PEM public key to FILE")
    verify = sub.add_parser(
        "verify", help="check a diff against its signed attestations, a public key and a policy"
    )
    verify.add_argument("--diff", required=True, metavar="FILE", help="the diff (or patch mail)")
    verify.add_argument(
        "--attestations", required=True, metavar="FILE", help="provenance.intoto.jsonl"
    )
    verify.add_argument("--key", required=True, metavar="FILE", help="the PEM public key")
    verify.add_argument("--policy", metavar="FILE", help="a JSON policy (docs/reference.md)")
    verify.add_argument("--json", action="store_true", help="print JSON instead of text")


def _remote_parser(sub: Any) -> None:
    """``patchbox remote``, the service's client (:mod:`controller.cli.remote`)."""
    from controller.cli.remote_args import add_parser

    add_parser(sub, _Parser)


def _mcp_parser(sub: Any) -> None:
    mcp = sub.add_parser(
        "mcp", help="an MCP server (stdio, or --http PORT on 127.0.0.1): a job per session"
    )
    mcp.add_argument("--repo", help="the repository (default: the one the current folder is in)")
    mcp.add_argument("--task", help="the task file (default: the configured checks and limits)")
    mcp.add_argument(
        "--include-local-changes",
        action="store_true",
        help="include uncommitted changes in the baseline (else a dirty tree is refused)",
    )
    mcp.add_argument(
        "--trust-repo-config",
        action="store_true",
        help="also read the checks the repository suggests in .patchbox/checks.json",
    )
    mcp.add_argument(
        "--runtime",
        choices=["runc", "runsc"],
        default=None,
        help="the container runtime (default: the host configuration's, else runc)",
    )
    mcp.add_argument("--config", help="host configuration (default $PATCHBOX_HOME/config.toml)")
    mcp.add_argument(
        "--http", type=int, metavar="PORT", help="Streamable HTTP on 127.0.0.1:PORT, not stdio"
    )
    mcp.add_argument(
        "--idle-timeout",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="a job with no call for this long ends, releasing its sandbox (default 300)",
    )


def _env_parsers(sub: Any) -> None:
    env = sub.add_parser("env", help="project environments: toolchain and test dependencies")
    env_sub = env.add_subparsers(dest="env_command", required=True, parser_class=_Parser)
    env_build = env_sub.add_parser("build", help="build a task's environment image")
    env_build.add_argument("--task", required=True, help="the task file")
    env_build.add_argument(
        "--repo", help="the repository its inputs come from (default: the current folder's)"
    )
    env_build.add_argument(
        "--include-local-changes",
        action="store_true",
        help="include uncommitted changes in the baseline (else a dirty tree is refused)",
    )
    env_build.add_argument("--config", help="host configuration")
    env_build.add_argument("--json", action="store_true", help="print JSON instead of text")
    env_list = env_sub.add_parser("list", help="environment images on this Docker host")
    env_list.add_argument("--json", action="store_true", help="print JSON instead of text")
    env_show = env_sub.add_parser("show", help="one environment image")
    env_show.add_argument("id", help="its id, tag or key")
    env_show.add_argument("--json", action="store_true", help="print JSON instead of text")
    env_prune = env_sub.add_parser("prune", help="remove environment images no container uses")
    env_prune.add_argument("--json", action="store_true", help="print JSON instead of text")
