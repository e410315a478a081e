"""The one exception root of patchbox, with stable error codes and the exit status of each.

::

    PatchboxError                     every error the controller raises on purpose
     +-- NotReadyError                ENVIRONMENT_NOT_READY: no daemon, no image: exit 3
     +-- UsageError                   USAGE_ERROR: bad input from the operator: exit 2
     +-- InvalidTransitionError       USAGE_ERROR: a job cannot move to the state asked for
     +-- NotARepositoryError          NOT_A_REPOSITORY
     |    +-- BareRepositoryError     a bare repository: no work tree to start from
     +-- RepoNotAllowedError          REPO_NOT_ALLOWED: a service job's repository or its git
                                      data is outside its tenant's roots, or is no longer the
                                      folder that was submitted
     +-- RepoBlockedError             REPO_BLOCKED (or another code): ``reasons`` says why
     +-- GitError                     a git command the controller ran failed
     +-- SandboxError                 SANDBOX_FAILED: the container or its channel broke
     |    +-- ProtocolError           a malformed, oversized or late frame from the container
     +-- LimitExceededError           LIMIT_EXCEEDED: memory, wall clock, pids, ...
     +-- ToolError                    a tool call failed; the model may see it and retry
     |    +-- ArgumentsNotAnObjectError   arguments not an object or too large: the job ends
     +-- CheckChangedFilesError       CHECK_FAILED: a check not declared ``mutates`` wrote
     +-- ChangesetInvalidError        CHANGESET_INVALID: ``reasons`` lists why; nothing applied
     +-- ConflictError                a refusal with the ``conflicts`` that caused it
     |    +-- ApplyConflictError      APPLY_CONFLICT: the work tree is not as expected
     |    +-- RevertConflictError     REVERT_CONFLICT: a touched path changed after the apply
     |    +-- RebaseConflictError     REBASE_CONFLICT: a job's diff does not merge onto the
     |                                repository as it is now; nothing written
     +-- JournalCorruptError          a journal record that cannot be read back exactly
     +-- ProviderError                PROVIDER_ERROR: the model endpoint failed or broke the rules
     |    +-- TransientProviderError  worth another attempt (timeout, connect, 429, 5xx)
     |    +-- DuplicateToolCallIdError    two tool calls of one turn share an id
     +-- CancelledError               CANCELLED: cancelled while a model turn was pending
     +-- InternalError                INTERNAL_ERROR: a bug; exit 70 with a crash report
     +-- EnvironmentBuildError        ENVIRONMENT_BUILD_FAILED: a project environment's build
     +-- EnvironmentInputError        ENVIRONMENT_INPUT_INVALID: its inputs select badly
     +-- EgressNotAllowedError        EGRESS_NOT_ALLOWED: a declared egress entry the
     |                                operator (or the tenant's policy) does not allow: exit 2
     +-- EgressUnavailableError       EGRESS_UNAVAILABLE: a declared egress cannot be given
                                      here (no runtime for it, the proxy cannot start): exit 3
     +-- ServiceNotReadyError         SERVICE_NOT_READY: a check's service (a database, a
                                      cache) did not start or become ready
     +-- ServiceError                 an error answer of a patchbox service: its code and status
     |    +-- ServiceUsageError       the request was wrong (token, job id, body): also a
     |                                UsageError, exit 2
     +-- ServiceUnreachableError      SERVICE_UNREACHABLE: no answer from the service: exit 3

The error codes are :class:`ErrorCode`; the process exit statuses are :class:`ExitCode`.
An error as data (``{"code", "message", "hint"}``) is an :class:`controller.errorinfo.ErrorInfo`
(:meth:`PatchboxError.info`); errors that cross the container boundary are data, never
exception classes. Third-party errors become ours in :mod:`controller.errormap`.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import IntEnum, StrEnum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # data models (pydantic): imported where an error is made into data
    from controller.errorinfo import ErrorInfo, Hint
    from controller.reasons import ChangesetReason, Conflict, Reason


class ExitCode(IntEnum):
    """The exit statuses of the ``patchbox`` command (signals add 128 + the number)."""

    OK = 0
    FAILED = 1
    """A job or a check failed, or a repository is not healthy."""
    USAGE = 2
    NOT_READY = 3
    PROVIDER = 4
    """The model provider failed (outage, authentication, a model that does not use tools)."""
    NO_CHANGE = 5
    """The job ended ``no_change``: the model made no change (0 with ``no_change_ok``)."""
    INTERNAL = 70


_EXIT_BY_CODE: dict[str, ExitCode] = {}


def exit_code_for_error(code: str) -> ExitCode:
    """The exit status of a command that ended with the error ``code``."""
    return _EXIT_BY_CODE.get(code, ExitCode.FAILED)


class ErrorCode(StrEnum):
    NOT_A_REPOSITORY = "NOT_A_REPOSITORY"
    REPO_BLOCKED = "REPO_BLOCKED"
    CONSENT_REQUIRED = "CONSENT_REQUIRED"
    JOB_ALREADY_RUNNING = "JOB_ALREADY_RUNNING"
    TOOL_ARGUMENTS_INVALID = "TOOL_ARGUMENTS_INVALID"
    TOOL_PATH_DENIED = "TOOL_PATH_DENIED"
    TOOL_PATH_INVALID = "TOOL_PATH_INVALID"
    TOOL_FILE_NOT_FOUND = "TOOL_FILE_NOT_FOUND"
    TOOL_CHECK_RUNNING = "TOOL_CHECK_RUNNING"
    TOOL_HANDLE_UNKNOWN = "TOOL_HANDLE_UNKNOWN"
    PATCH_REJECTED = "PATCH_REJECTED"
    CHANGESET_INVALID = "CHANGESET_INVALID"
    NO_CHANGE = "NO_CHANGE"
    CHECK_FAILED = "CHECK_FAILED"
    CHECK_CANNOT_RUN = "CHECK_CANNOT_RUN"
    LIMIT_EXCEEDED = "LIMIT_EXCEEDED"
    SANDBOX_FAILED = "SANDBOX_FAILED"
    MODEL_TOOL_CALL_UNSUPPORTED = "MODEL_TOOL_CALL_UNSUPPORTED"
    PROVIDER_ERROR = "PROVIDER_ERROR"
    APPLY_CONFLICT = "APPLY_CONFLICT"
    REVERT_CONFLICT = "REVERT_CONFLICT"
    REBASE_CONFLICT = "REBASE_CONFLICT"
    JOB_REBASED = "JOB_REBASED"
    JOB_SUPERSEDED = "JOB_SUPERSEDED"
    CANCELLED = "CANCELLED"
    INTERRUPTED = "INTERRUPTED"
    INTERNAL_ERROR = "INTERNAL_ERROR"
    ENVIRONMENT_NOT_READY = "ENVIRONMENT_NOT_READY"
    ENVIRONMENT_BUILD_FAILED = "ENVIRONMENT_BUILD_FAILED"
    ENVIRONMENT_INPUT_INVALID = "ENVIRONMENT_INPUT_INVALID"
    EGRESS_NOT_ALLOWED = "EGRESS_NOT_ALLOWED"
    EGRESS_UNAVAILABLE = "EGRESS_UNAVAILABLE"
    SERVICE_NOT_READY = "SERVICE_NOT_READY"
    USAGE_ERROR = "USAGE_ERROR"
    # The service's own codes (docs/service.md), as its clients raise them.
    UNAUTHORIZED = "UNAUTHORIZED"
    NOT_FOUND = "NOT_FOUND"
    BAD_REQUEST = "BAD_REQUEST"
    METHOD_NOT_ALLOWED = "METHOD_NOT_ALLOWED"
    REPO_NOT_ALLOWED = "REPO_NOT_ALLOWED"
    APPLY_NOT_ALLOWED = "APPLY_NOT_ALLOWED"
    QUOTA_EXCEEDED = "QUOTA_EXCEEDED"
    TASK_NOT_ALLOWED = "TASK_NOT_ALLOWED"
    JOB_NOT_FINISHED = "JOB_NOT_FINISHED"
    BUNDLE_INVALID = "BUNDLE_INVALID"
    BUNDLE_TOO_LARGE = "BUNDLE_TOO_LARGE"
    BUNDLE_TREE_TOO_LARGE = "BUNDLE_TREE_TOO_LARGE"
    NO_WORK_TREE = "NO_WORK_TREE"
    SERVICE_UNREACHABLE = "SERVICE_UNREACHABLE"
    SERVICE_BAD_RESPONSE = "SERVICE_BAD_RESPONSE"
    # Signed provenance (docs/reference.md, "Provenance").
    SIGNING_KEY_MISSING = "SIGNING_KEY_MISSING"
    SIGNING_KEY_INVALID = "SIGNING_KEY_INVALID"
    SIGNING_KEY_EXISTS = "SIGNING_KEY_EXISTS"
    VERIFY_INPUT_INVALID = "VERIFY_INPUT_INVALID"
    VERIFY_FAILED = "VERIFY_FAILED"


_EXIT_BY_CODE.update(
    {
        ErrorCode.USAGE_ERROR: ExitCode.USAGE,
        ErrorCode.NOT_A_REPOSITORY: ExitCode.USAGE,
        ErrorCode.ENVIRONMENT_NOT_READY: ExitCode.NOT_READY,
        ErrorCode.EGRESS_NOT_ALLOWED: ExitCode.USAGE,
        ErrorCode.EGRESS_UNAVAILABLE: ExitCode.NOT_READY,
        ErrorCode.PROVIDER_ERROR: ExitCode.PROVIDER,
        ErrorCode.MODEL_TOOL_CALL_UNSUPPORTED: ExitCode.PROVIDER,
        ErrorCode.INTERNAL_ERROR: ExitCode.INTERNAL,
        ErrorCode.NO_CHANGE: ExitCode.NO_CHANGE,
        ErrorCode.SIGNING_KEY_MISSING: ExitCode.USAGE,
        ErrorCode.SIGNING_KEY_INVALID: ExitCode.USAGE,
        ErrorCode.SIGNING_KEY_EXISTS: ExitCode.USAGE,
        ErrorCode.VERIFY_INPUT_INVALID: ExitCode.USAGE,
    }
)


class PatchboxError(Exception):
    """Root of every deliberate error; carries a stable code, a message without secrets and
    a remedy (:class:`Hint`) when there is one."""

    code: ErrorCode = ErrorCode.SANDBOX_FAILED
    hint: Hint | None = None

    def __init__(
        self, message: str, *, code: ErrorCode | None = None, hint: Hint | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        if hint is not None:
            self.hint = hint

    def info(self) -> ErrorInfo:
        from controller.errorinfo import ErrorInfo

        return ErrorInfo(code=str(self.code), message=self.message, hint=self.hint)

    def to_dict(self) -> dict[str, Any]:
        return self.info().model_dump(mode="json")


class NotReadyError(PatchboxError):
    code = ErrorCode.ENVIRONMENT_NOT_READY


class UsageError(PatchboxError):
    code = ErrorCode.USAGE_ERROR


class EgressNotAllowedError(PatchboxError):
    """A declared ``egress`` entry the host configuration's ``network.allow`` (or, in the
    service, the tenant's ``egress_allow``) does not allow: refused before anything starts."""

    code = ErrorCode.EGRESS_NOT_ALLOWED


class EgressUnavailableError(PatchboxError):
    """A declared egress that cannot be given here: the runtime for a gVisor sandbox with a
    network is not registered, or the job's proxy could not start."""

    code = ErrorCode.EGRESS_UNAVAILABLE


class ServiceNotReadyError(PatchboxError):
    """A check's service did not become ready: its image could not be had, it exited, or
    its ``ready`` command did not succeed in time; the message ends with its log's tail."""

    code = ErrorCode.SERVICE_NOT_READY


class SandboxError(PatchboxError):
    code = ErrorCode.SANDBOX_FAILED


class ProtocolError(SandboxError):
    """The container sent something outside the protocol; the sandbox is not used again."""


class LimitExceededError(PatchboxError):
    code = ErrorCode.LIMIT_EXCEEDED


class ToolError(PatchboxError):
    """A tool call failed in a way the model may see and retry (path denied, bad args)."""


class InvalidTransitionError(PatchboxError):
    """A job cannot move from its state to the one asked for (e.g. revert of a discarded
    job); the record is unchanged. Its code is ``USAGE_ERROR``, its exit status 1."""

    code = ErrorCode.USAGE_ERROR


class NotARepositoryError(PatchboxError):
    code = ErrorCode.NOT_A_REPOSITORY


class BareRepositoryError(NotARepositoryError):
    """A bare repository: it has no work tree to start from."""


class RepoNotAllowedError(PatchboxError):
    """A service job's repository is not one its tenant may use: outside the tenant's
    ``repo_roots`` (or inside the service's own folder), reached through a symbolic link
    below a root, keeping git data elsewhere, or no longer the folder that was submitted."""

    code = ErrorCode.REPO_NOT_ALLOWED


class RepoBlockedError(PatchboxError):
    """The repository is in a state no job may start from; ``reasons`` says which."""

    code = ErrorCode.REPO_BLOCKED

    def __init__(
        self, message: str, reasons: list[Reason], *, code: ErrorCode | None = None
    ) -> None:
        super().__init__(message, code=code)
        self.reasons = reasons


class GitError(PatchboxError):
    """A git command the controller ran failed (its stderr is kept short)."""


class ArgumentsNotAnObjectError(ToolError):
    """The arguments are not a JSON object or are too large: the job ends."""


class CheckChangedFilesError(PatchboxError):
    """A check not declared ``mutates`` changed files: the job fails."""

    code = ErrorCode.CHECK_FAILED


class ProviderError(PatchboxError):
    """The provider failed (transport, HTTP status, malformed answer, deadline).

    The message never contains the API key or a response body verbatim.
    """

    code = ErrorCode.PROVIDER_ERROR


class TransientProviderError(ProviderError):
    """A failure worth another attempt, with the server's ``Retry-After`` if it gave one."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class DuplicateToolCallIdError(ProviderError):
    """One turn holds two tool calls with the same id."""


class ChangesetInvalidError(PatchboxError):
    """The diff of a job is refused (``CHANGESET_INVALID``); ``reasons`` lists why. Nothing
    was applied."""

    code = ErrorCode.CHANGESET_INVALID

    def __init__(self, reasons: Sequence[ChangesetReason]) -> None:
        listed = ", ".join(f"{r.code}" + (f" ({r.path})" if r.path else "") for r in reasons)
        super().__init__(f"the change set is invalid: {listed[:1000]}")
        self.reasons = list(reasons)


class ConflictError(PatchboxError):
    """A refusal with the conflicts that caused it; ``verb`` opens its message."""

    verb = ""

    def __init__(
        self, conflicts: Sequence[Conflict], message: str | None = None, *, hint: Hint | None = None
    ) -> None:
        listed = ", ".join(c.code + (f" ({c.path})" if c.path else "") for c in conflicts)
        super().__init__(message or f"{self.verb}: {listed[:1000]}", hint=hint)
        self.conflicts = list(conflicts)


class ApplyConflictError(ConflictError):
    """``APPLY_CONFLICT``: the work tree is not as the change set expects; nothing written."""

    code = ErrorCode.APPLY_CONFLICT
    verb = "cannot apply"


class RebaseConflictError(ConflictError):
    """``REBASE_CONFLICT``: a job's diff does not merge three-way onto the repository as it
    is now; its ``conflicts`` name each file (and the lines of each overlapping change).
    Nothing was written."""

    code = ErrorCode.REBASE_CONFLICT
    verb = "cannot rebase"


class RevertConflictError(ConflictError):
    """``REVERT_CONFLICT``: a touched path changed after the apply; nothing written."""

    code = ErrorCode.REVERT_CONFLICT
    verb = "cannot revert"


class JournalCorruptError(PatchboxError):
    """A journal record that cannot be read back exactly."""


class CancelledError(PatchboxError):
    """The provider was cancelled; raised by ``next_turn`` during or after ``cancel``."""

    code = ErrorCode.CANCELLED


class InternalError(PatchboxError):
    """An unexpected exception (a bug, or a third-party error nobody translated), turned into
    the normal error contract; ``report`` names the crash report under ``$PATCHBOX_HOME``."""

    code = ErrorCode.INTERNAL_ERROR

    def __init__(self, message: str, *, report: str | None = None) -> None:
        super().__init__(message)
        self.report = report


class EnvironmentBuildError(PatchboxError):
    """A project environment's image could not be made: its base, python3 for the agent, a
    setup step (the message names it, its exit code and the log's tail), or its time."""

    code = ErrorCode.ENVIRONMENT_BUILD_FAILED


class EnvironmentInputError(PatchboxError):
    """An environment's inputs select nothing, a link or submodule, or too much."""

    code = ErrorCode.ENVIRONMENT_INPUT_INVALID


class ServiceError(PatchboxError):
    """An error answer of a patchbox service (``{"error": {"code", "message"}}``): ``code``
    is the service's code (:data:`SERVICE_BAD_RESPONSE <ErrorCode.SERVICE_BAD_RESPONSE>` for
    one this client does not know, whose text is then ``service_code``), ``status`` the HTTP
    status. Its exit status is its code's: ``USAGE_ERROR`` 2, ``ENVIRONMENT_NOT_READY`` 3,
    ``INTERNAL_ERROR`` 70, otherwise 1."""

    code = ErrorCode.SERVICE_BAD_RESPONSE

    def __init__(
        self,
        message: str,
        *,
        code: ErrorCode | None = None,
        status: int = 0,
        service_code: str = "",
        hint: Hint | None = None,
    ) -> None:
        super().__init__(message, code=code, hint=hint)
        self.status = status
        self.service_code = service_code or str(self.code)


class ServiceUsageError(ServiceError, UsageError):
    """The service refused the request itself: a missing or bad token (``UNAUTHORIZED``), a
    job or bundle that is not the tenant's (``NOT_FOUND``), a malformed request
    (``BAD_REQUEST``, ``METHOD_NOT_ALLOWED``), a repository outside the tenant's roots
    (``REPO_NOT_ALLOWED``), an invalid task (``USAGE_ERROR``) or one over the tenant's
    policy (``TASK_NOT_ALLOWED``): exit 2."""


class ServiceUnreachableError(NotReadyError):
    """``SERVICE_UNREACHABLE``: the service did not answer (refused connection, unknown host,
    timeout, a connection cut for good); exit 3, as a missing Docker daemon."""

    code = ErrorCode.SERVICE_UNREACHABLE
