"""The job commands of the CLI: run, jobs, show, apply, revert, discard.

Each returns ``(exit code, JSON-able data, text)``; :mod:`controller.cli.main` prints them.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args

from pydantic import ValidationError

from controller.api import job_diff, job_view
from controller.errors import (
    ExitCode,
    InternalError,
    PatchboxError,
    UsageError,
    describe_validation,
    exit_code_for_error,
)
from controller.jobs.evidence import relative_to_home
from controller.jobs.records import (
    ACTIVE,
    FINAL,
    JobRecord,
    JobState,
    JobStore,
    mark_interrupted,
)
from controller.logs import Scrubber
from controller.signals import cancel_on_signals
from controller.text import flag_text

if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable

    import docker

    from controller.config.task import TaskSpec
    from controller.providers.base import Provider
    from controller.repo.baseline import Baseline


Outcome = tuple[int, dict[str, Any], str]


MAX_TASK_FILE_BYTES = 1024 * 1024
"""The largest task file read: a prompt, a few checks and limits fit many times over."""


def load_task(path: Path) -> TaskSpec:
    """Reads and validates the task file. :class:`UsageError` (exit 2) when it is missing,
    not a regular file (a FIFO or a device never blocks: :mod:`controller.config.inputfile`, the
    calls file's rule), larger than :data:`MAX_TASK_FILE_BYTES`, or invalid."""
    from controller.config.inputfile import read_input_file
    from controller.config.task import TaskSpec

    raw = read_input_file(path, "task file", MAX_TASK_FILE_BYTES)
    try:
        return TaskSpec.model_validate_json(raw)
    except ValidationError as exc:
        fields = describe_validation(exc, subject="task", max_chars=1000)
        msg = f"the task file is invalid: {fields}"
        raise UsageError(msg[:1000]) from exc


def _provider(
    args: argparse.Namespace, task: TaskSpec, table: dict[str, Any]
) -> tuple[Provider, tuple[str, ...]]:
    if args.calls:
        from controller.providers import load_calls

        return load_calls(Path(args.calls)), ()
    from controller.providers import ProviderConfig, open_provider

    config = ProviderConfig.from_mapping(table) if table else ProviderConfig.from_env()
    secret = config.api_key.get_secret_value() if config.api_key is not None else ""
    return open_provider(config, task.prompt), (secret,) if secret else ()


FAILED_STATES = frozenset({"failed", "cancelled"})
TAIL_LINES = 20


def _summary(record: JobRecord) -> str:
    """The plain-text account of a job; for a failed one, why: its error, the failing
    checks' last output lines and every refused tool call with its code and message."""
    lines = [f"job {record.job_id}: {record.state}"]
    if record.error:
        lines.append(f"error {record.error['code']}: {record.error['message']}")
    for f in record.files:
        calls = ", ".join(f.calls) or "-"
        lines.append(f"  {f.kind:<7} {f.path} (+{f.added} -{f.removed}) by call(s) {calls}")
    lines += flag_text(c.model_dump() for c in record.control_characters)
    lines += [
        f"  check {c.id}: {c.status} (exit {c.exit_code}, {c.duration_ms} ms)"
        for c in record.checks
    ]
    if record.state in FAILED_STATES:
        for c in record.checks:
            if c.status in {"failed", "timed_out"} and c.output_tail.strip():
                tail = c.output_tail.rstrip("\n").splitlines()[-TAIL_LINES:]
                lines.append(f"output of check {c.id} (last {len(tail)} lines):")
                lines += [f"  | {line}" for line in tail]
        refused = [t for t in record.tool_calls if not t.ok]
        if refused:
            lines.append("failed tool calls:")
            for t in refused:
                message = f": {t.error_message}" if t.error_message else ""
                lines.append(f"  turn {t.turn} {t.id} {t.name}: {t.error_code}{message}")
    elif record.decision is not None and record.decision.reason:
        lines.append(f"decision: {record.decision.reason}")
    return "\n".join(lines)


def transcript_text(record: JobRecord, width: int = 400) -> str:
    """The conversation, readably: each turn's message, cost and calls with their results
    (long texts cut at ``width`` characters; the evidence keeps them whole, bounded)."""

    def cut(text: str) -> str:
        one = text.replace("\n", "\\n")
        return one if len(one) <= width else one[: width - 3] + "..."

    lines: list[str] = []
    for turn in record.transcript:
        cost = ", ".join(f"{k} {v}" for k, v in sorted(turn.usage.items()))
        lines.append(f"turn {turn.turn} (model {turn.model_ms} ms{'; ' + cost if cost else ''})")
        if turn.text:
            lines.append(f"  model: {cut(turn.text)}")
        for c in turn.calls:
            state = "ok" if c.ok else "error"
            lines.append(f"  call {c.id} {c.name} {cut(c.arguments)}")
            lines.append(f"    -> {state} ({c.duration_ms} ms): {cut(c.result)}")
    return "\n".join(lines) or "no transcript (the job made no model turn)"


def cmd_run(args: argparse.Namespace, progress: Callable[[str], None]) -> Outcome:
    from controller import api
    from controller.config.host import load_config
    from controller.sandbox.dockerclient import connect

    config = load_config(Path(args.config) if args.config else None)
    if getattr(args, "no_spare", False):
        config = config.model_copy(update={"spare_sandboxes": 0})
    task = load_task(Path(args.task))
    repo = Path(args.repo)
    provider, secrets = _provider(args, task, config.provider)
    client = connect()
    job = api.make_job(
        repo,
        task,
        provider,
        config=config,
        include_local_changes=args.include_local_changes,
        trust_repo_config=args.trust_repo_config,
        consent_trusted_auto=args.consent_trusted_auto,
        runtime=args.runtime,
        secrets=secrets,
        client=client,
        progress=progress,
    )
    internal: InternalError | None = None
    with cancel_on_signals(job.cancel, progress) as cancellation:
        try:
            record = job.run()
        except InternalError as exc:  # the record says failed, INTERNAL_ERROR
            internal, record = exc, job.record
        finally:
            provider.close()
            client.close()
    store = JobStore()
    evidence = relative_to_home(store.folder(record.job_id) / "evidence.json")
    data = job_view(record, job.diff, evidence, secrets)
    if getattr(args, "output_dir", None):
        data["artifacts"] = _artifacts(Path(args.output_dir), record, job.diff, secrets, data)
    ok = record.state in {"awaiting_review", "applied"}
    text = Scrubber(record.repo, secrets, paths=False).text(_summary(record))
    fallback = review_fallback(record)
    if fallback is not None:
        data["review_fallback"] = fallback
        with contextlib.suppress(OSError):
            progress(f"{record.mode} mode fell back to review: {fallback}")
    if record.state == "awaiting_review":
        jid = record.job_id
        text += f"\nreview: patchbox show {jid} --diff; then patchbox apply {jid}"
        text += f" or patchbox discard {jid}"
    text += f"\nevidence: {evidence}"
    if cancellation.exit_code is not None:
        return cancellation.exit_code, data, text
    if internal is not None:
        # A fault after the job's end (its evidence) leaves the record as it was: say so.
        data["error"] = data["error"] or Scrubber(record.repo, secrets, paths=False).value(
            internal.to_dict()
        )
        return ExitCode.INTERNAL, data, text
    if ok:
        return ExitCode.OK, data, text
    return exit_code_for_error(record.error["code"] if record.error else ""), data, text


def _artifacts(
    folder: Path,
    record: JobRecord,
    diff: str | None,
    secrets: tuple[str, ...],
    view: dict[str, Any],
) -> dict[str, Any]:
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
        )
    except OSError as exc:
        msg = f"the output folder {str(folder)!r} cannot be written: {exc.strerror}"
        raise UsageError(msg) from exc
    return {"folder": str(folder), "files": written}


def review_fallback(record: JobRecord) -> str | None:
    """Why a job in an auto mode stopped for review instead of applying (None otherwise)."""
    if record.mode == "review" or record.state != "awaiting_review":
        return None
    decision = record.decision
    return decision.reason if decision is not None else "not decided"


def settle(client: docker.DockerClient | None, store: JobStore | None = None) -> None:
    """What controllers that are gone left behind: an apply or a revert they did not finish
    is settled from the journal and every record says what the work tree holds
    (:mod:`controller.jobs.settle`), their active jobs end ``failed`` with ``INTERRUPTED``,
    and (when the daemon answers) their containers, claims and temp folders are removed.
    Every command that starts work or reads jobs calls it first."""
    from controller.paths import patchbox_home

    store = store or JobStore()
    records = store.all()
    journaled: set[str] = set()
    if (patchbox_home() / "journal").is_dir():  # else nothing was ever applied here
        from controller.changes.journal import Journal
        from controller.jobs.settle import settled

        journal = Journal()
        journaled = set(journal.jobs())
    for record in records:
        with contextlib.suppress(OSError, ValueError, PatchboxError):
            current = record
            if record.job_id in journaled:
                current = settled(store, record, journal)
            if current.state in ACTIVE:
                mark_interrupted(store, current)
    if client is not None:
        from controller.sandbox.reaper import reap

        reap(client, patchbox_home() / "tmp")


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


def _duration(record: JobRecord) -> float | None:
    if record.state in ACTIVE:
        return None
    return round(max(0.0, record.updated_at - record.created_at), 1)


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
    jobs = [
        {
            "job_id": r.job_id,
            "status": r.state,
            "repository": Path(r.repo).name,
            "repo": r.repo,
            "created_at": r.created_at,
            "created": _when(r.created_at),
            "duration_seconds": _duration(r),
            "error_code": r.error["code"] if r.error else None,
            "error": Scrubber(r.repo, paths=False).value(r.error),
        }
        for r in records
    ]
    lines = []
    for job in jobs:
        took = "-" if job["duration_seconds"] is None else f"{job['duration_seconds']:.1f}s"
        lines.append(
            f"{job['job_id']}  {job['status']:<16} {job['created'][:19]}  {took:>8}  "
            f"{job['error_code'] or '-':<24} {job['repository']}"
        )
    return ExitCode.OK, {"jobs": jobs}, "\n".join(lines) or "no jobs"


def cmd_prune(args: argparse.Namespace) -> Outcome:
    """Removes the records and evidence of ended jobs (reverted, discarded, failed,
    cancelled) older than ``--older-than``; jobs awaiting review or applied stay (their
    diff and journal are what apply and revert need)."""
    import shutil
    import time

    cutoff = time.time() - parse_age(args.older_than, "--older-than")
    store = JobStore()
    removed = []
    for record in store.all():
        if record.state in FINAL and record.updated_at < cutoff:
            shutil.rmtree(store.folder(record.job_id), ignore_errors=True)
            removed.append(record.job_id)
    text = f"removed {len(removed)} job(s)" + (": " + ", ".join(removed) if removed else "")
    return ExitCode.OK, {"removed": removed}, text


def cmd_show(args: argparse.Namespace) -> Outcome:
    store = JobStore()
    record = store.load(args.job)
    diff = job_diff(store, record.job_id)
    evidence = relative_to_home(store.folder(record.job_id) / "evidence.json")
    data = job_view(record, diff if args.diff else None, evidence)
    data["ledger"] = record.model_dump(mode="json")["ledger"]
    data["state_history"] = record.history
    text = Scrubber(record.repo, paths=False).text(_summary(record))
    if record.ledger:
        text += "\nledger:"
        for e in record.ledger:
            paths = ", ".join(f.path for f in e.files) or "-"
            text += f"\n  turn {e.turn} {e.id} {e.tool}: {e.outcome}; {paths}"
    text += f"\nevidence: {evidence}"
    if args.diff and diff:
        text += "\n" + diff
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

    record, result = api.apply_job(args.job, merge=args.merge)
    files = [f.model_dump(mode="json") for f in result.files]
    data = {
        "job_id": record.job_id,
        "status": record.state,
        "files": files,
        "merged": result.merged,
    }
    text = f"job {record.job_id} applied: {len(files)} file(s)" + (
        f"; merged three-way: {', '.join(result.merged)}" if result.merged else ""
    )
    return ExitCode.OK, data, text


def cmd_revert(args: argparse.Namespace) -> Outcome:
    from controller import api

    record, result = api.revert_job(args.job)
    files = [f.model_dump(mode="json") for f in result.files]
    return (
        ExitCode.OK,
        {"job_id": record.job_id, "status": record.state, "files": files},
        (f"job {record.job_id} reverted: {len(files)} file(s) restored"),
    )


def cmd_discard(args: argparse.Namespace) -> Outcome:
    from controller import api

    record = api.discard_job(args.job)
    return (
        ExitCode.OK,
        {"job_id": record.job_id, "status": record.state},
        (f"job {record.job_id} discarded; the repository was not touched"),
    )
