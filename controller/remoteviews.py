"""The service's answers as :class:`controller.client.ServiceClient` returns them: the
decoded JSON objects, typed with the fields ``docs/service.md`` gives them. The service is
not trusted: its values are shown or narrowed (``isinstance``) before they are relied on,
and an object is kept whole, so ``remote ... --json`` prints it as the service sent it."""

from __future__ import annotations

from typing import Required, TypedDict


class Health(TypedDict, total=False):
    """``GET /healthz``."""

    status: str


class SubmitBody(TypedDict, total=False):
    """The request of ``POST /v1/jobs``."""

    task: Required[dict[str, object]]
    repo: str
    bundle: str
    calls: dict[str, object]
    include_local_changes: bool


class Accepted(TypedDict):
    """A queued job: ``POST /v1/jobs``."""

    job_id: str
    status: str


class Uploaded(TypedDict):
    """An uploaded git bundle: ``POST /v1/bundles``."""

    bundle_id: str
    head: str
    size: int


class ErrorEntry(TypedDict, total=False):
    code: str
    message: str


class BundleEntry(TypedDict, total=False):
    """The bundle a job ran on (checked again where it is used)."""

    id: str
    head: str


class FileEntry(TypedDict, total=False):
    path: str
    change: str
    added: int
    removed: int


class CheckEntry(TypedDict, total=False):
    id: str
    status: str
    exit_code: int | None
    duration_ms: int
    network: list[dict[str, object]]
    """The requests of a check that declared ``egress``, through the job's proxy."""


class ToolCallEntry(TypedDict, total=False):
    turn: int
    id: str
    name: str
    ok: bool
    error_code: str | None
    verdict: str


class DecisionEntry(TypedDict, total=False):
    reason: str


class JobRow(TypedDict, total=False):
    """A row of ``GET /v1/jobs``."""

    job_id: str
    status: str
    repo: str
    created: float
    bundle: BundleEntry


class RemoteJob(TypedDict, total=False):
    """A job (``GET /v1/jobs/ID``, as ``patchbox run --json`` prints it) or the result of
    an action on it (cancel, apply, revert, discard, rebase)."""

    job_id: str
    status: str
    error: ErrorEntry | None
    bundle: BundleEntry | None
    files: list[FileEntry]
    control_characters: list[dict[str, object]]
    checks: list[CheckEntry]
    tool_calls: list[ToolCallEntry]
    decision: DecisionEntry | None
    already_applied: bool
    """An apply's answer: the job was applied already, nothing was written."""
    parent: object
    """A rebase's answer: the job it carries (its id); a job's view: ``{"job_id", ...}``."""
    stale: dict[str, object]
    """A job's view: set once it was rebased or applied with its follow-up."""
