"""The ``patchbox`` command line.

Exit codes: 0 success, 1 a job or check failed, 2 bad usage, 3 the environment is not ready,
70 an internal error (``INTERNAL_ERROR``, with a crash report), 130, 143 and 129 after a job
was cancelled by SIGINT, SIGTERM or SIGHUP.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from controller.errors import (
    ConflictError,
    ExitCode,
    InternalError,
    NotReadyError,
    PatchboxError,
    UsageError,
    exit_code_for_error,
)

if TYPE_CHECKING:
    from controller.repo.health import HealthReport


_STARTED = time.monotonic()
_QUIET = False


def _progress(message: str) -> None:
    """One progress line on stderr with the time since the command started (none with
    ``--quiet``); whole lines, never interleaved with log lines."""
    if _QUIET:
        return
    from controller.logs import write_line
    from controller.text import visible

    write_line(visible(f"patchbox: [{time.monotonic() - _STARTED:6.1f}s] {message}"))


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:
        raise UsageError(message)


def version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("patchbox")
    except PackageNotFoundError:
        return "unknown (not installed)"


def _parser() -> argparse.ArgumentParser:
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
    doctor.add_argument("--json", action="store_true")
    doctor.add_argument("--repo", help="also check this repository's health")
    doctor.add_argument("--max-local-files", type=int, default=None, metavar="N")
    doctor.add_argument("--max-local-bytes", type=int, default=None, metavar="N")
    doctor.add_argument("--config", help="host configuration (default $PATCHBOX_HOME/config.toml)")
    image = sub.add_parser("image", help="the sandbox image")
    image_sub = image.add_subparsers(dest="image_command", required=True, parser_class=_Parser)
    build = image_sub.add_parser("build", help="build the default sandbox image")
    build.add_argument("--json", action="store_true")
    _env_parsers(sub)
    run = sub.add_parser("run", help="one job, to its decision")
    run.add_argument("--repo", required=True)
    run.add_argument("--task", required=True, help="the task file")
    run.add_argument("--calls", help="drive the tools from this calls file")
    run.add_argument("--include-local-changes", action="store_true")
    run.add_argument("--trust-repo-config", action="store_true")
    run.add_argument("--consent-trusted-auto", action="store_true")
    run.add_argument("--runtime", choices=["runc", "runsc"], default=None)
    run.add_argument(
        "--no-spare", action="store_true", help="start no spare sandbox for the next job"
    )
    run.add_argument(
        "--output-dir",
        metavar="DIR",
        help="write evidence.json, diff.patch, junit.xml and the transcript here (for CI)",
    )
    run.add_argument("--config", help="host configuration (default $PATCHBOX_HOME/config.toml)")
    run.add_argument("--json", action="store_true")
    jobs = sub.add_parser("jobs", help="jobs and their states")
    jobs.add_argument("--repo")
    jobs.add_argument(
        "--status", action="append", metavar="STATE", help="only jobs in these states (a,b)"
    )
    jobs.add_argument("--since", metavar="WHEN", help="only jobs created since: 2d, 2026-12-01")
    jobs.add_argument("--json", action="store_true")
    prune = sub.add_parser("prune", help="remove ended jobs' records and evidence")
    prune.add_argument("--older-than", required=True, metavar="AGE", help="90m, 12h, 7d, 2w")
    prune.add_argument("--json", action="store_true")
    show = sub.add_parser("show", help="summary, ledger, checks, evidence path")
    show.add_argument("job")
    show.add_argument("--diff", action="store_true")
    show.add_argument(
        "--transcript", action="store_true", help="the conversation: messages, calls, results"
    )
    show.add_argument("--json", action="store_true")
    for name, what in (
        ("apply", "apply a job's diff to the work tree"),
        ("revert", "undo an applied job"),
        ("discard", "drop a job awaiting review"),
    ):
        cmd = sub.add_parser(name, help=what)
        cmd.add_argument("job")
        cmd.add_argument("--json", action="store_true")
        if name == "apply":
            cmd.add_argument("--merge", action="store_true", help="three-way merge")
    _mcp_parser(sub)
    demo = sub.add_parser("demo", help="a sandbox on the bundled example repository")
    demo.add_argument("--runtime", choices=["runc", "runsc"], default="runc")
    demo.add_argument("--json", action="store_true")
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
            "--verbose", action="store_true", default=argparse.SUPPRESS, help="debug logs"
        )
        group.add_argument(
            "--log-format",
            choices=["console", "json"],
            default=argparse.SUPPRESS,
            help="log lines on stderr (the log file is always JSON)",
        )


def _serve_parser(sub: Any) -> None:
    serve = sub.add_parser("serve", help="the multi-tenant HTTP service (docs/service.md)")
    serve.add_argument("--config", help="host configuration with a [service] table")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8765)
    serve.add_argument("--json", action="store_true")
    _remote_parser(sub)


def _remote_parser(sub: Any) -> None:
    """``patchbox remote``, the service's client (:mod:`controller.cli.remote`)."""
    from controller.cli.remote import add_parser

    add_parser(sub, _Parser)


def _mcp_parser(sub: Any) -> None:
    mcp = sub.add_parser(
        "mcp", help="an MCP server (stdio, or --http PORT on 127.0.0.1): a job per session"
    )
    mcp.add_argument("--repo", required=True)
    mcp.add_argument("--task", help="the task file (default: the configured checks and limits)")
    mcp.add_argument("--include-local-changes", action="store_true")
    mcp.add_argument("--trust-repo-config", action="store_true")
    mcp.add_argument("--runtime", choices=["runc", "runsc"], default=None)
    mcp.add_argument("--config", help="host configuration (default $PATCHBOX_HOME/config.toml)")
    mcp.add_argument(
        "--http", type=int, metavar="PORT", help="Streamable HTTP on 127.0.0.1:PORT, not stdio"
    )


def _env_parsers(sub: Any) -> None:
    env = sub.add_parser("env", help="project environments: toolchain and test dependencies")
    env_sub = env.add_subparsers(dest="env_command", required=True, parser_class=_Parser)
    env_build = env_sub.add_parser("build", help="build a task's environment image")
    env_build.add_argument("--task", required=True, help="the task file")
    env_build.add_argument("--repo", required=True, help="the repository its inputs come from")
    env_build.add_argument("--include-local-changes", action="store_true")
    env_build.add_argument("--config", help="host configuration")
    env_build.add_argument("--json", action="store_true")
    env_list = env_sub.add_parser("list", help="environment images on this Docker host")
    env_list.add_argument("--json", action="store_true")
    env_show = env_sub.add_parser("show", help="one environment image")
    env_show.add_argument("id", help="its id, tag or key")
    env_show.add_argument("--json", action="store_true")
    env_prune = env_sub.add_parser("prune", help="remove environment images no container uses")
    env_prune.add_argument("--json", action="store_true")


def _emit(data: dict[str, Any], *, as_json: bool, text: str) -> None:
    """Prints the result; a closed terminal (SIGHUP) or pipe (``| head``) loses it, nothing
    else: stdout then points at /dev/null, so the interpreter's last flush is quiet too.

    Text goes through :func:`controller.text.visible`: a control, format or bidi
    character (from a diff, a service, a file name) prints as an escape, never as itself.
    JSON is ASCII: every such character (and all other non-ASCII) is a ``\\u`` escape."""
    from controller.text import visible

    try:
        if as_json:
            print(json.dumps(data, indent=2, sort_keys=True, ensure_ascii=True), flush=True)
        else:
            print(visible(text), flush=True)
    except OSError:
        _quiet_stdout()


def _quiet_stdout() -> None:
    import os

    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def _doctor(args: argparse.Namespace) -> int:
    from controller.cli.doctor import diagnose

    report = diagnose(config_path=Path(args.config) if args.config else None)
    lines = [f"ready: {'yes' if report['ready'] else 'no'}"]
    lines.append(f"state: {report['home']}")
    lines.append(f"config: {report['config'] or 'none (defaults)'}")
    prov = report["provider"]
    if prov["configured"]:
        key = "set" if prov["key_set"] else "not set"
        lines.append(
            f"provider: {prov['model']} at {prov['base_url']} (key {prov['key_variable']} {key})"
        )
    else:
        lines.append(
            "provider: not configured (set PATCHBOX_MODEL and OPENAI_BASE_URL, or [provider])"
        )
    if report.get("docker"):
        d = report["docker"]
        runtimes = ", ".join(d["runtimes"])
        lines.append(f"docker: {d['server_version']} (API {d['api_version']}), runtimes {runtimes}")
    lines.append(f"git: {report.get('git') or 'missing'}")
    if "image" in report:
        img = report["image"]
        lines.append(
            f"image: {img['tag'] or 'not built'} ({'ready' if img['ready'] else 'missing'})"
        )
    if "runsc" in report:
        r = report["runsc"]
        state = (
            "works" if r.get("works") else ("registered" if r["registered"] else "not registered")
        )
        lines.append(f"gVisor (runsc): {state}")
    if "spares" in report:
        wanted = report.get("spare_sandboxes", "?")
        lines.append(f"spare sandboxes: {len(report['spares'])} (spare_sandboxes = {wanted})")
    lines += [f"problem: {p}" for p in report["problems"]]
    lines += [f"to do: {a}" for a in report["advice"]]
    repo_ok = True
    if args.repo is not None:
        health = _repo_health(args)
        report["repository"] = health.model_dump(mode="json")
        repo_ok = health.ok
        lines += _health_lines(health)
    _emit(report, as_json=args.json, text="\n".join(lines))
    if not report["ready"]:
        return ExitCode.NOT_READY
    return ExitCode.OK if repo_ok else ExitCode.FAILED


def _repo_health(args: argparse.Namespace) -> HealthReport:
    from pathlib import Path

    from controller.repo.health import SnapshotLimits, check_health

    fields = {
        k: v
        for k, v in (("max_files", args.max_local_files), ("max_bytes", args.max_local_bytes))
        if v is not None
    }
    try:
        limits = SnapshotLimits(**fields)
    except ValueError as exc:
        raise UsageError("--max-local-files and --max-local-bytes must be >= 0") from exc
    return check_health(Path(args.repo), limits)


def _health_lines(health: HealthReport) -> list[str]:
    c = health.counts
    where = f" ({health.kind}, HEAD {health.head[:12]})" if health.head else ""
    changes = f"{c.staged_files} staged, {c.unstaged_files} unstaged, {c.untracked_files}"
    lines = [
        f"repository: {health.repo}: {'ok' if health.ok else 'blocked'}{where}",
        f"local changes: {changes} untracked files; {c.local_bytes} bytes",
    ]
    lines += [f"blocked: {r.code}: {r.detail}" for r in health.reasons]
    if health.submodules:
        lines.append(f"submodules (not entered): {', '.join(health.submodules)}")
    return lines


def _image_build(args: argparse.Namespace) -> int:
    from controller.sandbox.dockerclient import connect
    from controller.sandbox.image import ImageBuilder

    info = ImageBuilder(connect(), _progress).ensure()
    data = {
        "tag": info.tag,
        "image_id": info.image_id,
        "base": info.base,
        "base_source": info.base_source,
        "built": info.built,
        "seconds": round(info.seconds, 2),
    }
    state = "built" if info.built else "up to date"
    _emit(
        data, as_json=args.json, text=f"{info.tag} {state} (base {info.base}, {info.base_source})"
    )
    return ExitCode.OK


def _env(args: argparse.Namespace) -> int:
    from controller.cli import envs

    if args.env_command == "build":
        code, data, text = envs.cmd_env_build(args, _progress)
    else:
        handler = {
            "list": envs.cmd_env_list,
            "show": envs.cmd_env_show,
            "prune": envs.cmd_env_prune,
        }[args.env_command]
        code, data, text = handler(args)
    _emit(data, as_json=args.json, text=text)
    return code


def _demo(args: argparse.Namespace) -> int:
    from controller.cli.demo.run import run_demo

    result = run_demo(_progress, runtime=args.runtime)
    lines = [f"job {result['job_id']}: {result['status']} ({result['runtime']})"]
    lines += [
        f"- turn {c['turn']} {c['name']}: {'ok' if c['ok'] else c['error_code']}"
        for c in result["tool_calls"]
    ]
    lines += [f"check {c['id']}: {c['status']} ({c['duration_ms']} ms)" for c in result["checks"]]
    lines.append(result["diff"].rstrip())
    lines.append(f"repository: {result['repo']}")
    lines.append("next: " + "; ".join(result["next"]))
    lines.append(f"evidence: {result['evidence']}")
    _emit(result, as_json=args.json, text="\n".join(lines))
    return ExitCode.OK if result["status"] == "awaiting_review" else ExitCode.FAILED


def _serve(args: argparse.Namespace) -> int:
    from controller.service.app import serve

    serve(Path(args.config) if args.config else None, args.host, args.port)
    return ExitCode.OK


def _remote(args: argparse.Namespace) -> int:
    """``patchbox remote``: the job commands against a service (``docs/service.md``)."""
    from controller.cli.remote import run

    code, data, text = run(args, _progress)
    if data is not None:
        _emit(data, as_json=args.json, text=text)
    return code


def _mcp(args: argparse.Namespace) -> int:
    """``patchbox mcp``: serves until the client goes or a signal (``docs/mcp.md``); nothing
    but the protocol reaches stdout."""
    from controller.mcp.serve import serve

    _settle()
    return serve(args, _progress)


def _settle() -> None:
    """Cleans up after controllers that are gone before any job command (see
    :func:`controller.cli.commands.settle`); without a daemon only the job records are settled."""
    from controller.cli import commands
    from controller.sandbox.dockerclient import connect

    try:
        client = connect(timeout=30.0)
    except NotReadyError:
        commands.settle(None)
        return
    try:
        commands.settle(client)
    finally:
        client.close()


def _job_command(args: argparse.Namespace) -> int:
    from controller.cli import commands

    _settle()
    if args.command == "run":
        code, data, text = commands.cmd_run(args, _progress)
    else:
        handler = {
            "jobs": commands.cmd_jobs,
            "prune": commands.cmd_prune,
            "show": commands.cmd_show,
            "apply": commands.cmd_apply,
            "revert": commands.cmd_revert,
            "discard": commands.cmd_discard,
        }[args.command]
        code, data, text = handler(args)
    _emit(data, as_json=args.json, text=text)
    return code


def _output_settings(args: argparse.Namespace) -> tuple[bool, int]:
    """(quiet, the stderr log level) from ``--quiet`` and ``--verbose``."""
    quiet, verbose = bool(getattr(args, "quiet", False)), bool(getattr(args, "verbose", False))
    if quiet and verbose:
        msg = "--quiet and --verbose exclude each other"
        raise UsageError(msg)
    if quiet:
        return True, logging.WARNING
    return False, logging.DEBUG if verbose else logging.INFO


def exit_code_of(exc: PatchboxError) -> int:
    """The process exit code for an error that ends a command."""
    if isinstance(exc, UsageError):
        return ExitCode.USAGE
    if isinstance(exc, NotReadyError):
        return ExitCode.NOT_READY
    if isinstance(exc, InternalError):
        return ExitCode.INTERNAL
    return exit_code_for_error(str(exc.code))


def main(argv: Sequence[str] | None = None) -> int:
    from controller.logs import configure
    from controller.paths import patchbox_home

    global _QUIET
    configure(log_file=patchbox_home() / "logs" / "patchbox.log")
    as_json = "--json" in (argv if argv is not None else sys.argv[1:])
    args: argparse.Namespace | None = None
    try:
        args = _parser().parse_args(argv)
        _QUIET, level = _output_settings(args)
        configure(
            json_output=getattr(args, "log_format", "console") == "json",
            level=level,
            log_file=patchbox_home() / "logs" / "patchbox.log",
        )
        structlog.get_logger(__name__).debug(
            "command", command=args.command, version=version(), pid=os.getpid()
        )
        handlers = {
            "doctor": _doctor,
            "image": _image_build,
            "env": _env,
            "demo": _demo,
            "mcp": _mcp,
        }
        handlers["serve"] = _serve
        handlers["remote"] = _remote
        if args.command in handlers:
            return handlers[args.command](args)
        return _job_command(args)
    except PatchboxError as exc:
        extra: dict[str, Any] = {}
        if isinstance(exc, ConflictError):  # each file and why, never a merge's contents
            extra["conflicts"] = [c.model_dump(exclude={"detail"}) for c in exc.conflicts]
        _report_error(str(exc.code), exc.message, args, as_json=as_json, extra=extra)
        _failure_artifacts(args, str(exc.code), exc.message)
        return exit_code_of(exc)
    except KeyboardInterrupt:
        with contextlib.suppress(OSError):
            print("patchbox: cancelled", file=sys.stderr)
        return 130
    except Exception as exc:  # never a bare traceback: the error contract and a report
        from controller.crash import internal_message, write_report

        report = write_report(
            exc, context=f"command {getattr(args, 'command', None)}", repo=_repo_root(args)
        )
        message = internal_message(exc, report)
        _report_error("INTERNAL_ERROR", message, args, as_json=as_json)
        _failure_artifacts(args, "INTERNAL_ERROR", message)
        return ExitCode.INTERNAL


def _failure_artifacts(args: argparse.Namespace | None, code: str, message: str) -> None:
    """``run --output-dir`` that ended before its job: a failing JUnit case, never none."""
    folder = getattr(args, "output_dir", None)
    if not folder:
        return
    from controller.cli.artifacts import write_failure
    from controller.logs import Scrubber

    write_failure(Path(folder), code, Scrubber(_repo_root(args)).text(message))


def _repo_root(args: argparse.Namespace | None) -> str:
    repo = getattr(args, "repo", None)
    return str(Path(repo).resolve()) if repo else ""


def _report_error(
    code: str,
    message: str,
    args: argparse.Namespace | None,
    *,
    as_json: bool,
    extra: dict[str, Any] | None = None,
) -> None:
    """The error contract: ``{"error": {code, message}}`` on stdout with ``--json``, one
    line on stderr always; messages scrubbed of secrets (the user's own paths stay)."""
    from controller.logs import Scrubber
    from controller.text import visible

    message = Scrubber(_repo_root(args), paths=False).text(message)
    with contextlib.suppress(OSError):
        if as_json:
            error = {"code": code, "message": message}
            if extra:
                error.update(Scrubber(_repo_root(args), paths=False).value(extra))
            print(json.dumps({"error": error}, ensure_ascii=True))
        print(visible(f"patchbox: error {code}: {message}"), file=sys.stderr)


def run() -> None:
    """The command's entry point (``patchbox``, ``python3 -m controller``): :func:`main`, then
    the end of the process as the interpreter would make it, without its last step.

    Once ``main`` has returned, nothing is left to do but what the interpreter does at exit:
    run the threading module's exit hooks and wait for the threads that are not daemons
    (``threading._shutdown``, as the interpreter calls it), run the ``atexit`` handlers
    (logging's shutdown among them), flush standard output and error. Those are done here,
    in that order, and the process then ends with :func:`os._exit`, which skips only the
    teardown of every module and object (60 to 200 ms for the modules a job imports, and
    nothing in it that writes anywhere: files are written through ``with`` blocks or raw
    descriptors).
    An exception out of ``main`` (``SystemExit`` from argument parsing among them) ends the
    process the usual way."""
    import atexit
    import threading

    code = main()
    # The interpreter's own first steps at exit, in its order: the threading module's exit
    # hooks (a thread pool's workers are told to stop there), then every thread that is not
    # a daemon joined, then the atexit handlers.
    threading._shutdown()  # type: ignore[attr-defined]  # noqa: SLF001
    atexit._run_exitfuncs()  # noqa: SLF001
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a reader gone (``| head``): quiet
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    run()
