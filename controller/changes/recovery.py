"""Recovery: every apply or revert that did not reach its done marker is brought to rest.

Journal rule: an interrupted operation is rolled back to the state it started from (an
interrupted apply leaves the job not applied, an interrupted revert leaves it applied),
provided every touched path holds either its before or its after content; otherwise nothing
is written and the job needs attention. Paths the diff does not touch are never written.

:func:`job_at_rest` is the one way in for an apply or a revert: under the job's lock and its
repository's, it settles an interrupted operation first.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field

from controller.changes.journal import Journal, Recorded, check_job_id, fault_point
from controller.changes.transaction import RacedError, Target, clean_temps, mismatches, move
from controller.changes.worktree import FolderReplacedError, WorkTree
from controller.errors import ConflictError, JournalCorruptError
from controller.reasons import Conflict

if TYPE_CHECKING:
    from controller.repo.pin import RepoPin


class Recovery(BaseModel):
    """The state of one job after :func:`recover`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    job_id: str
    state: Literal["applied", "not_applied", "needs_attention"]
    action: Literal["none", "rolled_back_apply", "rolled_back_revert"] = "none"
    paths: list[str] = Field(default_factory=list)
    """For ``needs_attention``: the paths that hold neither their before nor their after
    content (the journal keeps both)."""
    message: str = ""


@contextlib.contextmanager
def job_at_rest(
    journal: Journal,
    job_id: str,
    error: type[ConflictError],
    repo: str | None = None,
    *,
    pin: RepoPin | None = None,
) -> Iterator[Recorded | None]:
    """Holds the job's lock, then its repository's (``repo``, else the one its journal
    record names), brings an interrupted apply or revert of the job to rest, and yields the
    job's record when it is applied, None when it is not. A job with no record, and no
    ``repo``, takes no repository lock. Raises ``error`` with ``needs_attention`` conflicts
    when the record cannot be read or the job cannot be brought to rest. With ``pin`` (a
    service job) the work tree is reached only as the pinned folder."""
    with journal.locked(f"job:{job_id}"):
        if repo is None:
            if journal.phase(job_id) == "none":
                yield None
                return
            repo = _record(journal, job_id, error).record.repo
        with journal.locked(f"repo:{repo}"):
            yield _settle(journal, job_id, error, pin)


def _record(journal: Journal, job_id: str, error: type[ConflictError]) -> Recorded:
    try:
        return journal.read_record(job_id)
    except JournalCorruptError as exc:
        raise error([Conflict(code="needs_attention", message=exc.message)]) from exc


def _settle(
    journal: Journal, job_id: str, error: type[ConflictError], pin: RepoPin | None
) -> Recorded | None:
    phase = journal.phase(job_id)
    if phase == "none":
        return None
    rec = _record(journal, job_id, error)
    if phase in ("applying", "reverting"):
        outcome = _recover_locked(journal, job_id, rec, pin)
        if outcome.state == "needs_attention":
            paths: list[str | None] = [*outcome.paths] or [None]
            raise error(
                [Conflict(code="needs_attention", path=p, message=outcome.message) for p in paths]
            )
    return rec if journal.phase(job_id) == "applied" else None


def _recover_locked(
    journal: Journal, job_id: str, rec: Recorded, pin: RepoPin | None = None
) -> Recovery:
    phase = journal.phase(job_id)
    if phase == "applied":
        return Recovery(job_id=job_id, state="applied")
    if phase not in ("applying", "reverting"):
        return Recovery(job_id=job_id, state="not_applied")
    target: Target = "before" if phase == "applying" else "after"
    trouble = _roll_back(rec, target, pin)
    if trouble is not None:
        return trouble
    applying = phase == "applying"
    if applying:
        journal.mark(job_id, "apply.undone")
    else:
        journal.unmark(job_id, "revert.begin")
    fault_point("recover.done")
    return Recovery(
        job_id=job_id,
        state="not_applied" if applying else "applied",
        action="rolled_back_apply" if applying else "rolled_back_revert",
        message=f"an interrupted {'apply' if applying else 'revert'} was rolled back",
    )


def _roll_back(rec: Recorded, target: Target, pin: RepoPin | None) -> Recovery | None:
    """Brings every path of an interrupted operation to ``target``; a ``needs_attention``
    report (nothing written) when a path holds neither of its contents."""
    job_id = rec.record.job_id

    def attention(paths: list[str], message: str) -> Recovery:
        return Recovery(job_id=job_id, state="needs_attention", paths=paths, message=message)

    try:
        wt = WorkTree(Path(rec.record.repo), pin=pin, identity=rec.record.top)
    except FolderReplacedError:
        return attention(
            [], "the work tree is not the folder the operation wrote (moved or replaced)"
        )
    except OSError:
        return attention([], "the work tree cannot be opened")
    with wt:
        clean_temps(wt, rec)
        odd = []
        for entry in rec.record.paths:
            state = wt.state(entry.path)
            if not (state.matches(entry.before) or state.matches(entry.after)):
                odd.append(entry.path)
        if odd:
            return attention(odd, "paths hold neither their content before nor after the change")
        try:
            move(wt, rec, target, "recover")
        except RacedError as raced:
            return attention([raced.path], "a path changed during recovery")
        except OSError as exc:
            return attention([], f"a write failed during recovery: {exc.strerror}")
    with WorkTree(Path(rec.record.repo), pin=pin, identity=rec.record.top) as fresh:
        wrong = mismatches(fresh, rec, target)
    return attention(wrong, "differs after recovery") if wrong else None


def recover_job(
    job_id: str, *, journal: Journal | None = None, pin: RepoPin | None = None
) -> Recovery:
    """Settles one job (see the journal rule above) and reports its state; with ``pin``
    the work tree is reached only as the pinned folder."""
    check_job_id(job_id)
    journal = journal or Journal()
    with journal.locked(f"job:{job_id}"):
        if journal.phase(job_id) == "none":
            journal.discard(job_id)
            return Recovery(job_id=job_id, state="not_applied")
        try:
            rec = journal.read_record(job_id)
        except JournalCorruptError as exc:
            return Recovery(job_id=job_id, state="needs_attention", message=exc.message)
        with journal.locked(f"repo:{rec.record.repo}"):
            return _recover_locked(journal, job_id, rec, pin)


def recover(journal: Journal | None = None) -> list[Recovery]:
    """For a restarted controller: settles every job in the journal and reports each one
    as ``applied``, ``not_applied`` or ``needs_attention``."""
    journal = journal or Journal()
    return [recover_job(job_id, journal=journal) for job_id in journal.jobs()]


def job_state(job_id: str, *, journal: Journal | None = None) -> Recovery:
    """The state of one job as the journal has it, without settling anything."""
    journal = journal or Journal()
    phase = journal.phase(check_job_id(job_id))
    if phase == "applied":
        return Recovery(job_id=job_id, state="applied")
    if phase in ("applying", "reverting"):
        return Recovery(job_id=job_id, state="needs_attention", message=f"{phase} interrupted")
    return Recovery(job_id=job_id, state="not_applied")
