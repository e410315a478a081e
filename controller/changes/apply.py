"""Apply and revert of a validated change set on the user's work tree.

No git command runs in the user's repository: operations in progress are read as files
(:mod:`controller.repo.layout`), baseline contents come from the controller's private git
dir (or from the work tree, for a file there whose git blob id is the baseline entry's),
and the work tree is reached only through folder descriptors opened without following
symlinks (:mod:`controller.changes.worktree`). The index is never opened.

:func:`apply_changeset` validates the diff again (:func:`controller.changes.validate
.prepare_changeset`: rules, patch check, every new content computed in memory), then plans
the apply on the work tree (:mod:`controller.changes.plan`: no git operation is in
progress, and every touched path has its baseline content, else ``APPLY_CONFLICT`` with
nothing written and a message naming the files that differ; ``merge=True`` merges a file
the user changed meanwhile three-way, and a file that does not merge cleanly is a conflict
of its own). Where HEAD points does not matter: commits or a branch switch since the
baseline that leave the touched paths as they were do not stop an apply. The journal
record (every before and after content: for a merged file, the user's content it
replaced) is written and fsync'd before the first write; then the paths are moved to their
new contents (:mod:`controller.changes.transaction`) and the apply is marked done.

:func:`revert_changeset` requires every touched path to still have its post-apply content,
restores the pre-apply contents and modes the same way (what the apply replaced, the
user's own changes included), and verifies them; HEAD may have moved in between.

Both start through :func:`controller.changes.recovery.job_at_rest`: an interrupted apply or
revert of the job is settled by the journal rule first. The recovery functions, the
conflicts and their errors are importable from here too.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field

from controller.changes.changeset import ChangeSet, ChangesetLimits
from controller.changes.conflicts import apply_refused, check_repo, state_conflict
from controller.changes.journal import (
    ApplyRecord,
    Journal,
    Recorded,
    check_job_id,
    contents_digest,
    fault_point,
    new_nonce,
)
from controller.changes.plan import plan_apply
from controller.changes.recovery import Recovery, job_at_rest, job_state, recover, recover_job
from controller.changes.transaction import mismatches, run_or_roll_back
from controller.changes.validate import prepare_changeset
from controller.changes.worktree import FolderReplacedError, WorkTree
from controller.errors import ApplyConflictError, RevertConflictError
from controller.reasons import Conflict
from controller.repo.baseline import Baseline
from controller.repo.layout import locate

if TYPE_CHECKING:
    from controller.repo.pin import RepoPin

__all__ = [
    "AppliedFile",
    "ApplyConflictError",
    "ApplyResult",
    "Conflict",
    "Recovery",
    "RevertConflictError",
    "RevertResult",
    "apply_changeset",
    "job_state",
    "recover",
    "recover_job",
    "revert_changeset",
]


class AppliedFile(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str
    change: Literal["create", "modify", "delete"]
    sha256_before: str | None
    sha256_after: str | None
    merged: bool = False


class ApplyResult(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    job_id: str
    changeset: ChangeSet
    files: list[AppliedFile]
    """Per path written (a rename is a create and a delete)."""
    merged: list[str]
    """Paths merged three-way with the user's concurrent change (``merge=True`` only)."""
    discarded: list[str] = Field(default_factory=list)
    """The other attempts of the same task, discarded once this one was applied."""


class RevertResult(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    job_id: str
    files: list[AppliedFile]
    """Per path restored; ``sha256_after`` is the restored content."""


def apply_changeset(  # noqa: PLR0913 - the change set and keyword-only job inputs
    baseline: Baseline,
    diff: str | bytes,
    *,
    job_id: str,
    allowed_paths: Sequence[str] | None = None,
    extra_protected: Sequence[str] = (),
    limits: ChangesetLimits | None = None,
    merge: bool = False,
    journal: Journal | None = None,
    pin: RepoPin | None = None,
) -> ApplyResult:
    """Applies a job's diff to the user's work tree, all or nothing.

    Raises :class:`~controller.errors.ChangesetInvalidError` when the diff fails
    validation, :class:`ApplyConflictError` when the work tree is not as expected (also for
    a job already applied; its ``conflicts`` name every path and why, its message the files
    that differ and, where ``merge`` would merge them, the command); in both cases nothing
    was written. A job that was rolled back or reverted may be applied again.

    With ``pin`` (a service job's repository) the repository and its git data are verified
    first (:meth:`~controller.repo.pin.RepoPin.verify`) and the work tree is written only as
    the pinned folder: ``REPO_NOT_ALLOWED`` with nothing written otherwise."""
    check_job_id(job_id)
    if pin is not None:
        pin.verify()
    journal = journal or Journal()
    prepared = prepare_changeset(
        baseline,
        diff,
        allowed_paths=allowed_paths,
        extra_protected=extra_protected,
        limits=limits,
        work_tree=Path(baseline.repo),  # the top of the work tree the baseline was made of
    )
    layout = locate(Path(baseline.repo))
    repo = str(layout.top)
    with job_at_rest(journal, job_id, ApplyConflictError, repo, pin=pin) as applied:
        if applied is not None:
            raise ApplyConflictError(
                [Conflict(code="already_applied", message=f"job {job_id} is applied")]
            )
        journal.discard(job_id)
        with WorkTree(layout.top, pin=pin) as wt:
            plan = plan_apply(prepared, layout, baseline, wt, merge)
            if plan.conflicts:
                raise apply_refused(plan.conflicts, job_id=job_id, suggest_merge=plan.suggest_merge)
            fault_point("apply.checked")
            record = ApplyRecord(
                job_id=job_id,
                repo=repo,
                head=baseline.head,
                baseline_tree=baseline.tree,
                diff_sha256=prepared.changeset.diff_sha256,
                nonce=new_nonce(),
                paths=plan.paths,
                created_dirs=plan.created_dirs,
                contents_sha256=contents_digest(plan.before, plan.after),
                top_dev=wt.identity()[0],
                top_ino=wt.identity()[1],
            )
            journal.write_record(record, plan.before, plan.after)
            rec = Recorded(record=record, before=plan.before, after=plan.after)
            run_or_roll_back(wt, rec, "after", "apply", journal)
        journal.mark(job_id, "apply.done")
        fault_point("apply.done")
    return ApplyResult(
        job_id=job_id,
        changeset=prepared.changeset,
        files=_applied_files(record),
        merged=[p.path for p in record.paths if p.merged],
    )


def revert_changeset(
    job_id: str, *, journal: Journal | None = None, pin: RepoPin | None = None
) -> RevertResult:
    """Restores every path an applied job touched. Raises
    :class:`RevertConflictError` (nothing written) when the job is not applied, a git
    operation is in progress, or a touched path no longer has its post-apply content. With
    ``pin``, as :func:`apply_changeset`."""
    check_job_id(job_id)
    journal = journal or Journal()
    if pin is not None:
        pin.verify()
    with job_at_rest(journal, job_id, RevertConflictError, pin=pin) as rec:
        if rec is None:
            raise RevertConflictError(
                [Conflict(code="not_applied", message=f"job {job_id} is not applied")]
            )
        _revert_locked(journal, rec, pin)
    return RevertResult(job_id=job_id, files=_applied_files(rec.record, reverse=True))


def _revert_locked(journal: Journal, rec: Recorded, pin: RepoPin | None) -> None:
    record = rec.record
    conflicts = check_repo(locate(Path(record.repo)))
    with _applied_tree(record, pin) as wt:
        for entry in record.paths:
            state = wt.state(entry.path)
            if not state.matches(entry.after):
                conflicts.append(state_conflict(entry.path, state, absent=entry.after is None))
        if conflicts:
            raise RevertConflictError(conflicts)
        fault_point("revert.checked")
        journal.mark(record.job_id, "revert.begin")
        fault_point("revert.begin")
        run_or_roll_back(wt, rec, "before", "revert", journal)
    with _applied_tree(record, pin) as fresh:
        wrong = mismatches(fresh, rec, "before")
    if wrong:
        raise RevertConflictError(
            [
                Conflict(code="needs_attention", path=p, message="differs after the revert")
                for p in wrong
            ]
        )
    journal.mark(record.job_id, "revert.done")
    fault_point("revert.done")


def _applied_tree(record: ApplyRecord, pin: RepoPin | None) -> WorkTree:
    """The work tree an apply wrote: the same folder, or ``REVERT_CONFLICT`` with nothing
    written."""
    try:
        return WorkTree(Path(record.repo), pin=pin, identity=record.top)
    except FolderReplacedError as exc:
        message = "the work tree is not the folder the apply wrote (moved or replaced)"
        raise RevertConflictError([Conflict(code="needs_attention", message=message)]) from exc


def _applied_files(record: ApplyRecord, *, reverse: bool = False) -> list[AppliedFile]:
    files = []
    for p in record.paths:
        first, second = (p.after, p.before) if reverse else (p.before, p.after)
        change: Literal["create", "modify", "delete"] = (
            "create" if first is None else "delete" if second is None else "modify"
        )
        files.append(
            AppliedFile(
                path=p.path,
                change=change,
                sha256_before=first.sha256 if first else None,
                sha256_after=second.sha256 if second else None,
                merged=p.merged,
            )
        )
    return files
