"""Iterating on a job: ``rebase`` (its diff carried onto the repository as it is now, as a
new job) and a follow-up (``run --from``: a new job that starts from its result)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from controller.api.jobs import job, run_job
from controller.api.views import job_diff
from controller.config.host import HostConfig, load_config
from controller.config.task import TaskSpec
from controller.errors import UsageError
from controller.jobs.carried import stale_error
from controller.jobs.evidence import write_evidence
from controller.jobs.lineage import follow_from
from controller.jobs.records import JobRecord, StaleMark
from controller.jobs.request import CarryFrom, FollowFrom, JobRequest
from controller.jobs.settle import held
from controller.jobs.store import JobStore
from controller.providers import ScriptedProvider
from controller.providers.scripted import CallsFile

if TYPE_CHECKING:
    import docker

    from controller.api.jobs import Progress
    from controller.tools.watch import OutputListener


def rebase_request(job_id: str, *, config: HostConfig | None = None) -> JobRequest:
    """The request of a job that carries ``job_id`` (awaiting review) onto its repository as
    it is now (:func:`rebase_job`): the old job's task, consents, mode and runtime, its diff
    and baseline, and no model. ``JOB_REBASED`` for a job rebased already, ``USAGE_ERROR``
    for one that does not await review."""
    store = JobStore()
    old = job(job_id)
    if old.stale is not None:
        raise stale_error(old, "rebased again")
    if old.state != "awaiting_review" or old.baseline is None:
        msg = f"job {old.job_id} is {old.state}; only a job awaiting review is rebased"
        raise UsageError(msg)
    if old.parent is not None and old.parent.relation == "follow-up":
        parent = job(old.parent.job_id)
        if parent.state != "applied":
            msg = (
                f"job {old.job_id} follows up job {parent.job_id}, which is not applied: its "
                "diff holds only the change on top of that job's; rebase that job, then "
                "follow it up again (or apply it first)"
            )
            raise UsageError(msg)
    diff = job_diff(store, old.job_id) or ""
    consent = old.consent
    return JobRequest(
        repo=Path(old.repo),
        task=TaskSpec.model_validate(old.task),
        provider=ScriptedProvider(CallsFile(turns=[])),  # no model: the diff is carried
        config=config or load_config(),
        include_local_changes=consent.get("include_local_changes", False),
        trust_repo_config=consent.get("trust_repo_config", False),
        consent_trusted_auto=consent.get("trusted_auto", False),
        runtime="runsc" if old.runtime == "runsc" else "runc",
        carry=CarryFrom(old.job_id, diff, old.diff_sha256, old.baseline, old.final_message),
    )


def mark_rebased(request: JobRequest, record: JobRecord) -> None:
    """Once the job of a :func:`rebase_request` awaits review or is applied, the job it
    carried is marked stale (as long as it still awaits review): its decision and checks
    are kept, and it is not applied (``JOB_REBASED``)."""
    carry = request.carry
    if carry is None or record.state not in {"awaiting_review", "applied"}:
        return
    store = JobStore()
    with held(store, carry.job_id) as parent:
        if parent.state == "awaiting_review" and parent.stale is None:
            parent.stale = StaleMark(by=record.job_id, at=time.time())
            store.save(parent)
            write_evidence(parent, carry.diff, store)


def rebase_job(
    job_id: str,
    *,
    config: HostConfig | None = None,
    client: docker.DockerClient | None = None,
    progress: Progress | None = None,
    output: OutputListener | None = None,
) -> tuple[JobRecord, str | None]:
    """Carries a job awaiting review onto its repository as it is now: a new job (its
    ``parent`` the old one) on a new baseline, the old diff merged onto it three-way,
    validated, the required checks run in a fresh sandbox, and a decision. It ends
    ``failed`` with ``REBASE_CONFLICT`` (the files and lines named, nothing written) when
    the diff does not merge. Then :func:`mark_rebased`. Returns the new job's record and
    diff."""
    request = rebase_request(job_id, config=config)
    record, diff = run_job(request, client=client, progress=progress, output=output)
    mark_rebased(request, record)
    return record, diff


def follow_up(job_id: str) -> tuple[FollowFrom, JobRecord, str]:
    """What a follow-up of ``job_id`` starts from (a job awaiting review or applied; its
    result made in the private git dir), the parent's record and its diff. ``USAGE_ERROR``
    for a parent in another state, ``JOB_REBASED`` or ``JOB_SUPERSEDED`` for a stale one."""
    store = JobStore()
    parent = job(job_id)
    follow, diff = follow_from(store, parent)
    return follow, parent, diff
