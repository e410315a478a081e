"""The job's diff as the engine records it: reconciled with the effect ledger, validated by
the change-set rules, its files and flagged lines in the record (flagged even when the
rules refuse it, so that ``show --diff`` says what it holds); applied when an auto mode's
decision says so."""

from __future__ import annotations

from collections.abc import Sequence

from controller.changes.changeset import ChangeSet
from controller.changes.collect import Collected
from controller.changes.rules import control_lines
from controller.changes.validate import validate_changeset
from controller.config.task import TaskSpec
from controller.errors import ApplyConflictError, PatchboxError
from controller.jobs.decision import with_conflict
from controller.jobs.reconcile import reconcile
from controller.jobs.records import ControlLine, Decision, FileChange, JobRecord
from controller.repo.baseline import Baseline
from controller.repo.pin import RepoPin


def record_changeset(  # noqa: PLR0913 - the record, the diff's parts, then keyword-only
    record: JobRecord,
    baseline: Baseline,
    collected: Collected,
    task: TaskSpec,
    *,
    protected: Sequence[str],
    prepared: Baseline | None,
    carried: bool = False,
) -> ChangeSet | None:
    """The validated change set, recorded in ``record``; None when the job made no change.
    ``prepared`` is the baseline the job's sandbox was prepared from (the ledger's); a
    ``carried`` diff (a rebase's, made on the host) has no ledger to be held to."""
    record.diff_sha256 = collected.diff_sha256
    try:
        if not carried:
            reconcile(collected, record, prepared)  # first: a hidden reported file is named
        changeset = (
            validate_changeset(
                baseline,
                collected.diff,
                allowed_paths=task.allowed_paths,
                extra_protected=tuple(protected),
            )
            if collected.diff
            else None
        )
    except PatchboxError:  # refused, yet shown by show --diff: flagged all the same
        flagged = control_lines(collected.diff)
        record.control_characters = [ControlLine(**c.model_dump()) for c in flagged]
        raise
    if changeset is None:
        return None
    record.control_characters = [
        ControlLine(**c.model_dump()) for c in changeset.control_characters
    ]
    record.files = [
        FileChange(
            path=f.path,
            old_path=f.old_path,
            kind=f.kind,
            added=f.added,
            removed=f.removed,
            sha256_before=f.sha256_before,
            sha256_after=f.sha256_after,
            calls=[e.id for e in record.ledger if any(x.path == f.path for x in e.files)],
        )
        for f in changeset.files
    ]
    return changeset


def apply_decided(  # noqa: PLR0913 - the decision's inputs, then keyword-only
    baseline: Baseline,
    diff: str,
    decision: Decision,
    *,
    job_id: str,
    allowed_paths: list[str] | None,
    protected: Sequence[str],
    pin: RepoPin | None,
) -> Decision:
    """Applies ``diff`` to the work tree as an auto mode decided; ``decision`` with the
    conflict when the work tree moved under it."""
    from controller.changes.apply import apply_changeset  # auto mode only: kept off start

    try:
        apply_changeset(
            baseline,
            diff,
            job_id=job_id,
            allowed_paths=allowed_paths,
            extra_protected=tuple(protected),
            pin=pin,
        )
    except ApplyConflictError as exc:
        return with_conflict(decision, exc.message)
    return decision
