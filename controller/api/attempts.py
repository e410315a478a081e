"""Best of N (``run --attempts N``): N attempts of one task from the same baseline, each a
job of its own in its own sandbox (the sandboxes share nothing: no network, no volume),
run a few at a time under the repository's one write lock, each validated and checked and
stopped for review (an attempt never applies itself); then ranked: the attempts whose
required checks all passed first, then the smaller diff. Applying one
(:func:`controller.api.apply_job`) discards the others that are still open."""

from __future__ import annotations

import dataclasses
import shutil
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from controller.api.jobs import make_job
from controller.errors import InternalError, PatchboxError, UsageError
from controller.jobs.records import AttemptLink, JobRecord
from controller.jobs.store import JobStore, write_lock
from controller.repo.layout import locate
from controller.sandbox.labels import new_job_id

if TYPE_CHECKING:
    import docker

    from controller.jobs.engine import Job
    from controller.jobs.request import JobRequest
    from controller.tools.watch import OutputListener

MAX_ATTEMPTS = 16
ONE_OF_N = "one of {n} attempts: apply the one you choose"
"""Why an attempt in an auto mode stops for review."""


def attempt_requests(request: JobRequest, providers: Sequence[object]) -> list[JobRequest]:
    """The requests of ``len(providers)`` attempts of ``request``: the same task, repository
    and options, each with its own provider and job id, linked to the others, held to
    review, and run under the write lock their runner takes."""
    n = len(providers)
    if not 2 <= n <= MAX_ATTEMPTS:
        msg = f"the number of attempts must be from 2 to {MAX_ATTEMPTS}, not {n}"
        raise UsageError(msg)
    ids = [new_job_id() for _ in range(n)]
    return [
        dataclasses.replace(
            request,
            provider=provider,  # type: ignore[arg-type]
            job_id=job_id,
            attempt=AttemptLink(index=i + 1, job_ids=ids),
            apply_denied=request.apply_denied or ONE_OF_N.format(n=n),
            repo_locked=True,
        )
        for i, (provider, job_id) in enumerate(zip(providers, ids, strict=True))
    ]


@dataclasses.dataclass
class Attempt:
    """One attempt as it ended: its record, diff and the error it raised (a refusal before
    it started leaves no record of its own: ``record`` is then its job's first record)."""

    record: JobRecord
    diff: str | None
    error: PatchboxError | None = None


def run_attempts(  # noqa: PLR0913 - the attempts, then keyword-only listeners
    requests: Sequence[JobRequest],
    *,
    concurrency: int,
    client: docker.DockerClient,
    progress: Callable[[str], None] | None = None,
    output: OutputListener | None = None,
    started: Callable[[Sequence[Job]], None] | None = None,
) -> list[Attempt]:
    """Runs the attempts, ``concurrency`` at a time, under the repository's write lock
    (``JOB_ALREADY_RUNNING`` when another job holds it); returns them ranked
    (:func:`ranked`). ``started`` gets the jobs before they run (to cancel them from a
    signal). A refusal of one (``CONSENT_REQUIRED``, ``REPO_BLOCKED``) cancels the others and
    is raised, leaving no record."""
    say = progress or (lambda _m: None)
    if requests[0].pin is None:
        locate(requests[0].repo.resolve())  # NOT_A_REPOSITORY before any lock
    jobs = [
        make_job(
            r,
            client=client,
            progress=_labelled(say, i + 1, len(requests)),
            output=output,
        )
        for i, r in enumerate(requests)
    ]
    if started is not None:
        started(jobs)
    refusal: list[PatchboxError] = []
    lock = threading.Lock()

    def one(job: Job) -> Attempt:
        if refusal:
            job.cancel("another attempt was refused")
        try:
            return Attempt(job.run(refusals="raise"), job.diff)
        except InternalError as exc:
            return Attempt(job.record, job.diff, exc)
        except PatchboxError as exc:  # refused before it started: no record left
            with lock:
                refusal.append(exc)
            for other in jobs:
                other.cancel("another attempt was refused")
            return Attempt(job.record, None, exc)

    with (
        write_lock(jobs[0].record.repo, holder=jobs[0].record.job_id),
        ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool,
    ):
        done = list(pool.map(one, jobs))
    if refusal:
        for attempt in done:  # the others were cancelled: their records go too
            shutil.rmtree(JobStore().folder(attempt.record.job_id), ignore_errors=True)
        raise refusal[0]
    return ranked(done)


def _labelled(say: Callable[[str], None], index: int, n: int) -> Callable[[str], None]:
    return lambda message: say(f"attempt {index}/{n}: {message}")


def diff_size(record: JobRecord) -> int:
    """Lines added and removed."""
    return sum(f.added + f.removed for f in record.files)


def ranked(attempts: Sequence[Attempt]) -> list[Attempt]:
    """Best first: awaiting review with every required check passed, then awaiting review,
    then the rest; within each, the smaller diff, then the attempt's number."""

    def key(a: Attempt) -> tuple[int, int, int]:
        r = a.record
        passed = all(c.status in {"passed", "skipped"} for c in r.checks if c.required)
        tier = 0 if r.state == "awaiting_review" and passed else 1
        if r.state != "awaiting_review":
            tier = 2
        index = r.attempt.index if r.attempt is not None else 0
        return tier, diff_size(r), index

    return sorted(attempts, key=key)
