"""``rebase``, ``run --from`` and ``run --attempts`` in the command line's words: a job
carried onto the repository as it is now, a follow-up that starts from a job's result, and N
attempts of one task ranked."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from controller.api.views import job_view
from controller.cli.commands import (
    Outcome,
    check_output_printer,
    ended,
    run_inputs,
    run_request,
)
from controller.errors import ExitCode, InternalError, UsageError, exit_code_for_error
from controller.jobs.evidence import relative_to_home
from controller.jobs.store import JobStore
from controller.logs import Scrubber
from controller.signals import cancel_on_signals

if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable

    from controller.api.attempts import Attempt


def cmd_rebase(args: argparse.Namespace, progress: Callable[[str], None]) -> Outcome:
    """Carries a job awaiting review onto its repository as it is now, as a new job."""
    from controller import api
    from controller.config.host import load_config
    from controller.sandbox.dockerclient import connect

    config = load_config(Path(args.config) if args.config else None)
    request = api.rebase_request(api.resolve_job(args.job), config=config)
    client = connect()
    output = check_output_printer(args, progress, Scrubber(str(request.repo), paths=False).text)
    job = api.make_job(request, client=client, progress=progress, output=output)
    internal: InternalError | None = None
    with cancel_on_signals(job.cancel, progress) as cancellation:
        try:
            record = job.run()
        except InternalError as exc:
            internal, record = exc, job.record
        finally:
            client.close()
    api.mark_rebased(request, record)
    return ended(
        args,
        progress,
        record,
        job.diff,
        secrets=(),
        signalled=cancellation.exit_code,
        internal=internal,
    )


def run_attempts_command(args: argparse.Namespace, progress: Callable[[str], None]) -> Outcome:
    """``run --attempts N``: N attempts of the task, ranked; none is applied."""
    from controller import api
    from controller.api.attempts import attempt_requests, run_attempts
    from controller.sandbox.dockerclient import connect

    n = args.attempts
    if getattr(args, "output_dir", None):
        raise UsageError("--output-dir writes one job's artifacts: not with --attempts")
    config, task, calls = run_inputs(args)
    if len(calls) not in {0, 1, n}:
        msg = f"--calls is given once (for every attempt) or {n} times, not {len(calls)}"
        raise UsageError(msg)
    if n < 2 or n > 16:
        raise UsageError(f"--attempts must be from 2 to 16, not {n}")
    choices = [
        api.choose_provider(config, task, calls[i if len(calls) == n else 0] if calls else None)
        for i in range(n)
    ]
    secrets = tuple({s for c in choices for s in c.secrets})
    base = api.JobRequest(
        repo=Path(args.repo),
        task=task,
        provider=choices[0].provider,
        config=config,
        include_local_changes=args.include_local_changes,
        trust_repo_config=args.trust_repo_config,
        consent_trusted_auto=args.consent_trusted_auto,
        runtime=args.runtime,
        secrets=secrets,
    )
    requests = attempt_requests(base, [c.provider for c in choices])
    client = connect()
    jobs: list[api.Job] = []
    scrub = Scrubber(str(base.repo), secrets, paths=False)
    output = check_output_printer(args, progress, scrub.text)

    def cancel(reason: str) -> None:
        for job in jobs:
            job.cancel(reason)

    with cancel_on_signals(cancel, progress) as cancellation:
        try:
            attempts = run_attempts(
                requests,
                concurrency=config.attempt_concurrency,
                client=client,
                progress=progress,
                output=output,
                started=jobs.extend,
            )
        finally:
            for c in choices:
                c.provider.close()
            client.close()
    return _attempts_outcome(attempts, n, str(base.repo), secrets, cancellation.exit_code)


def _attempts_outcome(
    attempts: list[Attempt], n: int, repo: str, secrets: tuple[str, ...], signalled: int | None
) -> Outcome:
    """The attempts ranked: their views (``--json``), a line each, what to do next, and the
    exit status (0 when one awaits review)."""
    from controller.api.attempts import ranked

    store = JobStore()
    views, lines = [], []
    for rank, attempt in enumerate(ranked(attempts), start=1):
        record = attempt.record
        evidence = relative_to_home(store.folder(record.job_id) / "evidence.json")
        data = job_view(record, attempt.diff, evidence, secrets).data()
        index = record.attempt.index if record.attempt is not None else rank
        views.append({"rank": rank, "attempt": index, **data})
        checks = ", ".join(f"{c.id} {c.status}" for c in record.checks) or "no checks"
        size = sum(f.added + f.removed for f in record.files)
        error = f"; {record.error.code}" if record.error is not None else ""
        lines.append(
            f"{rank}. attempt {index}/{n} {record.job_id}: {record.state}{error}; "
            f"{checks}; {len(record.files)} file(s), {size} line(s) changed"
        )
    best = next((a for a in ranked(attempts) if a.record.state == "awaiting_review"), None)
    text = Scrubber(repo, secrets, paths=False).text("\n".join(lines))
    if best is not None:
        jid = best.record.job_id
        text += (
            f"\nreview: patchbox show JOB --diff; apply the one you choose: patchbox apply "
            f"JOB (best ranked: {jid}); the others are then discarded"
        )
    data_out: dict[str, object] = {"attempts": views}
    if signalled is not None:
        return signalled, data_out, text
    if best is not None:
        return ExitCode.OK, data_out, text
    first = ranked(attempts)[0].record
    return exit_code_for_error(first.error.code if first.error else ""), data_out, text


def run_follow_up_command(args: argparse.Namespace, progress: Callable[[str], None]) -> Outcome:
    """``run --from JOB``: a follow-up that starts from JOB's result; its task is JOB's with
    the fields of ``--task`` over it and ``--prompt`` as its prompt."""
    from controller import api
    from controller.config.host import load_config
    from controller.config.inputfile import read_input_file
    from controller.config.task import MAX_TASK_FILE_BYTES, task_from
    from controller.jobs.lineage import context_prompt
    from controller.providers import read_calls
    from controller.strictjson import loads

    if not args.task and not args.prompt:
        raise UsageError("a follow-up needs its own prompt: --prompt TEXT or --task TASK.json")
    if getattr(args, "attempts", 1) != 1 or len(args.calls or ()) > 1:
        raise UsageError("--from runs one follow-up: not with --attempts")
    config = load_config(Path(args.config) if args.config else None)
    if args.no_spare:
        config = config.model_copy(update={"spare_sandboxes": 0})
    calls = [read_calls(Path(c)) for c in args.calls or ()]
    follow, parent, diff = api.follow_up(api.resolve_job(args.from_job))
    if args.repo is not None and Path(args.repo).resolve() != Path(parent.repo):
        msg = f"job {parent.job_id} is of {parent.repo}, not of {Path(args.repo).resolve()}"
        raise UsageError(msg)
    data = dict(parent.task)
    if args.task:
        raw = read_input_file(Path(args.task), "task file", MAX_TASK_FILE_BYTES)
        try:
            given = loads(raw, max_depth=64)
        except ValueError as exc:
            raise UsageError(f"the task file is not JSON: {exc}"[:300]) from None
        if not isinstance(given, dict):
            raise UsageError("the task file is invalid: not a JSON object")
        data.update(given)
    if args.prompt:
        data["prompt"] = args.prompt
    task = task_from(data, what="the follow-up's task")
    told = task.model_copy(update={"prompt": context_prompt(task.prompt, parent, diff)})
    choice = api.choose_provider(config, told, calls[0] if calls else None)
    consent = parent.consent
    applied = parent.state == "applied"
    request = api.JobRequest(
        repo=Path(parent.repo),
        task=task,
        provider=choice.provider,
        config=config,
        include_local_changes=consent.get("include_local_changes", False),
        trust_repo_config=args.trust_repo_config,
        consent_trusted_auto=args.consent_trusted_auto,
        runtime=args.runtime or ("runsc" if parent.runtime == "runsc" else None),
        secrets=choice.secrets,
        follow=follow,
        apply_denied=None if applied else FOLLOW_REVIEW.format(job=parent.job_id),
    )
    return run_request(args, progress, request, choice)


FOLLOW_REVIEW = (
    "a follow-up of job {job}, which is not applied: review the two (patchbox apply of the "
    "follow-up applies both)"
)
"""Why a follow-up in an auto mode stops for review while its parent is not applied."""
