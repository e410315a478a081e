"""The job commands of the CLI: run, jobs, show, apply, revert, discard.

Each returns ``(exit code, JSON-able data, text)``; :mod:`controller.cli.main` prints them.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from controller.cli.signals import cancel_on_signals
from controller.errors import (
    ExitCode,
    InternalError,
    PatchboxError,
    UsageError,
    describe_validation,
)
from controller.jobs.evidence import relative_to_home, write_evidence
from controller.jobs.records import ACTIVE, JobRecord, JobStore, mark_interrupted, write_lock
from controller.logs import Scrubber

if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable

    import docker

    from controller.config.task import TaskSpec
    from controller.jobs.records import Decision
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


def run_view(
    record: JobRecord, diff: str | None, evidence: str, secrets: tuple[str, ...] = ()
) -> dict[str, Any]:
    """The one JSON object of ``run --json``. Messages and check output are
    scrubbed of secrets and host paths like the evidence; the diff is shown as it is."""
    view = Scrubber(record.repo, secrets).value(_view(record, evidence))
    view["diff"] = diff or ""
    return dict(view)


CHECK_VIEW = frozenset({"id", "status", "exit_code", "duration_ms", "output_tail"})


def _view(record: JobRecord, evidence: str) -> dict[str, Any]:
    stored = record.model_dump(mode="json")
    return {
        "job_id": record.job_id,
        "status": record.state,
        "error": record.error,
        "files": [
            {"path": f.path, "change": f.kind, "added": f.added, "removed": f.removed}
            for f in record.files
        ],
        "checks": [c.model_dump(mode="json", include=set(CHECK_VIEW)) for c in record.checks],
        "tool_calls": stored["tool_calls"],
        "evidence": evidence,
        "decision": stored["decision"],
    }


def _summary(record: JobRecord) -> str:
    lines = [f"job {record.job_id}: {record.state}"]
    if record.error:
        lines.append(f"error {record.error['code']}: {record.error['message']}")
    for f in record.files:
        calls = ", ".join(f.calls) or "-"
        lines.append(f"  {f.kind:<7} {f.path} (+{f.added} -{f.removed}) by call(s) {calls}")
    lines += [
        f"  check {c.id}: {c.status} (exit {c.exit_code}, {c.duration_ms} ms)"
        for c in record.checks
    ]
    if record.decision is not None and record.decision.reason:
        lines.append(f"decision: {record.decision.reason}")
    return "\n".join(lines)


def cmd_run(args: argparse.Namespace, progress: Callable[[str], None]) -> Outcome:
    from controller.config.host import load_config
    from controller.jobs.engine import Job, JobRequest
    from controller.sandbox.dockerclient import connect

    config = load_config(Path(args.config) if args.config else None)
    task = load_task(Path(args.task))
    repo = Path(args.repo)
    provider, secrets = _provider(args, task, config.provider)
    client = connect()
    request = JobRequest(
        repo=repo,
        task=task,
        provider=provider,
        config=config,
        include_local_changes=args.include_local_changes,
        trust_repo_config=args.trust_repo_config,
        consent_trusted_auto=args.consent_trusted_auto,
        runtime=args.runtime,
        secrets=secrets,
    )
    job = Job(client, request, progress=progress)
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
    data = run_view(record, job.diff, evidence, secrets)
    ok = record.state in {"awaiting_review", "applied"}
    text = Scrubber(record.repo, secrets).text(_summary(record))
    if record.state == "awaiting_review":
        jid = record.job_id
        text += f"\nreview: patchbox show {jid} --diff; then patchbox apply {jid}"
        text += f" or patchbox discard {jid}"
    text += f"\nevidence: {evidence}"
    if cancellation.exit_code is not None:
        return cancellation.exit_code, data, text
    if internal is not None:
        # A fault after the job's end (its evidence) leaves the record as it was: say so.
        data["error"] = data["error"] or Scrubber(record.repo, secrets).value(internal.to_dict())
        return ExitCode.INTERNAL, data, text
    return (ExitCode.OK if ok else ExitCode.FAILED), data, text


def settle(client: docker.DockerClient | None, store: JobStore | None = None) -> None:
    """What controllers that are gone left behind: their active jobs end ``failed`` with
    ``INTERRUPTED``, and (when the daemon answers) their containers, claims and temp
    folders are removed. Every command that starts work or reads jobs calls it first."""
    from controller.paths import patchbox_home

    store = store or JobStore()
    for record in store.all():
        if record.state in ACTIVE:
            with contextlib.suppress(OSError, ValueError, PatchboxError):
                mark_interrupted(store, record)
    if client is not None:
        from controller.sandbox.reaper import reap

        reap(client, patchbox_home() / "tmp")


def cmd_jobs(args: argparse.Namespace) -> Outcome:
    store = JobStore()
    repo = str(Path(args.repo).resolve()) if args.repo else None
    records = store.all(repo)
    data = {
        "jobs": [
            {
                "job_id": r.job_id,
                "status": r.state,
                "repository": Path(r.repo).name,
                "created_at": r.created_at,
                "error": Scrubber(r.repo).value(r.error),
            }
            for r in records
        ]
    }
    text = "\n".join(f"{r.job_id}  {r.state:<16} {Path(r.repo).name}" for r in records)
    return ExitCode.OK, data, text or "no jobs"


def _diff_of(store: JobStore, job_id: str) -> str | None:
    path = store.folder(job_id) / "diff.patch"
    try:
        return path.read_text("utf-8", "surrogateescape")
    except FileNotFoundError:
        return None


def cmd_show(args: argparse.Namespace) -> Outcome:
    store = JobStore()
    record = store.load(args.job)
    diff = _diff_of(store, record.job_id)
    evidence = relative_to_home(store.folder(record.job_id) / "evidence.json")
    data = run_view(record, diff if args.diff else None, evidence)
    data["ledger"] = record.model_dump(mode="json")["ledger"]
    data["state_history"] = record.history
    text = Scrubber(record.repo).text(_summary(record))
    if record.ledger:
        text += "\nledger:"
        for e in record.ledger:
            paths = ", ".join(f.path for f in e.files) or "-"
            text += f"\n  turn {e.turn} {e.id} {e.tool}: {e.outcome}; {paths}"
    text += f"\nevidence: {evidence}"
    if args.diff and diff:
        text += "\n" + diff
    return ExitCode.OK, data, text


def _baseline(record: JobRecord) -> Baseline:
    if record.baseline is None:
        msg = f"job {record.job_id} has no baseline"
        raise UsageError(msg)
    return record.baseline


def _sync_with_journal(store: JobStore, record: JobRecord) -> JobRecord:
    """After a crash the journal knows better than the record: settle it, then agree."""
    from controller.changes.apply import recover_job

    recovery = recover_job(record.job_id)
    if recovery.state == "applied" and record.state == "awaiting_review":
        record.move("applied")
        store.save(record)
    elif recovery.state == "not_applied" and record.state == "applied":
        record.move("reverted")
        store.save(record)
    if recovery.state == "needs_attention":
        record.diagnostics["needs_attention"] = recovery.model_dump()
        store.save(record)
    return record


def cmd_apply(args: argparse.Namespace) -> Outcome:
    from controller.changes.apply import apply_changeset
    from controller.config.host import load_config

    store = JobStore()
    record = _sync_with_journal(store, store.load(args.job))
    if record.state != "awaiting_review":
        msg = f"job {record.job_id} is {record.state}; only a job awaiting review is applied"
        raise UsageError(msg)
    diff = _diff_of(store, record.job_id) or ""
    with write_lock(record.repo):
        result = apply_changeset(
            _baseline(record),
            diff,
            job_id=record.job_id,
            allowed_paths=record.allowed_paths,
            extra_protected=tuple(load_config().protected),
            merge=args.merge,
        )
    record.move("applied")
    record.decision = _applied_by_user(record, result.merged)
    store.save(record)
    write_evidence(record, diff, store)
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


def _applied_by_user(record: JobRecord, merged: list[str]) -> Decision:
    """The job's decision once the user applied it. A job awaiting review was decided; a
    record that says otherwise still records who applied it."""
    from controller.jobs.records import Decision

    decision = record.decision or Decision(mode=record.mode, reason="no decision was recorded")
    return decision.model_copy(update={"applied_by": "user", "merged": merged})


def cmd_revert(args: argparse.Namespace) -> Outcome:
    from controller.changes.apply import revert_changeset

    store = JobStore()
    record = _sync_with_journal(store, store.load(args.job))
    if record.state != "applied":
        msg = f"job {record.job_id} is {record.state}; only an applied job is reverted"
        raise UsageError(msg)
    with write_lock(record.repo):
        result = revert_changeset(record.job_id)
    record.move("reverted")
    store.save(record)
    write_evidence(record, _diff_of(store, record.job_id), store)
    files = [f.model_dump(mode="json") for f in result.files]
    return (
        ExitCode.OK,
        {"job_id": record.job_id, "status": record.state, "files": files},
        (f"job {record.job_id} reverted: {len(files)} file(s) restored"),
    )


DISCARDABLE = frozenset({"awaiting_review", "failed", "cancelled"})


def cmd_discard(args: argparse.Namespace) -> Outcome:
    store = JobStore()
    record = store.load(args.job)
    if record.state not in DISCARDABLE:
        msg = (
            f"job {record.job_id} is {record.state}; only a job awaiting review, failed or "
            "cancelled is discarded"
        )
        raise UsageError(msg)
    record.move("discarded")
    store.save(record)
    write_evidence(record, _diff_of(store, record.job_id), store)
    return (
        ExitCode.OK,
        {"job_id": record.job_id, "status": record.state},
        (f"job {record.job_id} discarded; the repository was not touched"),
    )
