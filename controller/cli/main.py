"""The ``patchbox`` command line.

Exit codes: 0 success, 1 a job or check failed, 2 bad usage, 3 the environment is not ready,
70 an internal error (``INTERNAL_ERROR``, with a crash report), 130, 143 and 129 after a job
was cancelled by SIGINT, SIGTERM or SIGHUP.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from controller.cli.parser import build_parser
from controller.errors import (
    ConflictError,
    ExitCode,
    InternalError,
    NotARepositoryError,
    NotReadyError,
    PatchboxError,
    UsageError,
    exit_code_for_error,
)
from controller.version import version

if TYPE_CHECKING:
    from controller.cli.commands import Outcome
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


def _emit(data: Mapping[str, object], *, as_json: bool, text: str) -> None:
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
    from controller.cli.doctor import diagnose, doctor_text

    report = diagnose(config_path=Path(args.config) if args.config else None)
    lines = doctor_text(report)
    data = report.data()
    repo_ok = True
    if args.repo is not None:
        health = _repo_health(args)
        data["repository"] = health.model_dump(mode="json")
        repo_ok = health.ok
        lines += _health_lines(health)
    _emit(data, as_json=args.json, text="\n".join(lines))
    if not report.ready:
        return report.exit_code
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


def _provenance(args: argparse.Namespace) -> int:
    from controller.cli import provenance

    handler = provenance.cmd_key if args.command == "key" else provenance.cmd_verify
    code, data, text = handler(args)
    _emit(data, as_json=args.json, text=text)
    return code


def _demo(args: argparse.Namespace) -> int:
    from controller.cli.demo.run import run_demo

    result = run_demo(_progress, runtime=args.runtime)
    lines = [f"job {result['job_id']}: {result['status']} ({result['runtime']})"]
    lines += [
        f"- turn {c['turn']} {c['name']}: "
        + str(c.get("verdict") or ("ok" if c["ok"] else c["error_code"]))
        for c in result["tool_calls"]
    ]
    lines += [f"check {c['id']}: {c['status']} ({c['duration_ms']} ms)" for c in result["checks"]]
    lines += [
        f"check {c['id']} before -> after: {c['change']} ({c['before']} -> {c['after']})"
        for c in result["check_changes"]
    ]
    lines.append(result["diff"].rstrip())
    lines.append(f"repository: {result['repo']}")
    lines.append("next: " + "; ".join(result["next"]))
    lines.append(f"evidence: {result['evidence']}")
    _emit(result, as_json=args.json, text="\n".join(lines))
    return ExitCode.OK if result["status"] == "awaiting_review" else ExitCode.FAILED


def _remote(args: argparse.Namespace) -> int:
    """``patchbox remote``: the job commands against a service (``docs/service.md``)."""
    from controller.cli.remote import run

    code, data, text = run(args, _progress)
    if data is not None:
        _emit(data, as_json=args.json, text=text)
    return code


def settle_leftovers() -> None:
    """Cleans up after controllers that are gone before any job command
    (:func:`controller.api.settle_leftovers`)."""
    from controller import api

    api.settle_leftovers()


def _run_command(args: argparse.Namespace) -> Outcome:
    """``run``: a follow-up (``--from``), N attempts (``--attempts``) or one job."""
    from controller.cli import commands, iterate

    if args.from_job:
        return iterate.run_follow_up_command(args, _progress)
    if args.attempts != 1:
        return iterate.run_attempts_command(args, _progress)
    return commands.cmd_run(args, _progress)


def _job_command(args: argparse.Namespace) -> int:
    from controller.cli import commands, iterate

    handlers: dict[str, Callable[[argparse.Namespace], commands.Outcome]] = {
        "run": _run_command,
        "rebase": lambda a: iterate.cmd_rebase(a, _progress),
        "jobs": commands.cmd_jobs,
        "prune": commands.cmd_prune,
        "show": commands.cmd_show,
        "apply": commands.cmd_apply,
        "revert": commands.cmd_revert,
        "discard": commands.cmd_discard,
        "cancel": commands.cmd_cancel,
    }
    handler = handlers.get(args.command)
    if handler is None:  # a front door this entry point was not given
        msg = f"patchbox {args.command} is not available from this entry point"
        raise UsageError(msg)
    settle_leftovers()
    code, data, text = handler(args)
    _emit(data, as_json=args.json, text=text)
    return code


_REPO_DEFAULTED = frozenset({"run", "mcp", "env build"})
"""The commands whose ``--repo`` defaults to the repository of the current folder."""


def _default_repo(args: argparse.Namespace) -> None:
    """``--repo`` not given to a command that needs one: the work tree the current folder
    is in (the nearest folder from it up holding ``.git``), as git and gh find it."""
    command = args.command + (" build" if getattr(args, "env_command", None) == "build" else "")
    if command not in _REPO_DEFAULTED or getattr(args, "repo", None) is not None:
        return
    if getattr(args, "from_job", None):  # a follow-up's repository is its parent's
        return
    from controller.repo.layout import enclosing_top

    try:
        args.repo = str(enclosing_top(Path.cwd()))
    except PatchboxError as exc:
        msg = f"no --repo given, and {exc.message}"
        raise NotARepositoryError(msg) from exc


def _output_settings(args: argparse.Namespace) -> tuple[bool, int]:
    """(quiet, the stderr log level) from ``--quiet``, ``--verbose`` and ``--log-format``:
    by default stderr holds the progress a person reads and only warnings and errors of the
    log (a provider's requests, spares and settled journals are info); ``--log-format json``
    adds the info events, ``--verbose`` the debug ones too."""
    quiet, verbose = bool(getattr(args, "quiet", False)), bool(getattr(args, "verbose", False))
    if quiet and verbose:
        msg = "--quiet and --verbose exclude each other"
        raise UsageError(msg)
    if quiet:
        return True, logging.WARNING
    if verbose:
        return False, logging.DEBUG
    as_json = getattr(args, "log_format", "console") == "json"
    return False, logging.INFO if as_json else logging.WARNING


def exit_code_of(exc: PatchboxError) -> int:
    """The process exit code for an error that ends a command."""
    if isinstance(exc, UsageError):
        return ExitCode.USAGE
    if isinstance(exc, NotReadyError):
        return ExitCode.NOT_READY
    if isinstance(exc, InternalError):
        return ExitCode.INTERNAL
    return exit_code_for_error(str(exc.code))


Door = Callable[[argparse.Namespace, Callable[[str], None]], int]
"""A command served by another front door (``mcp``, ``serve``): its arguments and the
progress printer in, the exit code out."""


def main(argv: Sequence[str] | None = None, doors: Mapping[str, Door] | None = None) -> int:
    """Runs one command; ``doors`` runs the commands of the other front doors (the entry
    point :mod:`controller.main` gives ``mcp`` and ``serve``)."""
    from controller.logs import configure
    from controller.paths import patchbox_home

    global _QUIET
    configure(log_file=patchbox_home() / "logs" / "patchbox.log")
    as_json = "--json" in (argv if argv is not None else sys.argv[1:])
    args: argparse.Namespace | None = None
    try:
        args = build_parser().parse_args(argv)
        _QUIET, level = _output_settings(args)
        configure(
            json_output=getattr(args, "log_format", "console") == "json",
            level=level,
            log_file=patchbox_home() / "logs" / "patchbox.log",
        )
        structlog.get_logger(__name__).debug(
            "command", command=args.command, version=version(), pid=os.getpid()
        )
        _default_repo(args)
        if doors and args.command in doors:
            return doors[args.command](args, _progress)
        handlers = {
            "doctor": _doctor,
            "image": _image_build,
            "env": _env,
            "demo": _demo,
            "remote": _remote,
            "key": _provenance,
            "verify": _provenance,
        }
        if args.command in handlers:
            return handlers[args.command](args)
        return _job_command(args)
    except PatchboxError as exc:
        extra: dict[str, object] = {}
        if isinstance(exc, ConflictError):  # each file and why, never a merge's contents
            extra["conflicts"] = [c.model_dump(exclude={"detail"}) for c in exc.conflicts]
        from controller.cli.hints import remedy, with_remedy

        words = remedy(exc.hint)
        if exc.hint is not None and words is not None:
            extra["hint"] = {**exc.hint.model_dump(mode="json", exclude_none=True), "text": words}
        message = with_remedy(exc.message, exc.hint)
        _report_error(str(exc.code), message, args, as_json=as_json, extra=extra)
        _failure_artifacts(args, str(exc.code), message)
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
    extra: Mapping[str, object] | None = None,
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


def run(doors: Mapping[str, Door] | None = None) -> None:
    """The command's entry point: :func:`main`, then the process exits with its code. A
    reader gone before the last flush (``| head``) costs the output, never a traceback."""
    # The modules loaded so far (collections are off while ``patchbox`` loads them) live as
    # long as the process: frozen, the collector's passes no longer walk them; collections
    # resume. At the end, freezing again leaves every object to the exit (the files and
    # records the command wrote are closed and flushed by then) instead of one last pass
    # over all of them: 50-70 ms of each command's start and exit.
    gc.freeze()
    gc.enable()
    code = main(doors=doors)
    if "controller.sandbox.handover" in sys.modules:  # loaded with the spares: one may be starting
        from controller.sandbox.handover import hand_over

        hand_over()  # their answers go to a helper; the command ends now
    try:
        sys.stdout.flush()
    except (OSError, ValueError):
        _quiet_stdout()
    gc.freeze()
    sys.exit(code)
