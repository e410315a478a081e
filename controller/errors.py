"""The one exception root of patchbox, with stable error codes.

::

    PatchboxError                 every error the controller raises on purpose
     +-- NotReadyError            the environment is not ready (no daemon, no image): exit 3
     +-- UsageError               bad input from the operator: exit 2
     +-- SandboxError             SANDBOX_FAILED: the container or its channel broke
     |    +-- ProtocolError       a malformed, oversized or late frame from the container
     +-- LimitExceededError       LIMIT_EXCEEDED: memory, wall clock, pids, ...
     +-- InternalError            INTERNAL_ERROR: a bug; exit 70 with a crash report

Third-party errors (docker, httpx, git) are translated at the edge with
``raise Ours(...) from exc``. Errors that cross the container boundary are data
(``{"code", "message"}``), never exception classes.
"""

from __future__ import annotations

from enum import StrEnum


class ErrorCode(StrEnum):
    NOT_A_REPOSITORY = "NOT_A_REPOSITORY"
    REPO_BLOCKED = "REPO_BLOCKED"
    CONSENT_REQUIRED = "CONSENT_REQUIRED"
    JOB_ALREADY_RUNNING = "JOB_ALREADY_RUNNING"
    TOOL_ARGUMENTS_INVALID = "TOOL_ARGUMENTS_INVALID"
    TOOL_PATH_DENIED = "TOOL_PATH_DENIED"
    PATCH_REJECTED = "PATCH_REJECTED"
    CHANGESET_INVALID = "CHANGESET_INVALID"
    CHECK_FAILED = "CHECK_FAILED"
    LIMIT_EXCEEDED = "LIMIT_EXCEEDED"
    SANDBOX_FAILED = "SANDBOX_FAILED"
    MODEL_TOOL_CALL_UNSUPPORTED = "MODEL_TOOL_CALL_UNSUPPORTED"
    PROVIDER_ERROR = "PROVIDER_ERROR"
    APPLY_CONFLICT = "APPLY_CONFLICT"
    REVERT_CONFLICT = "REVERT_CONFLICT"
    CANCELLED = "CANCELLED"
    INTERRUPTED = "INTERRUPTED"
    INTERNAL_ERROR = "INTERNAL_ERROR"
    ENVIRONMENT_NOT_READY = "ENVIRONMENT_NOT_READY"
    USAGE_ERROR = "USAGE_ERROR"


class PatchboxError(Exception):
    """Root of every deliberate error; carries a stable code and a message without secrets."""

    code: ErrorCode = ErrorCode.SANDBOX_FAILED

    def __init__(self, message: str, *, code: ErrorCode | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code

    def to_dict(self) -> dict[str, str]:
        return {"code": str(self.code), "message": self.message}


class NotReadyError(PatchboxError):
    code = ErrorCode.ENVIRONMENT_NOT_READY


class UsageError(PatchboxError):
    code = ErrorCode.USAGE_ERROR


class SandboxError(PatchboxError):
    code = ErrorCode.SANDBOX_FAILED


class ProtocolError(SandboxError):
    """The container sent something outside the protocol; the sandbox is not used again."""


class LimitExceededError(PatchboxError):
    code = ErrorCode.LIMIT_EXCEEDED


class ToolError(PatchboxError):
    """A tool call failed in a way the model may see and retry (path denied, bad args)."""


class InternalError(PatchboxError):
    """An unexpected exception (a bug, or a third-party error nobody translated), turned into
    the normal error contract; ``report`` names the crash report under ``$PATCHBOX_HOME``."""

    code = ErrorCode.INTERNAL_ERROR

    def __init__(self, message: str, *, report: str | None = None) -> None:
        super().__init__(message)
        self.report = report
