"""The job commands of the CLI: run, jobs, show, apply, revert, discard, cancel.

Each returns ``(exit code, JSON-able data, text)``; :mod:`controller.cli.main` prints them.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict, get_args

from controller.api.views import job_diff, job_row, job_view
from controller.cli.hints import remedy
from controller.errors import (
    ExitCode,
    InternalError,
    UsageError,
    exit_code_for_error,
)
from controller.jobs.evidence import relative_to_home
from controller.jobs.records import FINAL, JobRecord, JobState
from controller.jobs.store import JobStore
from controller.jobs.summary import summary_text, transcript_text
from controller.logs import Scrubber
from controller.signals import cancel_on_signals

if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable

    from controller.api.jobs import ProviderChoice
    from controller.config.host import HostConfig
    from controller.config.task import TaskSpec
    from controller.jobs.request import JobRequest
    from controller.providers.scripted import CallsFile
    from controller.repo.baseline import Baseline
    from controller.tools.watch import CheckLine


Outcome = tuple[int, Mapping[str, object], str]


class Artifacts(TypedDict):
    """``run --output-dir``: the folder and the files written in it."""

    folder: str
    files: list[str]


class JobLine(TypedDict):
    """A row of ``patchbox jobs``."""

    job_id: str
    status: str
    repository: str
    repo: str
    created_at: float
    created: str
    duration_seconds: float | None
    error_code: str | None
    error: dict[str, object] | None
    """The error's JSON object (code, message, hint)."""


LIVE_EVERY = 1.0
"""Seconds between two progress lines that show a running check's latest output line."""


def check_output_printer(
    args: argparse.Namespace, progress: Callable[[str], None], scrub: Callable[[str], str]
) -> Callable[[CheckLine], None]:
    """How ``run`` shows a running check's output: with ``--log-format json`` every line as
    a ``check_output`` log event; else its latest line in a progress line, at most one a
    :data:`LIVE_EVERY` seconds."""
    if getattr(args, "log_format", "console") == "json":
        import structlog

        log = structlog.get_logger("controller.check")

        def every(line: CheckLine) -> None:
            log.info(
                "check_output", check_id=line.check_id, handle=line.handle, line=scrub(line.line)
            )

        return every
    shown = [-LIVE_EVERY]

    def latest(line: CheckLine) -> None:
        now = time.monotonic()
        if now - shown[0] >= LIVE_EVERY and line.line.strip():
            shown[0] = now
            progress(f"check {line.check_id}: {scrub(line.line)}")

    return latest


def run_inputs(
    args: argparse.Namespace,
) -> tuple[HostConfig, TaskSpec, list[CallsFile]]:
    """``run``'s configuration, task and calls files (one per ``--calls``), read, and its
    repository found: a wrong ``--repo`` is named before the model or Docker is asked
    anything."""
    from controller import api
    from controller.config.host import load_config
    from controller.providers import read_calls
    from controller.repo.layout import locate

    config = load_config(Path(args.config) if args.config else None)
    if getattr(args, "no_spare", False):
        config = config.model_copy(update={"spare_sandboxes": 0})
    if not args.task:
        raise UsageError("--task is required (without --from)")
    task = api.load_task(Path(args.task))
    calls = [read_calls(Path(c)) for c in args.calls or ()]
    locate(Path(args.repo).resolve())  # named as the job names it: its real path
    return config, task, calls


def cmd_run(args: argparse.Namespace, progress: Callable[[str], None]) -> Outcome:
    from controller import api

    config, task, calls = run_inputs(args)
    if len(calls) > 1:
        raise UsageError("--calls is given once per attempt: only with --attempts N")
    choice = api.choose_provider(config, task, calls[0] if calls else None)
    secrets = choice.secrets
    request = api.JobRequest(
        repo=Path(args.repo),
        task=task,
        provider=choice.provider,
        config=config,
        include_local_changes=args.include_local_changes,
        trust_repo_config=args.trust_repo_config,
        consent_trusted_auto=args.consent_trusted_auto,
        runtime=args.runtime,
        secrets=secrets,
    )
    return run_request(args, progress, request, choice)


def run_request(
    args: argparse.Namespace,
    progress: Callable[[str], None],
    request: JobRequest,
    choice: ProviderChoice,
) -> Outcome:
    """``run``'s job of ``request`` (``choice``'s provider, closed at its end), to its
    outcome; Ctrl-C and SIGTERM cancel it."""
    from controller import api
    from controller.sandbox.dockerclient import connect

    secrets = choice.secrets
    client = connect()
    scrub = Scrubber(str(request.repo), secrets, paths=False)
    output = check_output_printer(args, progress, scrub.text)
    job = api.make_job(request, client=client, progress=progress, output=output)
    internal: InternalError | None = None
    with cancel_on_signals(job.cancel, progress) as cancellation:
        try:
            record = job.run(refusals="raise")  # a refusal leaves no job record
        except InternalError as exc:  # the record says failed, INTERNAL_ERROR
            internal, record = exc, job.record
        finally:
            choice.provider.close()
            client.close()
    return ended(
        args,
        progress,
        record,
        job.diff,
        secrets=secrets,
        signalled=cancellation.exit_code,
        internal=internal,
    )


def ended(  # noqa: PLR0913 - a finished job's parts, then how it ended
    args: argparse.Namespace,
    progress: Callable[[str], None],
    record: JobRecord,
    diff: str | None,
    *,
    secrets: tuple[str, ...],
    signalled: int | None,
    internal: InternalError | None,
) -> Outcome:
    """The outcome of ``run`` (or ``rebase``) once its job ended: its view, artifacts with
    ``--output-dir``, the summary and what to do next, and the exit status."""
    store = JobStore()
    evidence = relative_to_home(store.folder(record.job_id) / "evidence.json")
    view = job_view(record, diff, evidence, secrets)
    data = view.data()
    no_change_ok = bool(getattr(args, "no_change_ok", False))
    if getattr(args, "output_dir", None):
        data["artifacts"] = _artifacts(
            Path(args.output_dir), record, diff, secrets, data, no_change_ok=no_change_ok
        )
    ok = record.state in {"awaiting_review", "applied"} or (
        record.state == "no_change" and no_change_ok
    )
    text = Scrubber(record.repo, secrets, paths=False).text(summary_text(record))
    conflicts = record.diagnostics.get("conflicts")
    if conflicts:  # each file of a refused rebase and why, never a merge's contents
        data["conflicts"] = [{k: v for k, v in c.items() if k != "detail"} for c in conflicts]
    if record.error is not None and (words := remedy(record.error.hint)) is not None:
        text += f"\n{words}"
        data["error"]["hint"]["text"] = words
    if view.review_fallback is not None:
        with contextlib.suppress(OSError):
            progress(f"{record.mode} mode fell back to review: {view.review_fallback}")
    if record.state == "awaiting_review":
        jid = record.job_id
        text += f"\nreview: patchbox show {jid} --diff; then patchbox apply {jid}"
        text += f" or patchbox discard {jid}"
    text += f"\nevidence: {evidence}"
    if signalled is not None:
        return signalled, data, text
    if internal is not None:
        # A fault after the job's end (its evidence) leaves the record as it was: say so.
        data["error"] = data["error"] or Scrubber(record.repo, secrets, paths=False).value(
            internal.to_dict()
        )
        return ExitCode.INTERNAL, data, text
    if ok:
        return ExitCode.OK, data, text
    return exit_code_for_error(record.error.code if record.error else ""), data, text


def _artifacts(  # noqa: PLR0913 - a finished job's parts
    folder: Path,
    record: JobRecord,
    diff: str | None,
    secrets: tuple[str, ...],
    view: Mapping[str, object],
    *,
    no_change_ok: bool = False,
) -> Artifacts:
    from controller.cli.artifacts import write_artifacts
    from controller.version import version

    try:
        written = write_artifacts(
            folder,
            record=record,
            diff=diff,
            store=JobStore(),
            secrets=secrets,
            version=version(),
            view=view,
            no_change_ok=no_change_ok,
        )
    except OSError as exc:
        msg = f"the output folder {str(folder)!r} cannot be written: {exc.strerror}"
        raise UsageError(msg) from exc
    return {"folder": str(folder), "files": written}


def parse_age(text: str, option: str) -> float:
    """Seconds in ``text``: a number with a unit, ``90s``, ``45m``, ``12h``, ``7d`` or ``2w``
    (``UsageError`` naming ``option`` otherwise)."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
    number, unit = text[:-1], text[-1:]
    try:
        value = float(number)
    except ValueError:
        value = -1.0
    if unit not in units or not 0 <= value < 1e9:
        msg = f"{option} takes an age like 90s, 45m, 12h, 7d or 2w, not {text[:40]!r}"
        raise UsageError(msg)
    return value * units[unit]


def parse_since(text: str) -> float:
    """The epoch time ``--since`` names: an age (``2d``: two days ago) or an ISO date or
    date and time (``2026-12-01``, ``2026-12-01T08:00``, local time unless it says)."""
    import datetime as dt
    import time

    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        return time.time() - parse_age(text, "--since")
    return when.timestamp()


def _when(epoch: float) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(epoch).astimezone().isoformat(timespec="seconds")


def cmd_jobs(args: argparse.Namespace) -> Outcome:
    store = JobStore()
    repo = str(Path(args.repo).resolve()) if args.repo else None
    records = store.all(repo)
    wanted = {s for arg in (args.status or []) for s in arg.split(",") if s}
    known = set(get_args(JobState))
    unknown = sorted(wanted - known)
    if unknown:
        msg = f"--status takes job states ({', '.join(sorted(known))}), not {', '.join(unknown)}"
        raise UsageError(msg[:500])
    if wanted:
        records = [r for r in records if r.state in wanted]
    if args.since:
        since = parse_since(args.since)
        records = [r for r in records if r.created_at >= since]
    jobs: list[JobLine] = []
    for record in records:
        row = job_row(record)
        jobs.append(
            {
                "job_id": row.job_id,
                "status": row.status,
                "repository": Path(row.repo).name,
                "repo": row.repo,
                "created_at": row.created_at,
                "created": _when(row.created_at),
                "duration_seconds": row.duration_seconds,
                "error_code": row.error.code if row.error else None,
                "error": row.error.model_dump(mode="json") if row.error else None,
            }
        )
    if not jobs:
        return ExitCode.OK, {"jobs": jobs}, "no jobs"
    lines = [_JOBS_HEADER]
    for job in jobs:
        took = "-" if job["duration_seconds"] is None else f"{job['duration_seconds']:.1f}s"
        lines.append(
            f"{job['job_id']:<24}  {job['status']:<16} {job['created'][:19]:<19}  {took:>8}  "
            f"{job['error_code'] or '-':<24} {job['repository']}"
        )
    return ExitCode.OK, {"jobs": jobs}, "\n".join(lines)


_JOBS_HEADER = f"{'JOB':<24}  {'STATUS':<16} {'CREATED':<19}  {'DURATION':>8}  {'ERROR':<24} REPO"
"""The header row of ``patchbox jobs``."""


def cmd_prune(args: argparse.Namespace) -> Outcome:
    """Removes the records and evidence of ended jobs (reverted, discarded, failed,
    cancelled) older than ``--older-than``; jobs awaiting review or applied stay (their
    diff and journal are what apply and revert need). ``--spares``: this state directory's
    spare sandboxes no job is claiming."""
    import shutil
    import time

    if args.older_than is None and not getattr(args, "spares", False):
        raise UsageError("prune needs --older-than AGE, --spares, or both")
    data: dict[str, object] = {"removed": []}
    lines = []
    if args.older_than is not None:
        cutoff = time.time() - parse_age(args.older_than, "--older-than")
        store = JobStore()
        removed = []
        for record in store.all():
            if record.state in FINAL and record.updated_at < cutoff:
                shutil.rmtree(store.folder(record.job_id), ignore_errors=True)
                removed.append(record.job_id)
        data["removed"] = removed
        lines.append(
            f"removed {len(removed)} job(s)" + (": " + ", ".join(removed) if removed else "")
        )
    if getattr(args, "spares", False):
        from controller import api

        spares = api.remove_spares()
        data["spares"] = spares
        lines.append(
            f"removed {len(spares)} spare sandbox(es)"
            + (": " + ", ".join(spares) if spares else "")
        )
    return ExitCode.OK, data, "\n".join(lines)


def cmd_show(args: argparse.Namespace) -> Outcome:
    store = JobStore()
    record = store.load(store.resolve(args.job))
    diff = job_diff(store, record.job_id)
    evidence = relative_to_home(store.folder(record.job_id) / "evidence.json")
    data = job_view(record, diff if args.diff else None, evidence).data()
    data["ledger"] = record.model_dump(mode="json")["ledger"]
    data["state_history"] = record.history
    text = Scrubber(record.repo, paths=False).text(summary_text(record))
    if record.ledger:
        text += "\nledger:"
        for e in record.ledger:
            paths = ", ".join(f.path for f in e.files) or "-"
            text += f"\n  turn {e.turn} {e.id} {e.tool}: {e.outcome}; {paths}"
    text += f"\nevidence: {evidence}"
    if args.diff and diff:
        text += "\n" + diff
    if args.diff and record.parent is not None and record.parent.relation == "follow-up":
        from controller.jobs.lineage import combined_diff

        parent_diff = job_diff(store, record.parent.job_id) or ""
        combined = combined_diff(store, record, diff or "") or ""
        data["parent_diff"], data["combined_diff"] = parent_diff, combined
        text += f"\ndiff of job {record.parent.job_id}, which this job follows up:\n{parent_diff}"
        text += f"\nthe two combined (what apply writes while job {record.parent.job_id} "
        text += f"is not applied):\n{combined}"
    if getattr(args, "transcript", False):
        data["transcript"] = record.model_dump(mode="json").get("transcript", [])
        text += "\ntranscript:\n" + Scrubber(record.repo, paths=False).text(transcript_text(record))
    return ExitCode.OK, data, text


def _baseline(record: JobRecord) -> Baseline:
    if record.baseline is None:
        msg = f"job {record.job_id} has no baseline"
        raise UsageError(msg)
    return record.baseline


def cmd_apply(args: argparse.Namespace) -> Outcome:
    from controller import api

    view = api.ApplyView.of(*api.apply_job(api.resolve_job(args.job), merge=args.merge))
    if view.already_applied:
        text = f"job {view.job_id} already applied; nothing was written"
        return ExitCode.OK, view.model_dump(mode="json"), text
    text = f"job {view.job_id} applied: {len(view.files)} file(s)" + (
        f"; merged three-way: {', '.join(view.merged)}" if view.merged else ""
    )
    return ExitCode.OK, view.model_dump(mode="json"), text


def cmd_revert(args: argparse.Namespace) -> Outcome:
    from controller import api

    view = api.RevertView.of(*api.revert_job(api.resolve_job(args.job)))
    text = f"job {view.job_id} reverted: {len(view.files)} file(s) restored"
    return ExitCode.OK, view.model_dump(mode="json"), text


def cmd_discard(args: argparse.Namespace) -> Outcome:
    from controller import api

    view = api.DiscardView.of(api.discard_job(api.resolve_job(args.job)))
    text = f"job {view.job_id} discarded; the repository was not touched"
    return ExitCode.OK, view.model_dump(mode="json"), text


def cmd_cancel(args: argparse.Namespace) -> Outcome:
    """Cancels a running job of this state folder (run by another ``patchbox`` process)
    and waits for its end: exit 0 once it is ``cancelled``, 1 when it ended otherwise or
    has not ended yet."""
    from controller import api
    from controller.jobs.records import ACTIVE

    record = api.cancel_job(api.resolve_job(args.job))
    data = {"job_id": record.job_id, "status": record.state}
    if record.state == "cancelled":
        return ExitCode.OK, data, f"job {record.job_id} cancelled"
    if record.state in ACTIVE:
        text = f"job {record.job_id}: cancel requested; it is still {record.state}"
    else:
        text = f"job {record.job_id} ended {record.state} before the cancel took effect"
    return ExitCode.FAILED, data, text
