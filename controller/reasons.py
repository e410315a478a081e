"""The reasons a refusal carries, as data: why a repository is blocked (:class:`Reason`), why
a change set is invalid (:class:`ChangesetReason`) and why an apply or revert wrote nothing
(:class:`Conflict`). Each has a stable ``code`` from a closed set, the path when it is about
one, and a message; the errors of :mod:`controller.errors` carry them."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict

from patchbox_agent import diffs

ReasonCode = Literal[
    "NOT_A_REPOSITORY",
    "BARE_REPOSITORY",
    "NOT_TOP_LEVEL",
    "HEAD_UNBORN",
    "HEAD_UNRESOLVABLE",
    "MERGE_IN_PROGRESS",
    "REBASE_IN_PROGRESS",
    "AM_IN_PROGRESS",
    "CHERRY_PICK_IN_PROGRESS",
    "REVERT_IN_PROGRESS",
    "BISECT_IN_PROGRESS",
    "UNMERGED_PATHS",
    "INDEX_LOCKED",
    "UNTRACKED_SYMLINK",
    "UNTRACKED_NOT_REGULAR",
    "LOCAL_CHANGES_TOO_MANY_FILES",
    "LOCAL_CHANGES_TOO_LARGE",
    "SPARSE_CHECKOUT",
]
"""Why a repository is blocked. Each one is final: no consent flag overrides it."""


class Reason(BaseModel):
    """One reason a repository is blocked: its code and what was found."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    code: ReasonCode
    detail: str


OWN_REASONS = frozenset(
    {
        "protected_path",
        "config_path",
        "not_allowed",
        "submodule",
        "symlink_path",
        "mode_mismatch",
        "mode_escalation",
        "file_too_large",
        "patch_check",
        "stats_mismatch",
    }
)
REASONS = diffs.REASONS | OWN_REASONS
"""Every reason code a refusal may carry (closed set)."""


def _known(code: str) -> str:
    if code not in REASONS:
        msg = f"unknown reason code {code!r}"
        raise ValueError(msg)
    return code


class ChangesetReason(BaseModel):
    """One reason a change set is refused. ``path`` is a name that passed the parser's
    character checks, or None when the reason is not about one file."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    code: Annotated[str, AfterValidator(_known)]
    path: str | None = None
    message: str


ConflictCode = Literal[
    "operation_in_progress",
    "changed",
    "missing",
    "exists",
    "not_regular",
    "mode_changed",
    "merge_conflict",
    "merge_failed",
    "write_failed",
    "already_applied",
    "not_applied",
    "needs_attention",
]


class Conflict(BaseModel):
    """Why an apply or revert did not write anything."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    code: ConflictCode
    path: str | None = None
    message: str
    detail: str | None = None
    """The merge result with its conflict markers (bounded), for ``merge_conflict``."""
