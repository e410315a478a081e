"""What the engine answers, typed: the view of a job (the object ``run --json`` prints), the
results of apply, revert and discard, a job list's rows. Every front door renders these and
adds nothing of the engine's; messages and check output in them are scrubbed of secrets and
host paths as the evidence is, the diff is shown as it is."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import PurePosixPath
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from controller.changes.apply import AppliedFile, ApplyResult, RevertResult
from controller.errorinfo import ErrorInfo
from controller.errors import PatchboxError
from controller.jobs.evidence import job_diff as job_diff  # noqa: PLC0414 - the api re-exports it
from controller.jobs.records import (
    ACTIVE,
    BaselineCheck,
    CheckResult,
    ControlLine,
    Decision,
    FileChange,
    JobRecord,
    NetworkRequest,
    ParentLink,
    StaleMark,
    ToolCallRecord,
)
from controller.jobs.store import ATTESTATIONS
from controller.logs import Scrubber


class _View(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class FileView(_View):
    """One file of the job's diff."""

    path: str
    change: str
    """``create``, ``modify``, ``delete`` or ``rename``."""
    added: int
    removed: int

    @classmethod
    def of(cls, change: FileChange) -> FileView:
        return cls(path=change.path, change=change.kind, added=change.added, removed=change.removed)


class CheckView(_View):
    """One required check as run in the fresh check sandbox (or skipped)."""

    id: str
    status: str
    exit_code: int | None
    duration_ms: int
    output_tail: str
    network: list[NetworkRequest] | None = Field(default=None, exclude_if=lambda v: v is None)
    """Every request it made through the job's proxy (a check with an ``egress``)."""

    @classmethod
    def of(cls, check: CheckResult | BaselineCheck) -> CheckView:
        return cls.model_validate(check.model_dump(include=set(cls.model_fields)))


class ServiceView(_View):
    """One service container of the job (an environment's database, cache)."""

    name: str
    image: str
    image_id: str
    sandbox: str
    """``loop`` (the model's sandbox) or ``checks`` (the required run's fresh one)."""
    ready_seconds: float | None
    """None: it never became ready."""
    exit: str
    """``running`` (removed while it ran), ``exited N``, ``oom`` or ``not ready``."""
    log_tail: str = Field(default="", exclude_if=lambda v: not v)
    """Its log's last lines, when it failed or exited."""


class BundleRef(_View):
    """The uploaded git bundle a service job ran on."""

    id: str
    head: str


class JobView(_View):
    """A job as ``run --json`` prints it."""

    job_id: str
    status: str
    error: ErrorInfo | None
    files: list[FileView]
    control_characters: list[ControlLine]
    baseline_checks: list[CheckView] = Field(default_factory=list, exclude_if=lambda v: not v)
    """The required checks as run on the baseline before the model's first turn (status
    ``passed``, ``failed``, ``timed_out`` or ``cannot_run``); absent when none ran. The
    before/after table is the decision's ``check_changes``."""
    checks: list[CheckView]
    services: list[ServiceView] = Field(default_factory=list, exclude_if=lambda v: not v)
    """Each service container the job's checks used; absent without services."""
    tool_calls: list[ToolCallRecord]
    evidence: str
    """The evidence bundle's path relative to the state directory (empty before it exists)."""
    attestations: str | None = Field(default=None, exclude_if=lambda v: v is None)
    """The signed attestations' path beside it, once the decided job was signed."""
    decision: Decision | None
    diff: str
    review_fallback: str | None = Field(default=None, exclude_if=lambda v: v is None)
    """Why a job in an auto mode stopped for review instead of applying."""
    bundle: BundleRef | None = Field(default=None, exclude_if=lambda v: v is None)
    parent: ParentLink | None = Field(default=None, exclude_if=lambda v: v is None)
    """The job this one was rebased from (``job_id``, ``diff_sha256``, ``relation``)."""
    stale: StaleMark | None = Field(default=None, exclude_if=lambda v: v is None)
    """Set once this job was rebased (``by``: the new job): its decision and checks are
    stale and it is not applied."""

    @classmethod
    def before_record(
        cls, job_id: str, status: str, error: ErrorInfo | None, bundle: BundleRef | None = None
    ) -> JobView:
        """The view of a job that has no record yet (queued, or it could not start): its
        state and the error it could not start with; nothing else."""
        return cls(
            job_id=job_id,
            status=status,
            error=error,
            files=[],
            control_characters=[],
            checks=[],
            tool_calls=[],
            evidence="",
            decision=None,
            diff="",
            bundle=bundle,
        )

    def data(self) -> dict[str, Any]:
        """The JSON object (``decision`` is null before the job is decided)."""
        return self.model_dump(mode="json")


def review_fallback(record: JobRecord) -> str | None:
    """Why a job in an auto mode stopped for review instead of applying (None otherwise)."""
    if record.mode == "review" or record.state != "awaiting_review":
        return None
    decision = record.decision
    return decision.reason if decision is not None else "not decided"


def job_view(
    record: JobRecord, diff: str | None, evidence: str, secrets: tuple[str, ...] = ()
) -> JobView:
    """The view of ``record``: its messages and check output scrubbed of ``secrets`` and
    host paths, ``diff`` as it is (empty when None)."""
    raw = {
        "job_id": record.job_id,
        "status": record.state,
        "error": record.error,
        "files": [FileView.of(f).model_dump(mode="json") for f in record.files],
        "control_characters": [c.model_dump(mode="json") for c in record.control_characters],
        "baseline_checks": [
            CheckView.of(c).model_dump(mode="json") for c in record.baseline_checks
        ],
        "checks": [CheckView.of(c).model_dump(mode="json") for c in record.checks],
        "services": [s.model_dump(mode="json") for s in record.services],
        "tool_calls": [c.model_dump(mode="json") for c in record.tool_calls],
        "evidence": evidence,
        "attestations": str(PurePosixPath(evidence).with_name(ATTESTATIONS))
        if evidence and record.provenance is not None and record.provenance.key_id
        else None,
        "decision": record.decision.model_dump(mode="json") if record.decision else None,
        "review_fallback": review_fallback(record),
        "parent": record.parent.model_dump(mode="json") if record.parent else None,
        "stale": record.stale.model_dump(mode="json") if record.stale else None,
    }
    scrubbed = Scrubber(record.repo, secrets, paths=False).value(raw)
    return JobView.model_validate({**scrubbed, "diff": diff or ""})


def error_view(exc: PatchboxError, clean: Callable[[str], str]) -> ErrorInfo:
    """An error as a front door answers it: its code, its message as ``clean`` leaves it
    (a :class:`Scrubber`'s ``text``: no secret, no path the caller may not see), its
    remedy."""
    return ErrorInfo(code=str(exc.code), message=clean(exc.message), hint=exc.hint)


class ApplyView(_View):
    """What ``apply`` did: every path written (none for a job applied already)."""

    job_id: str
    status: str
    files: list[AppliedFile]
    merged: list[str]
    """Paths merged three-way with the user's own change (``merge`` only)."""
    already_applied: bool = False
    """The job was applied already: nothing was written."""
    discarded: list[str] = Field(default_factory=list, exclude_if=lambda v: not v)
    """The other attempts of the same task, discarded by this apply (``run --attempts``)."""

    @classmethod
    def of(cls, record: JobRecord, result: ApplyResult | None) -> ApplyView:
        """``result`` None: the job was applied already (:func:`controller.api.apply_job`)."""
        if result is None:
            return cls(
                job_id=record.job_id,
                status=record.state,
                files=[],
                merged=[],
                already_applied=True,
            )
        return cls(
            job_id=record.job_id,
            status=record.state,
            files=result.files,
            merged=result.merged,
            discarded=result.discarded,
        )


class RevertView(_View):
    """What ``revert`` did: every path restored."""

    job_id: str
    status: str
    files: list[AppliedFile]

    @classmethod
    def of(cls, record: JobRecord, result: RevertResult) -> RevertView:
        return cls(job_id=record.job_id, status=record.state, files=result.files)


class DiscardView(_View):
    job_id: str
    status: str

    @classmethod
    def of(cls, record: JobRecord) -> DiscardView:
        return cls(job_id=record.job_id, status=record.state)


class JobRow(_View):
    """One job of a list."""

    job_id: str
    status: str
    repo: str
    created_at: float
    duration_seconds: float | None
    """From its creation to its last change; None while it runs."""
    error: ErrorInfo | None


def job_row(record: JobRecord) -> JobRow:
    duration = None
    if record.state not in ACTIVE:
        duration = round(max(0.0, record.updated_at - record.created_at), 1)
    error = Scrubber(record.repo, paths=False).value(record.error) if record.error else None
    return JobRow(
        job_id=record.job_id,
        status=record.state,
        repo=record.repo,
        created_at=record.created_at,
        duration_seconds=duration,
        error=error,
    )
