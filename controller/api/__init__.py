"""The engine's one surface: what the CLI, the MCP server, the HTTP service, the demo and the
service's client use, and what scripts call. A typed request (:class:`JobRequest`) goes in;
typed views come out (:class:`JobView`, :class:`ApplyView`, ...). Every error is a
:class:`controller.errors.PatchboxError` with its code, and a remedy as data (``hint``) that
each front door says in its own words.

Two ways to make a job:

- :func:`run_job` (or :func:`make_job`, then ``job.run()``): a request with a model provider
  (:func:`choose_provider`); the job runs to its decision.
- :func:`open_session`: the caller is the model (:mod:`controller.api.session`).

Then, on a job awaiting review: :func:`apply_job`, :func:`revert_job`, :func:`discard_job`,
and :func:`rebase_job` (its diff carried onto the repository as it is now, as a new job);
on a running one, :func:`cancel_job`. :func:`resolve_job` turns what a user typed (a prefix
of an id, ``last``) into a job id.

.. code-block:: python

    from pathlib import Path
    from controller import api

    with api.open_session(Path("~/src/project").expanduser()) as session:
        hits = session.call("search_text", {"query": "def parse_date"})
        edit = {"path": "dates.py", "oldText": "%d/%m/%Y", "newText": "%Y-%m-%d"}
        session.call("replace_text", edit)
        proposal = session.propose("ISO dates")
    if proposal.status == "awaiting_review":
        api.apply_job(proposal.job_id)

The names are loaded on first use: a command that reads a job's record does not import the
sandbox's machinery.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from controller.api.iterate import follow_up, mark_rebased, rebase_job, rebase_request
    from controller.api.jobs import (
        ProviderChoice,
        RemoteOrigin,
        apply_job,
        apply_remote_diff,
        cancel_job,
        check_provider,
        choose_provider,
        describe_provider,
        discard_job,
        job,
        make_job,
        remote_applies,
        remove_spares,
        resolve_job,
        revert_job,
        run_job,
        settle,
        settle_leftovers,
    )
    from controller.api.session import (
        CallResult,
        IdleEnd,
        Proposal,
        Session,
        default_task,
        open_session,
    )
    from controller.api.views import (
        ApplyView,
        BundleRef,
        CheckView,
        DiscardView,
        FileView,
        JobRow,
        JobView,
        RevertView,
        job_diff,
        job_row,
        job_view,
        review_fallback,
    )
    from controller.config.task import (
        load_task,
        task_from,
    )
    from controller.jobs.engine import Job
    from controller.jobs.request import JobRequest
    from controller.tools.watch import CheckLine

_WHERE = {
    "ProviderChoice": "controller.api.jobs",
    "RemoteOrigin": "controller.api.jobs",
    "apply_job": "controller.api.jobs",
    "apply_remote_diff": "controller.api.jobs",
    "cancel_job": "controller.api.jobs",
    "check_provider": "controller.api.jobs",
    "choose_provider": "controller.api.jobs",
    "describe_provider": "controller.api.jobs",
    "discard_job": "controller.api.jobs",
    "job": "controller.api.jobs",
    "make_job": "controller.api.jobs",
    "follow_up": "controller.api.iterate",
    "mark_rebased": "controller.api.iterate",
    "rebase_job": "controller.api.iterate",
    "rebase_request": "controller.api.iterate",
    "remote_applies": "controller.api.jobs",
    "remove_spares": "controller.api.jobs",
    "resolve_job": "controller.api.jobs",
    "revert_job": "controller.api.jobs",
    "run_job": "controller.api.jobs",
    "settle": "controller.api.jobs",
    "settle_leftovers": "controller.api.jobs",
    "CallResult": "controller.api.session",
    "IdleEnd": "controller.api.session",
    "Proposal": "controller.api.session",
    "Session": "controller.api.session",
    "default_task": "controller.api.session",
    "open_session": "controller.api.session",
    "ApplyView": "controller.api.views",
    "BundleRef": "controller.api.views",
    "CheckView": "controller.api.views",
    "DiscardView": "controller.api.views",
    "FileView": "controller.api.views",
    "JobRow": "controller.api.views",
    "JobView": "controller.api.views",
    "RevertView": "controller.api.views",
    "job_diff": "controller.api.views",
    "job_row": "controller.api.views",
    "job_view": "controller.api.views",
    "review_fallback": "controller.api.views",
    "load_task": "controller.config.task",
    "task_from": "controller.config.task",
    "Job": "controller.jobs.engine",
    "JobRequest": "controller.jobs.request",
    "CheckLine": "controller.tools.watch",
}

if not TYPE_CHECKING:  # the type checker sees the imports above, and nothing else

    def __getattr__(name: str) -> Any:
        where = _WHERE.get(name)
        if where is None:
            msg = f"module {__name__!r} has no attribute {name!r}"
            raise AttributeError(msg)
        return getattr(importlib.import_module(where), name)


__all__ = [
    "ApplyView",
    "BundleRef",
    "CallResult",
    "CheckLine",
    "CheckView",
    "DiscardView",
    "FileView",
    "IdleEnd",
    "Job",
    "JobRequest",
    "JobRow",
    "JobView",
    "Proposal",
    "ProviderChoice",
    "RemoteOrigin",
    "RevertView",
    "Session",
    "apply_job",
    "apply_remote_diff",
    "cancel_job",
    "check_provider",
    "choose_provider",
    "default_task",
    "describe_provider",
    "discard_job",
    "follow_up",
    "job",
    "job_diff",
    "job_row",
    "job_view",
    "load_task",
    "make_job",
    "mark_rebased",
    "open_session",
    "rebase_job",
    "rebase_request",
    "remote_applies",
    "remove_spares",
    "resolve_job",
    "revert_job",
    "review_fallback",
    "run_job",
    "settle",
    "settle_leftovers",
    "task_from",
]
