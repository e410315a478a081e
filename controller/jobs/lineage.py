"""A job's lineage: a follow-up (``run --from JOB``) starts from its parent's result, and is
applied on what the work tree holds.

A follow-up's baseline is its parent's baseline plus its parent's diff
(:func:`controller.changes.carry.result_baseline`), so its own diff is the increment on the
parent's result. Its apply depends on its ancestors (a follow-up of a follow-up is a chain):

- its parent is applied: the work tree holds the parent's result, so the increment is applied
  on it;
- else the nearest applied ancestor's result (or, with none applied, the chain's first
  job's baseline) is the base, and the combined diff from that base to the follow-up's
  result is applied, all or nothing; the ancestors it holds are marked stale
  (``followed_up``): their change is applied, as part of the follow-up's, and each is then
  refused at apply (``JOB_SUPERSEDED``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from controller.changes.carry import carry, result_baseline, tree_diff
from controller.errors import UsageError
from controller.jobs.carried import stale_error
from controller.jobs.evidence import job_diff
from controller.jobs.records import JobRecord
from controller.jobs.request import FollowFrom
from controller.jobs.store import JobStore
from controller.repo.baseline import Baseline

FOLLOWED = frozenset({"awaiting_review", "applied"})
"""The states a job is followed up from."""
CONTEXT_LIMIT = 20_000
"""Characters of the parent's diff the model is shown (the files hold all of it)."""


def follow_from(store: JobStore, parent: JobRecord) -> tuple[FollowFrom, str]:
    """What a follow-up of ``parent`` starts from, and the parent's diff. ``USAGE_ERROR`` for
    a parent that is not awaiting review or applied; ``JOB_REBASED`` or ``JOB_SUPERSEDED`` for
    a stale one."""
    if parent.stale is not None:
        raise stale_error(parent, "followed up")
    if parent.state not in FOLLOWED or parent.baseline is None:
        msg = (
            f"job {parent.job_id} is {parent.state}; a follow-up starts from a job awaiting "
            "review or applied"
        )
        raise UsageError(msg)
    diff = job_diff(store, parent.job_id) or ""
    result = result_baseline(parent.baseline, diff)
    return FollowFrom(parent.job_id, parent.diff_sha256, result), diff


def context_prompt(prompt: str, parent: JobRecord, diff: str) -> str:
    """The follow-up's prompt as the model gets it: the new prompt, then what the job it
    continues did (its final message, its diff, bounded)."""
    shown = diff if len(diff) <= CONTEXT_LIMIT else diff[:CONTEXT_LIMIT] + "\n[diff cut]\n"
    return (
        f"{prompt}\n\nThis task follows up an earlier job ({parent.job_id}). The files you see "
        "already hold that job's change; make yours on top of it.\n"
        f"Its final message: {parent.final_message or '(none)'}\n"
        f"Its diff:\n{shown}"
    )


@dataclass
class ApplyBase:
    """What an apply of a job writes: on ``baseline`` (what the work tree should hold at
    the touched paths), ``diff``; and the ancestors (follow-ups' parents) its apply holds."""

    baseline: Baseline
    diff: str
    ancestors: list[JobRecord] = field(default_factory=list)


def apply_base(store: JobStore, record: JobRecord, diff: str) -> ApplyBase:
    """The base and diff of an apply of ``record`` (see the module docstring)."""
    assert record.baseline is not None  # noqa: S101 - checked by the caller
    ancestors: list[JobRecord] = []
    node = record
    while node.parent is not None and node.parent.relation == "follow-up":
        parent = store.load(node.parent.job_id)
        if parent.state == "applied":
            break
        if parent.stale is not None or parent.baseline is None:
            raise (
                stale_error(parent, "applied")
                if parent.stale
                else UsageError(
                    f"job {parent.job_id}, which job {record.job_id} follows up, has no baseline"
                )
            )
        ancestors.append(parent)
        node = parent
    if not ancestors:
        return ApplyBase(record.baseline, diff)
    base = ancestors[-1].baseline
    assert base is not None  # noqa: S101 - checked in the walk
    result = carry(record.baseline, diff, record.baseline).collected.tree
    return ApplyBase(base, tree_diff(base, result), ancestors)


def combined_diff(store: JobStore, record: JobRecord, diff: str) -> str | None:
    """A follow-up's change and its ancestors' in one: the diff from the chain's first
    job's baseline to this job's result. None for a job that follows up nothing."""
    if record.parent is None or record.parent.relation != "follow-up":
        return None
    assert record.baseline is not None  # noqa: S101 - a follow-up starts from one
    root = record
    while root.parent is not None and root.parent.relation == "follow-up":
        root = store.load(root.parent.job_id)
    assert root.baseline is not None  # noqa: S101 - followed up only with one
    result = carry(record.baseline, diff, record.baseline).collected.tree
    return tree_diff(root.baseline, result)
