"""What the operator asks a job for (all of it trusted), and which refusals of a job are
the requester's to fix."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from controller.config.host import HostConfig
from controller.config.task import TaskSpec
from controller.errors import ErrorCode, PatchboxError
from controller.jobs.records import AttemptLink, JobRecord, ParentLink
from controller.providers.base import Provider
from controller.repo.baseline import Baseline
from controller.repo.pin import RepoPin
from controller.sandbox.base import Runtime
from controller.sandbox.labels import ControllerIdentity, new_job_id

Refusals = Literal["record", "raise"]
"""What :meth:`Job.run` does with a job refused before it started: a failed record, or
the error raised and no record."""
REFUSALS = frozenset(
    {
        ErrorCode.NOT_A_REPOSITORY,
        ErrorCode.REPO_BLOCKED,
        ErrorCode.CONSENT_REQUIRED,
        ErrorCode.JOB_ALREADY_RUNNING,
    }
)
"""The refusals of a job that are the requester's to fix, before anything of it ran."""


@dataclass(frozen=True)
class CarryFrom:
    """A job's diff to carry onto the repository as it is now, instead of a model's work
    (``patchbox rebase``): the job, its diff as recorded and the baseline it was made on."""

    job_id: str
    diff: str
    diff_sha256: str | None
    baseline: Baseline
    final_message: str | None = None


@dataclass(frozen=True)
class FollowFrom:
    """The job a follow-up continues (``run --from``): its id and diff hash, and its result
    (its baseline plus its diff), the follow-up's baseline."""

    job_id: str
    diff_sha256: str | None
    baseline: Baseline


@dataclass
class JobRequest:
    """What the operator asked for; all of it trusted."""

    repo: Path
    task: TaskSpec
    provider: Provider
    config: HostConfig = field(default_factory=HostConfig)
    include_local_changes: bool = False
    trust_repo_config: bool = False
    consent_trusted_auto: bool = False
    runtime: Runtime | None = None
    secrets: tuple[str, ...] = ()
    """Values that must appear nowhere (the provider key): scrubbed from the evidence."""
    pin: RepoPin | None = None
    """A service job's repository, held to the folder its tenant submitted: verified before
    anything of it is read and again once the baseline is frozen (or its build failed),
    and an ``auto`` apply writes only that folder."""
    job_id: str | None = None
    """The job's id (a new one when None; the service gives its own)."""
    apply_denied: str | None = None
    """Why the requester may not apply this job (a service tenant without ``allow_apply``, a
    job on an uploaded bundle): ``auto`` and ``trusted-auto`` then stop for review. None
    when it may."""
    caller_driven: bool = False
    """The provider is a caller (``api.open_session``): the time it takes between its calls
    is idle, not counted by the wall clock."""
    carry: CarryFrom | None = None
    """The change is this job's diff carried onto a new baseline; no model runs."""
    follow: FollowFrom | None = None
    """A follow-up: the job starts from this job's result, not from the repository."""
    attempt: AttemptLink | None = None
    """One of N attempts of the task (``run --attempts``): which one, and its siblings."""
    repo_locked: bool = False
    """The caller holds the repository's write lock for this job (the attempts of one task
    run at once under the lock their runner took); the job does not take it."""


def new_record(request: JobRequest, identity: ControllerIdentity) -> JobRecord:
    """The record of a job about to run ``request`` (its id the service's, or a new one)."""
    carry, follow = request.carry, request.follow
    parent = None
    if carry is not None:
        parent = ParentLink(job_id=carry.job_id, diff_sha256=carry.diff_sha256)
    elif follow is not None:
        parent = ParentLink(
            job_id=follow.job_id, diff_sha256=follow.diff_sha256, relation="follow-up"
        )
    return JobRecord(
        parent=parent,
        attempt=request.attempt,
        job_id=request.job_id or new_job_id(),
        repo=request.pin.path if request.pin is not None else str(request.repo.resolve()),
        task=request.task.model_dump(mode="json"),
        mode=request.task.mode,
        consent={
            "include_local_changes": request.include_local_changes,
            "trust_repo_config": request.trust_repo_config,
            "trusted_auto": request.consent_trusted_auto,
        },
        runtime=request.runtime or request.config.runtime,
        controller=identity.token,
        controller_host=identity.host,
    )


def refused(failure: PatchboxError | None, record: JobRecord, cancelled: threading.Event) -> bool:
    """Whether the job failed with one of :data:`REFUSALS` before it had a baseline."""
    return (
        failure is not None
        and failure.code in REFUSALS
        and record.state == "failed"
        and record.baseline is None
        and not cancelled.is_set()
    )
