"""A job's record agreeing with the journal, before anything reads its state.

An apply or a revert writes the work tree under the journal (:mod:`controller.changes.journal`)
and only then the job's record: a process killed in between leaves the journal's word and the
record's apart (the files all written, the record still ``awaiting_review``), and one killed
while it wrote leaves the work tree part way. Every command and API that reads a job's state
(``jobs``, ``show``, ``apply``, ``revert``, ``discard``, the API's and the service's views) goes
through :func:`settled` first:

- an interrupted apply or revert is settled by the journal rule
  (:func:`controller.changes.recovery.recover_job`, under the journal's locks): rolled back,
  so the work tree holds every path's content before the operation, or the job needs
  attention (a path holds neither content; nothing is written);
- then the record moves to what the journal says the work tree holds: ``applied`` after a
  finished apply, ``reverted`` after a finished revert.

A job whose controller is alive and still working is left to it. All of it runs under the
job's record lock, which :func:`held` keeps for the whole of an apply, a revert or a discard,
so a reader never writes the record under a live operation. Cheap when the journal has
nothing to say: one listing of the journal's folder, and a few ``stat`` calls for each job
it holds.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

import structlog

from controller.changes.journal import Journal, Phase, check_job_id
from controller.changes.recovery import recover_job
from controller.errors import PatchboxError
from controller.jobs.records import ACTIVE, TRANSITIONS, Decision, JobRecord, JobState
from controller.jobs.store import JobStore, is_orphaned

if TYPE_CHECKING:
    from controller.changes.journal import Recorded
    from controller.repo.pin import RepoPin

log = structlog.get_logger(__name__)

_HOLDS: dict[Phase, JobState] = {"applied": "applied", "reverted": "reverted"}
"""What the work tree holds, by the journal's phase, when the record must say so."""
_IN_PROGRESS: frozenset[Phase] = frozenset({"applying", "reverting"})


def record_lock(journal: Journal, job_id: str) -> contextlib.AbstractContextManager[None]:
    """The lock of a job's record: taken before the journal's own locks of the job."""
    return journal.locked(f"record:{check_job_id(job_id)}")


def _steps(state: JobState, holds: JobState) -> list[JobState] | None:
    """The moves that take a record from ``state`` to ``holds`` (through ``applied`` for a
    revert whose apply was not recorded either); None when it cannot get there."""
    if state == holds:
        return []
    wanted: list[JobState] = ["applied", "reverted"] if holds == "reverted" else ["applied"]
    steps = [s for s in wanted if s != state]
    current = state
    for step in steps:
        if step not in TRANSITIONS.get(current, frozenset()):
            return None
        current = step
    return steps


def _disagree(phase: Phase, record: JobRecord) -> bool:
    """Whether the journal has something the record does not say yet (and can)."""
    if phase in _IN_PROGRESS:
        return True
    holds = _HOLDS.get(phase)
    return holds is not None and bool(_steps(record.state, holds))


def settled(
    store: JobStore,
    record: JobRecord,
    journal: Journal | None = None,
    *,
    pin: RepoPin | None = None,
) -> JobRecord:
    """``record``, or its new version once the journal's word on the job is in (see the
    module docstring). Takes the job's record lock only when the journal disagrees with it.
    With ``pin`` (a service job) a rollback reaches the work tree only as the pinned
    folder."""
    journal = journal or Journal()
    if not _disagree(journal.phase(record.job_id), record):
        return record
    with record_lock(journal, record.job_id):
        return _settle_locked(store, record.job_id, journal, pin)


@contextlib.contextmanager
def held(
    store: JobStore,
    job_id: str,
    journal: Journal | None = None,
    *,
    pin: RepoPin | None = None,
) -> Iterator[JobRecord]:
    """The job's record, settled, with its record lock held until the block ends: for an
    apply, a revert or a discard, so no reader settles the record under it."""
    journal = journal or Journal()
    with record_lock(journal, job_id):
        yield _settle_locked(store, job_id, journal, pin)


def _settle_locked(
    store: JobStore, job_id: str, journal: Journal, pin: RepoPin | None = None
) -> JobRecord:
    record = store.load(job_id)  # again, under the lock: what a finished operation saved
    phase = journal.phase(job_id)
    if not _disagree(phase, record):
        return record
    if record.state in ACTIVE and not is_orphaned(record):
        return record  # a live job's engine records its own apply
    recovery = recover_job(job_id, journal=journal, pin=pin)
    if recovery.state == "needs_attention":
        record.diagnostics["needs_attention"] = recovery.model_dump()
        store.save(record)
        log.warning("journal_needs_attention", job_id=job_id, message=recovery.message)
        return record
    if recovery.action != "none":
        record.diagnostics["recovered"] = recovery.model_dump()
    before = record.state
    holds = _HOLDS.get(journal.phase(job_id))
    steps = _steps(record.state, holds) if holds is not None else None
    if steps:
        _move_to(record, steps, journal)
    if recovery.action != "none" or record.state != before:
        store.save(record)
        _evidence(store, record)
        log.info(
            "journal_settled", job_id=job_id, action=recovery.action, state=record.state, was=before
        )
    return record


def _move_to(record: JobRecord, steps: list[JobState], journal: Journal) -> None:
    if "applied" in steps:
        record.decision = _applied_decision(record, journal)
    for step in steps:
        record.move(step)


def _applied_decision(record: JobRecord, journal: Journal) -> Decision:
    """The decision of a job applied before its record said so: ``patchbox apply``'s from
    review or after a revert (with the paths it merged, from the journal), the engine's own
    from ``checking``."""
    decision = record.decision or Decision(
        mode=record.mode,
        reason="applied before its controller recorded the decision (the journal says so)",
    )
    if record.state not in {"awaiting_review", "reverted"}:
        return decision.model_copy(update={"applied": True})
    rec: Recorded | None = None
    with contextlib.suppress(OSError, ValueError, PatchboxError):
        rec = journal.read_record(record.job_id)
    merged = [p.path for p in rec.record.paths if p.merged] if rec is not None else []
    return decision.model_copy(update={"applied_by": "user", "merged": merged})


def _evidence(store: JobStore, record: JobRecord) -> None:
    from controller.jobs.evidence import job_diff, write_evidence

    write_evidence(record, job_diff(store, record.job_id), store)


__all__ = ["held", "record_lock", "settled"]
