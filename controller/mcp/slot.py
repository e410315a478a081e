"""One MCP session's job (:class:`Slot`) and the slots of a server (:class:`Sessions`).

A session's job is opened at its first tool call (a failed opening is tried again at the
next one), ended by ``propose``, and closed (cancelled, its containers removed) when the MCP
session ends, when its wall clock runs out, or when the server stops. Every call goes
through :meth:`controller.api.Session.call`; a tool error is an :class:`Outcome` with
``error`` set, its structured content ``{"error": {"code", "message"}}``
(:func:`error_outcome`, the one place an error becomes the MCP answer).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

import mcp_types as types
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from controller import api
from controller.api.views import CheckView, FileView, error_view
from controller.errorinfo import ErrorInfo
from controller.errormap import describe_validation
from controller.errors import ErrorCode, PatchboxError, UsageError
from controller.jobs.loop import FINAL_MESSAGE_CHARS
from controller.jobs.records import Decision
from controller.logs import Scrubber, write_line
from controller.mcp.hints import hint_data

if TYPE_CHECKING:
    from pathlib import Path

    import docker

    from controller.api.session import Proposal
    from controller.config.host import HostConfig
    from controller.config.task import TaskSpec
    from controller.sandbox.base import Runtime

Progress = Callable[[str], None]

CHECKS_URI = "patchbox://task/checks"
"""The resource that lists the checks (named in the server's instructions)."""
PROPOSE = "propose"
WALL_CLOCK_GRACE_SECONDS = 5.0
"""A session idle past its task's ``wall_seconds`` (plus this) is closed: its job is cancelled.
A call that runs into the wall clock fails ``LIMIT_EXCEEDED`` on its own, a little earlier."""
NOTHING_TO_PROPOSE = "nothing to propose: no tool call has been made in this session"


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


class ProposeArgs(BaseModel):
    """End the session's tool calls and propose the change: the diff is collected and
    validated, the required checks run in a fresh sandbox, and the job is decided. Returns the
    job id, its status, the diff, the files, the checks and the command that applies it."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, strict=True, use_attribute_docstrings=True
    )

    message: Annotated[str, StringConstraints(max_length=FINAL_MESSAGE_CHARS)] = ""
    """What the change does, in a sentence or two (kept in the job's record)."""


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
    """The job a failed call ended: its id and its state."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    job_id: str
    status: str


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
    """One MCP session's job. Opened at the first tool call (a failed opening is tried again
    at the next call), ended by ``propose``, by a call that ends the job, or by its wall
    clock, and closed once. Thread-safe: the handlers call it from worker threads."""

    def __init__(self, options: Options, progress: Progress) -> None:
        self.options = options
        self._progress = progress
        self._scrub = Scrubber(str(options.repo.resolve()), paths=False)
        self._lock = threading.Lock()
        """Held while the job opens, and for every change of state."""
        self._session: api.Session | None = None
        self._client: docker.DockerClient | None = None
        self._timer: threading.Timer | None = None
        self._ended: str | None = None
        """Why the session takes no more calls (None while it does)."""
        self._proposing = False
        self._answers: dict[str, Outcome] = {}
        """``propose``'s answer by request id (the session keeps the other tools')."""
        self._answered: set[str] = set()
        """The request ids of the calls the session answered."""
        self.opened = False
        self.failure: PatchboxError | None = None
        """The last opening that failed, until one succeeds."""

    @property
    def job_id(self) -> str | None:
        session = self._session
        return None if session is None else session.job_id

    # -- calls ----------------------------------------------------------------------------

    def call(self, tool: str, arguments: dict[str, Any], request_id: str | None) -> Outcome:
        """One tool call (``propose`` included), as a model's; never raises a
        :class:`PatchboxError`. A request id seen before gets the first answer again."""
        if tool == PROPOSE:
            try:
                args = ProposeArgs.model_validate(arguments)
            except ValidationError as exc:
                detail = describe_validation(exc, subject="arguments")
                return failure(str(ErrorCode.TOOL_ARGUMENTS_INVALID), f"{PROPOSE}: {detail}")
            return self.propose(args, request_id)
        try:
            session = self._open(request_id)
            result = session.call(tool, arguments, request_id=request_id)
            if request_id is not None:
                self._answered.add(request_id)
        except UsageError as exc:  # the job has ended: say why
            ended = self._ended
            return self._error(exc if ended is None else UsageError(ended))
        except PatchboxError as exc:
            return self._error(exc)
        if result.ok:
            return Outcome(dict(result.result or {}))
        return Outcome({"error": dict(result.error or {})}, error=True)

    def propose(self, args: ProposeArgs, request_id: str | None = None) -> Outcome:
        """Ends the job's calls (:meth:`controller.api.Session.propose`); the view of
        ``run --json``, ``apply`` and ``show``. Once per session."""
        session = self._claim_propose(request_id)
        if isinstance(session, Outcome):
            return session
        try:
            proposal = session.propose(args.message)
        except PatchboxError as exc:
            with self._lock:
                self._proposing = False
            return self._error(exc)
        outcome = Outcome(ProposalView.of(proposal).model_dump(mode="json"))
        with self._lock:
            if request_id is not None:
                self._answers[request_id] = outcome
        self._end(
            f"the session's job {proposal.job_id} was proposed and has ended ({proposal.status});"
            f" see `patchbox show {proposal.job_id} --diff`. A new job needs a new MCP session"
        )
        self._progress(f"job {proposal.job_id} proposed: {proposal.status}")
        return outcome

    def _claim_propose(self, request_id: str | None) -> api.Session | Outcome:
        """The session to propose, now marked as proposing; or the answer instead (the
        first answer to this request id, or a refusal)."""
        with self._lock:
            if request_id is not None and request_id in self._answers:
                return self._answers[request_id]
            if self._ended is not None:
                return failure(str(ErrorCode.USAGE_ERROR), self._ended)
            if self._session is None:
                return failure(str(ErrorCode.USAGE_ERROR), NOTHING_TO_PROPOSE)
            if self._proposing:
                return failure(str(ErrorCode.USAGE_ERROR), "the session's job is being proposed")
            self._proposing = True
            return self._session

    def _error(self, exc: PatchboxError) -> Outcome:
        """A refused or failed call; when it ended the job, the job's id and state too."""
        job = None
        session = self._session
        if session is not None and not session.active:
            job = JobRef(job_id=session.job_id, status=session.record.state)
            self._end(
                f"the session's job {session.job_id} has ended ({job.status}); "
                f"see `patchbox show {session.job_id}`"
            )
        return error_outcome(error_view(exc, self._scrub.text), job)

    # -- the job's life -------------------------------------------------------------------

    def _open(self, request_id: str | None) -> api.Session:
        """The session's job, opened now if it is not yet. Once the session has ended, only
        a request id it answered before gets it (to answer that again)."""
        with self._lock:
            if self._ended is not None and (
                self._session is None or request_id not in self._answered
            ):
                raise UsageError(self._ended)
            if self._session is not None:
                return self._session
            self._session = self._start()
            return self._session

    def _start(self) -> api.Session:
        """Opens the job (health gate, baseline, environment, sandbox); under the lock."""
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
        timer = threading.Timer(o.task.limits.wall_seconds + WALL_CLOCK_GRACE_SECONDS, self._expire)
        timer.daemon = True
        timer.start()
        self._timer = timer
        return session

    def _expire(self) -> None:
        seconds = f"{self.options.task.limits.wall_seconds:g}"
        self._end(
            f"the session's job {self.job_id} was cancelled: its wall clock of {seconds} s "
            "ran out (the task's limits.wall_seconds)"
        )
        self.close()

    def _end(self, why: str) -> None:
        """No more calls from now on (the first reason stays)."""
        with self._lock:
            if self._ended is None:
                self._ended = why
            timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()

    def close(self) -> None:
        """Cancels the job unless it ended (its containers are removed) and waits for an
        opening in progress first; nothing is left running. Idempotent."""
        self._end("the MCP session was closed")
        with self._lock:
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

    @classmethod
    def of(cls, proposal: Proposal) -> ProposalView:
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
        )
