"""Where a service job comes from: a new task (the operator's model, or the tenant's calls),
a rebase (the earlier job's diff carried; no model), or a follow-up (the earlier job's
result; the model is told what it did)."""

from __future__ import annotations

from dataclasses import dataclass

from controller import api
from controller.config.host import HostConfig
from controller.jobs.lineage import context_prompt
from controller.jobs.request import FollowFrom
from controller.service.store import JobRow


@dataclass(frozen=True)
class Lineage:
    """What a job comes from: a rebase's request, or a follow-up's start and why it stops
    for review (its parent is not applied); nothing for a new job."""

    carried: api.JobRequest | None = None
    follow: FollowFrom | None = None
    denied: str | None = None


FOLLOW_REVIEW = (
    "a follow-up of job {job}, which is not applied: review the two (applying the follow-up "
    "applies both)"
)
"""Why a follow-up in an auto mode stops for review while its parent is not applied."""


def choose(host: HostConfig, row: JobRow) -> tuple[api.ProviderChoice, Lineage]:
    """The job's model, or for a rebase none (the parent's diff is carried), with what
    the job comes from: a rebase's request (:func:`controller.api.rebase_request`), or a
    follow-up's parent result (:func:`controller.api.follow_up`; the model is told what
    the parent did)."""
    request = row.request
    if request.rebase_of:
        carried = api.rebase_request(request.rebase_of, config=host)
        return api.ProviderChoice(carried.provider), Lineage(carried=carried)
    if request.follow_of:
        follow, parent, diff = api.follow_up(request.follow_of)
        prompt = context_prompt(request.task.prompt, parent, diff)
        told = request.task.model_copy(update={"prompt": prompt})
        denied = None if parent.state == "applied" else FOLLOW_REVIEW.format(job=parent.job_id)
        choice = api.choose_provider(host, told, request.calls)
        return choice, Lineage(follow=follow, denied=denied)
    return api.choose_provider(host, request.task, request.calls), Lineage()
