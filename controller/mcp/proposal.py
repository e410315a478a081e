"""What ``propose`` answers an MCP client: the job's view, the commands that look at it and
apply it on the host, and what the next tool call does."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from controller.api.views import CheckView, FileView
from controller.errorinfo import ErrorInfo
from controller.jobs.records import Decision

if TYPE_CHECKING:
    from controller.api.session import Proposal


class ProposalView(BaseModel):
    """What ``propose`` answers: the job's view (its id, status, diff, files, checks, error
    and decision), the commands that look at it and apply it on the host, and why an auto
    mode stopped for review."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    job_id: str
    status: str
    diff: str
    files: list[FileView]
    checks: list[CheckView]
    error: ErrorInfo | None
    decision: Decision | None
    apply: str | None
    show: str
    review_fallback: str | None = Field(default=None, exclude_if=lambda v: v is None)
    note: str | None = Field(default=None, exclude_if=lambda v: v is None)
    """Set when the idle timeout had proposed the job before ``propose`` was called."""
    next: str = "the next tool call starts a new job on the repository's current state"

    @classmethod
    def of(cls, proposal: Proposal, note: str | None = None) -> ProposalView:
        view, job_id = proposal.view, proposal.job_id
        return cls(
            job_id=view.job_id,
            status=view.status,
            diff=view.diff,
            files=view.files,
            checks=view.checks,
            error=view.error,
            decision=view.decision,
            apply=f"patchbox apply {job_id}" if proposal.status == "awaiting_review" else None,
            show=f"patchbox show {job_id} --diff",
            review_fallback=view.review_fallback,
            note=note,
        )
