"""One MCP session's job (:class:`Slot`) and the slots of a server (:class:`Sessions`).

A session's job is opened at its first tool call (a failed opening is tried again at the
next one) and ended by ``propose``, by the idle timeout (:data:`IDLE_TIMEOUT_SECONDS`) or by
a call that ends it; the next tool call then opens a new job on the repository's current
state, whose first answer says so (:data:`JOB_STARTED`). The job open when the MCP session
ends or the server stops is closed (cancelled, its containers removed). Every call goes
through :meth:`controller.api.Session.call`; a tool error is an :class:`Outcome` with
``error`` set, its structured content ``{"error": {"code", "message"}}``
(:func:`error_outcome`, the one place an error becomes the MCP answer).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, TypedDict

import mcp_types as types
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from controller import api
from controller.api.views import error_view
from controller.errorinfo import ErrorInfo
from controller.errormap import describe_validation
from controller.errors import ErrorCode, PatchboxError, UsageError
from controller.jobs.loop import FINAL_MESSAGE_CHARS
from controller.logs import Scrubber, write_line
from controller.mcp.hints import hint_data
from controller.mcp.proposal import ProposalView

if TYPE_CHECKING:
    from pathlib import Path

    import docker

    from controller.config.host import HostConfig
    from controller.config.task import TaskSpec
    from controller.sandbox.base import Runtime
    from controller.tools.watch import CheckLine

Progress = Callable[[str], None]

CHECKS_URI = "patchbox://task/checks"
"""The resource that lists the checks (named in the server's instructions)."""
PROPOSE = "propose"
IDLE_TIMEOUT_SECONDS = 300.0
"""A job with no call for this long ends by itself (``--idle-timeout``): proposed as it is
when it changed something, cancelled otherwise; its sandbox and the repository's lock are
released, and the next call opens a new job."""
NOTHING_TO_PROPOSE = "nothing to propose: no tool call has been made in this job"
NEXT_CALL = "; the next tool call starts a new job on the repository's current state"
JOB_STARTED = "job_started"
"""The key of the notice a new job's first answer carries: its id, and what became of the
job before it."""


class JobStarted(TypedDict):
    """The ``job_started`` notice: the new job's id, and a sentence that says it started
    and what became of the job before it."""

    job_id: str
    message: str


@dataclass(frozen=True)
class Options:
    """What ``patchbox mcp`` was started with: one repository, its task, the trust choices."""

    repo: Path
    task: TaskSpec
    config: HostConfig
    task_given: bool = False
    """A task file was given (its prompt is in the server's instructions)."""
    include_local_changes: bool = False
    trust_repo_config: bool = False
    runtime: Runtime | None = None
    version: str = ""
    idle_seconds: float = IDLE_TIMEOUT_SECONDS
    """A job with no call for this long ends by itself (see :data:`IDLE_TIMEOUT_SECONDS`)."""


class ProposeArgs(BaseModel):
    """End the session's tool calls and propose the change: the diff is collected and
    validated, the required checks run in a fresh sandbox, and the job is decided. Returns the
    job id, its status, the diff, the files, the checks and the command that applies it. A
    tool call after it starts a new job."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        strict=True,
        use_attribute_docstrings=True,
        validate_by_alias=True,
        validate_by_name=False,
        serialize_by_alias=True,
    )

    message: Annotated[str, StringConstraints(max_length=FINAL_MESSAGE_CHARS)] = ""
    """What the change does, in a sentence or two (kept in the job's record)."""
    follow_up: bool = Field(default=False, alias="followUp")
    """True: the next tool call starts a job that follows up this one, on its result (the
    files as this change left them), not on the repository; applying that job applies the
    two while this one is not applied."""


@dataclass(frozen=True)
class Outcome:
    """One tool call's answer: structured content, and whether it is a tool error."""

    data: dict[str, Any]
    error: bool = False

    def result(self) -> types.CallToolResult:
        text = json.dumps(self.data, ensure_ascii=False)
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=text)],
            structured_content=self.data,
            is_error=self.error,
        )


class JobRef(BaseModel):
    """The job a failed call ended: its id, its state, and what the next call does."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    job_id: str
    status: str
    next: str


def failure(code: str, message: str) -> Outcome:
    """A refused call: ``code`` (an :class:`ErrorCode`) and ``message``."""
    return error_outcome(ErrorInfo(code=code, message=message))


def error_outcome(info: ErrorInfo, job: JobRef | None = None) -> Outcome:
    """The tool error of ``info`` (and, when the call ended it, the job's id and state): the
    one place an error becomes the MCP answer; its remedy in MCP's words when it has one."""
    error: dict[str, object] = {"code": info.code, "message": info.message}
    if (hint := hint_data(info.hint)) is not None:
        error["hint"] = hint
    if job is None:
        return Outcome({"error": error}, error=True)
    return Outcome({"error": error, "job": job.model_dump()}, error=True)


class Slot:
    """One MCP session's jobs, one at a time. A job is opened at a tool call when the
    session has none that takes calls (a failed opening is tried again at the next call):
    at its first call, and after the job ended (``propose``, the idle timeout, a call that
    ended it), on the repository's state at that moment; the ended job stays for review.
    Closed once, with the MCP session. Thread-safe: the handlers call it from worker
    threads."""

    def __init__(self, options: Options, progress: Progress) -> None:
        self.options = options
        self._progress = progress
        self._scrub = Scrubber(str(options.repo.resolve()), paths=False)
        self._lock = threading.Lock()
        """Held while a job opens, and for every change of state."""
        self._session: api.Session | None = None
        self._client: docker.DockerClient | None = None
        self._closed: str | None = None
        """Why the session takes no more calls (None while it does)."""
        self._proposing = False
        self._proposed: str | None = None
        """The job id of the current job once ``propose`` answered for it."""
        self._previous: str | None = None
        """What became of the job before the current one (for the next job's notice)."""
        self._follow: str | None = None
        """The job the next one follows up (``propose`` with ``followUp``)."""
        self._answers: dict[str, Outcome] = {}
        """``propose``'s answer by request id (the sessions keep the other tools')."""
        self._answered: dict[str, api.Session] = {}
        """The request ids the current and the previous job answered, with their job."""
        self._notices: dict[str, JobStarted] = {}
        """The ``job_started`` notice a request's answer carried, by request id."""
        self.opened = False
        self.failure: PatchboxError | None = None
        """The last opening that failed, until one succeeds."""

    @property
    def job_id(self) -> str | None:
        session = self._session
        return None if session is None else session.job_id

    # -- calls ----------------------------------------------------------------------------

    def call(
        self,
        tool: str,
        arguments: Mapping[str, object],
        request_id: str | None,
        on_output: Callable[[CheckLine], object] | None = None,
    ) -> Outcome:
        """One tool call (``propose`` included), as a model's; never raises a
        :class:`PatchboxError`. A request id seen before gets the first answer again.
        ``on_output``: told each line of a running check's output as it comes."""
        if tool == PROPOSE:
            try:
                args = ProposeArgs.model_validate(arguments)
            except ValidationError as exc:
                detail = describe_validation(exc, subject="arguments")
                return failure(str(ErrorCode.TOOL_ARGUMENTS_INVALID), f"{PROPOSE}: {detail}")
            return self.propose(args, request_id)
        holder: list[api.Session] = []
        try:
            result, notice = self._run(tool, arguments, request_id, holder, on_output)
        except UsageError as exc:
            closed = self._closed
            session = holder[-1] if holder else None
            return self._error(exc if closed is None else UsageError(closed), session)
        except PatchboxError as exc:
            return self._error(exc, holder[-1] if holder else None)
        if result.ok:
            outcome = Outcome(dict(result.result or {}))
        else:
            outcome = Outcome({"error": dict(result.error or {})}, error=True)
        if notice is None and request_id is not None:
            notice = self._notices.get(request_id)
        if notice is not None:
            outcome = Outcome({**outcome.data, JOB_STARTED: notice}, error=outcome.error)
        return outcome

    def _run(
        self,
        tool: str,
        arguments: Mapping[str, object],
        request_id: str | None,
        holder: list[api.Session],
        on_output: Callable[[CheckLine], object] | None = None,
    ) -> tuple[api.CallResult, JobStarted | None]:
        """The call in the job that takes it (appended to ``holder``), and the notice of a
        job opened for it."""
        session, notice = self._open(request_id)
        holder.append(session)
        try:
            result = session.call(tool, arguments, request_id=request_id, on_output=on_output)
        except UsageError:
            if session.idle_end is None:
                raise
            # the job ended idle between the opening and the call: a new job takes it
            session, notice = self._open(request_id)
            holder.append(session)
            result = session.call(tool, arguments, request_id=request_id, on_output=on_output)
        if request_id is not None:
            with self._lock:
                self._answered.setdefault(request_id, session)
                if notice is not None:
                    self._notices.setdefault(request_id, notice)
        return result, notice

    def propose(self, args: ProposeArgs, request_id: str | None = None) -> Outcome:
        """Ends the current job's calls (:meth:`controller.api.Session.propose`); the view
        of ``run --json``, ``apply`` and ``show``. Once per job: the next tool call opens a
        new one."""
        claimed = self._claim_propose(request_id)
        if isinstance(claimed, Outcome):
            return claimed
        session, idle = claimed
        try:
            proposal = session.propose(args.message)
        except PatchboxError as exc:
            with self._lock:
                self._proposing = False
            return self._error(exc, session)
        note = None
        if idle is not None:
            note = (
                f"this job had no call for {idle:g} s (the server's idle timeout) and was "
                "proposed as it was before this call; its message was not kept"
            )
        outcome = Outcome(ProposalView.of(proposal, note).model_dump(mode="json"))
        with self._lock:
            if request_id is not None:
                self._answers[request_id] = outcome
            self._proposing, self._proposed = False, proposal.job_id
            followed = args.follow_up and proposal.status == "awaiting_review"
            self._follow = proposal.job_id if followed else None
        self._progress(f"job {proposal.job_id} proposed: {proposal.status}")
        return outcome

    def _claim_propose(self, request_id: str | None) -> tuple[api.Session, float | None] | Outcome:
        """The job to propose, now marked as proposing, and the idle timeout when it was
        already proposed by it; or the answer instead (the first answer to this request id,
        or a refusal)."""
        with self._lock:
            if request_id is not None and request_id in self._answers:
                return self._answers[request_id]
            session = self._session
            refused = self._refusal(session)
            if refused is not None or session is None:
                return failure(str(ErrorCode.USAGE_ERROR), refused or NOTHING_TO_PROPOSE)
            self._proposing = True
            idle = session.idle_end
            return session, None if idle is None else idle.seconds

    def _refusal(self, session: api.Session | None) -> str | None:
        """Under the lock: why ``propose`` is refused now, or None."""
        if self._closed is not None:
            return self._closed
        if session is None:
            before = f"; {self._previous}" if self._previous else ""
            return NOTHING_TO_PROPOSE + before + NEXT_CALL
        if self._proposing:
            return "the session's job is being proposed"
        if self._proposed == session.job_id:
            state, job_id = session.record.state, session.job_id
            return (
                f"the job {job_id} was proposed ({state}); see patchbox show {job_id} --diff"
                + NEXT_CALL
            )
        idle = session.idle_end
        if (idle is not None and not idle.changed) or (idle is None and not session.active):
            return f"nothing to propose: {self._ended(session)}{NEXT_CALL}"
        return None

    def _error(self, exc: PatchboxError, session: api.Session | None) -> Outcome:
        """A refused or failed call; when it ended the job, the job's id and state too."""
        job = None
        if session is not None and not session.active and session.idle_end is None:
            job = JobRef(
                job_id=session.job_id,
                status=session.record.state,
                next="the next tool call starts a new job on the repository's current state",
            )
        return error_outcome(error_view(exc, self._scrub.text), job)

    # -- the jobs' lives ------------------------------------------------------------------

    def _open(self, request_id: str | None) -> tuple[api.Session, JobStarted | None]:
        """The job that takes this call, and the notice its first answer carries when it was
        opened now. A request id answered before goes to the job that answered it; an ended
        job is retired and a new one opened."""
        with self._lock:
            if request_id is not None and request_id in self._answered:
                return self._answered[request_id], None
            if self._closed is not None:
                raise UsageError(self._closed)
            session = self._session
            if session is not None and session.active:
                return session, None
            if session is not None:
                self._retire(session)
            follow, self._follow = self._follow, None
            self._session = self._start(follow)
            where = (
                f"the result of job {follow} (a follow-up)"
                if follow
                else "the repository's current state"
            )
            notice = JobStarted(
                job_id=self._session.job_id,
                message=f"job {self._session.job_id} started on {where}"
                + (f"; {self._previous}" if self._previous else ""),
            )
            return self._session, notice

    def _retire(self, session: api.Session) -> None:
        """Under the lock: the ended job is no longer the session's; what became of it is
        said at the next job's first answer."""
        self._previous = self._ended(session, previous=True)
        session.close()
        self._answered = {k: v for k, v in self._answered.items() if v is session}
        self._session, self._proposed = None, None
        client, self._client = self._client, None
        if client is not None:
            client.close()

    @staticmethod
    def _ended(session: api.Session, *, previous: bool = False) -> str:
        """What became of an ended job, in a sentence."""
        job_id, state = session.job_id, session.record.state
        name = f"the previous job {job_id}" if previous else f"the job {job_id}"
        idle = session.idle_end
        show = f"patchbox show {job_id} --diff"
        if idle is not None and not idle.changed:
            return (
                f"{name} changed nothing and was cancelled after {idle.seconds:g} s without a "
                "call (the server's idle timeout)"
            )
        if idle is not None:
            how = f"was proposed as it was after {idle.seconds:g} s without a call"
            if state == "awaiting_review":
                return f"{name} {how} and awaits review ({show}, patchbox apply {job_id})"
            return f"{name} {how} and ended {state} ({show})"
        if state == "awaiting_review":
            return f"{name} awaits review ({show}, patchbox apply {job_id})"
        error = session.record.error
        code = f" with {error.code}" if error is not None else ""
        return f"{name} ended {state}{code} ({show})"

    def _start(self, follow: str | None = None) -> api.Session:
        """Opens a job (health gate, baseline, environment, sandbox) on the repository as
        it is now, or on the result of job ``follow``; under the lock."""
        from controller.sandbox.dockerclient import connect

        o = self.options
        client: docker.DockerClient | None = None
        try:
            client = connect()
            session = api.open_session(
                o.repo,
                task=o.task,
                config=o.config,
                include_local_changes=o.include_local_changes,
                trust_repo_config=o.trust_repo_config,
                runtime=o.runtime,
                client=client,
                progress=self._progress,
                idle_seconds=o.idle_seconds,
                follow_from=follow,
            )
        except PatchboxError as exc:
            if client is not None:
                client.close()
            self.failure = exc
            hint = hint_data(exc.hint)
            words = f"; {hint['text']}" if hint is not None else ""
            write_line(f"patchbox: error {exc.code}: {self._scrub.text(exc.message)}{words}")
            raise
        except BaseException:
            if client is not None:
                client.close()
            raise
        self._client, self.failure, self.opened = client, None, True
        self._progress(f"session opened: job {session.job_id}")
        return session

    def close(self) -> None:
        """Cancels the job unless it ended (its containers are removed) and waits for an
        opening in progress first; nothing is left running. Idempotent."""
        with self._lock:
            if self._closed is None:
                self._closed = "the MCP session was closed"
            session = self._session
            client, self._client = self._client, None
        if session is not None:
            active = session.active
            session.close()
            if active:
                self._progress(f"session closed: job {session.job_id} {session.record.state}")
        if client is not None:
            client.close()


class Sessions:
    """The slots of one server, by MCP session: one for stdio, one per session id over
    HTTP. A slot whose MCP session ended is closed on a thread of its own."""

    def __init__(self, make: Callable[[], Slot]) -> None:
        self._make = make
        self._lock = threading.Lock()
        self._open: dict[str, Slot] = {}
        self._all: list[Slot] = []
        self._closing: list[threading.Thread] = []

    def get(self, key: str) -> Slot:
        with self._lock:
            slot = self._open.get(key)
            if slot is None:
                slot = self._open[key] = self._make()
                self._all.append(slot)
            return slot

    def end(self, key: str) -> None:
        """The MCP session ``key`` is over: its job is cancelled (without blocking)."""
        with self._lock:
            slot = self._open.pop(key, None)
            if slot is None:
                return
            thread = threading.Thread(target=slot.close, name=f"mcp-close-{key[:16]}")
            self._closing.append(thread)
        thread.start()

    def close_all(self) -> None:
        """Every session's job cancelled and its containers removed; returns when they are."""
        with self._lock:
            slots, self._open = list(self._open.values()), {}
            closing = list(self._closing)
        for slot in slots:
            slot.close()
        for thread in closing:
            thread.join()

    def exit_code(self) -> int:
        """0, unless no session ever opened and the last opening failed: its exit status."""
        from controller.errors import exit_code_for_error

        with self._lock:
            slots = list(self._all)
        if any(s.opened for s in slots):
            return 0
        failures = [s.failure for s in slots if s.failure is not None]
        return int(exit_code_for_error(str(failures[-1].code))) if failures else 0
