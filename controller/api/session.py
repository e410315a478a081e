"""A session: the caller is the model. The session prepares the job as ``run`` does (health
gate, baseline, a sandbox), then each :meth:`Session.call` is one tool call in the sandbox,
with the same tools, argument rules, limits, ledger and transcript as a model's;
:meth:`Session.propose` collects the diff, validates it, runs the required checks in a fresh
sandbox and decides, exactly as a job does.

The job's wall clock (``limits.wall_seconds``) counts working time: the time of the calls,
not the caller's time between them. A session opened with ``idle_seconds`` ends by itself
when no call came for that long: a job that changed something is proposed as it is (its
diff validated, checked and decided, as :meth:`Session.propose` does), one that changed
nothing is cancelled; either way its sandbox is removed and the repository's lock released
(:attr:`Session.idle_end` says which)."""

from __future__ import annotations

import itertools
import json
import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from controller.api.caller import CallerProvider
from controller.api.iterate import follow_up
from controller.api.jobs import make_job
from controller.api.views import JobView, job_view
from controller.config.host import HostConfig, load_config
from controller.config.task import TaskSpec
from controller.errorinfo import ErrorInfo
from controller.errors import ErrorCode, PatchboxError, UsageError
from controller.jobs.engine import Job
from controller.jobs.records import JobRecord
from controller.jobs.request import JobRequest
from controller.providers.base import ModelTurn, ToolCall
from controller.tools.outcome import ToolErrorInfo
from controller.tools.watch import CheckLine

if TYPE_CHECKING:
    import docker

    from controller.sandbox.base import Runtime

SESSION_PROMPT = "interactive session"
"""The task prompt of a session opened without a task."""
Progress = Callable[[str], None]


def default_task(config: HostConfig) -> TaskSpec:
    """The task of a session opened without one: the host configuration's checks (the
    engine adds the repository's with ``trust_repo_config``), the default limits."""
    limits = config.limits.model_dump() if config.limits is not None else {}
    return TaskSpec.model_validate({"prompt": SESSION_PROMPT, "limits": limits})


@dataclass(frozen=True)
class CallResult:
    """One tool call's outcome, as a model gets it: ``result`` when ``ok``, else ``error``
    (``{"code", "message"}``; the code is one of the tools' error codes)."""

    ok: bool
    result: dict[str, Any] | None = None
    """The result's JSON object, as the model gets it."""
    error: ToolErrorInfo | None = None

    @property
    def code(self) -> str | None:
        return None if self.error is None else str(self.error.get("code"))


@dataclass(frozen=True)
class Proposal:
    """What :meth:`Session.propose` ended with: the job's view (the object of ``run
    --json``) and its record."""

    view: JobView
    record: JobRecord = field(repr=False)

    @property
    def job_id(self) -> str:
        return self.view.job_id

    @property
    def status(self) -> str:
        return self.view.status

    @property
    def diff(self) -> str:
        return self.view.diff

    @property
    def error(self) -> ErrorInfo | None:
        return self.view.error


@dataclass(frozen=True)
class IdleEnd:
    """How a session ended that had no call for ``seconds``: a job that ``changed``
    something is proposed as it was (``proposal``, once done), one that did not is
    cancelled."""

    seconds: float
    changed: bool
    proposal: Proposal | None = None

    @property
    def job_id(self) -> str | None:
        return None if self.proposal is None else self.proposal.job_id


IDLE_MESSAGE = "proposed as it was after {seconds:g} s without a call (the idle timeout)"
"""The job's final message when an idle session proposed it."""
IDLE_DENIAL = (
    "the job was proposed by the idle timeout after {seconds:g} s without a call, not by its "
    "caller: its change may be unfinished"
)
"""Why a job the idle timeout proposed never applies itself (auto stops for review)."""


@dataclass(frozen=True)
class _Ended:
    """The end of a streamed call: its result or its error."""

    outcome: CallResult | BaseException


class Session:
    """One job driven by its caller (see the module docstring). Use :func:`open_session`;
    always :meth:`close` it (or use ``with``): an open session holds a sandbox."""

    def __init__(
        self,
        job: Job,
        provider: CallerProvider,
        *,
        idle_seconds: float | None = None,
        progress: Progress | None = None,
    ) -> None:
        self._job = job
        self._provider = provider
        self._progress = progress or (lambda _m: None)
        self._lock = threading.Lock()
        self._on_output: Callable[[CheckLine], object] | None = None
        job.output = self._told
        self._ids = itertools.count(1)
        self._seen: dict[str, CallResult] = {}
        self._calls = 0
        self._end: JobRecord | None = None
        self._failure: BaseException | None = None
        self._idle_seconds = idle_seconds
        self._idle_since = time.monotonic()
        self._stop = threading.Event()
        self.idle_end: IdleEnd | None = None
        """Set when the session ended itself after ``idle_seconds`` without a call."""
        self._thread = threading.Thread(target=self._run, name=f"session-{job.record.job_id}")
        self._thread.start()
        while not provider.waiting.wait(0.05):
            if not self._thread.is_alive():
                self._raise_ended()
        self._idle_since = time.monotonic()
        self._watcher: threading.Thread | None = None
        if idle_seconds is not None:
            self._watcher = threading.Thread(
                target=self._watch_idle, name=f"session-idle-{job.record.job_id}", daemon=True
            )
            self._watcher.start()

    def _run(self) -> None:
        try:
            self._end = self._job.run(refusals="raise")  # a refusal leaves no job record
        except BaseException as exc:
            self._failure = exc
        finally:
            self._provider.job_ended()

    # -- the caller's side ----------------------------------------------------------------

    @property
    def job_id(self) -> str:
        return self._job.record.job_id

    @property
    def record(self) -> JobRecord:
        return self._job.record

    @property
    def active(self) -> bool:
        return self._thread.is_alive()

    def _told(self, line: CheckLine) -> None:
        """A line of the running check's output: to the current call's ``on_output``."""
        listener = self._on_output
        if listener is not None:
            listener(line)

    def call(
        self,
        tool: str,
        arguments: Mapping[str, object],
        request_id: str | None = None,
        *,
        on_output: Callable[[CheckLine], object] | None = None,
    ) -> CallResult:
        """Runs one tool call in the sandbox. A repeated ``request_id`` returns the first
        call's result without running it again. Raises the job's error when the call ended
        the job (a broken sandbox, a limit), and ``USAGE_ERROR`` once the session ended.

        ``run_check`` takes ``{"checkId": ...}`` or ``{"handle": ...}``, each with
        ``waitSeconds``; while it waits, ``on_output`` is called (on this thread) with
        each line of the check's output as it comes (a :class:`CheckLine`)."""
        with self._lock:
            self._on_output = on_output
            try:
                return self._call(tool, arguments, request_id)
            finally:
                self._on_output = None

    def stream(
        self, tool: str, arguments: Mapping[str, object], request_id: str | None = None
    ) -> Iterator[CheckLine | CallResult]:
        """:meth:`call` as an iterator: each line of a running check's output as it comes (a
        :class:`CheckLine`), then the call's :class:`CallResult`, always last. The call runs on
        a thread of its own; leaving the loop early waits for the call to end (a call with a
        ``waitSeconds`` ends within it), so nothing is left running. The call's error (the
        job's end, the session's) is raised from the iterator."""
        lines: queue.Queue[CheckLine | _Ended] = queue.Queue()

        def work() -> None:
            try:
                lines.put(_Ended(self.call(tool, arguments, request_id, on_output=lines.put)))
            except BaseException as exc:  # handed to the caller's thread
                lines.put(_Ended(exc))

        worker = threading.Thread(target=work, name=f"session-call-{self.job_id}", daemon=True)
        worker.start()
        try:
            while True:
                item = lines.get()
                if isinstance(item, _Ended):
                    if isinstance(item.outcome, BaseException):
                        raise item.outcome
                    yield item.outcome
                    return
                yield item
        finally:
            worker.join()

    def _call(
        self, tool: str, arguments: Mapping[str, object], request_id: str | None
    ) -> CallResult:
        """Under the lock: :meth:`call`."""
        if request_id is not None and request_id in self._seen:
            return self._seen[request_id]
        if not self.active:
            msg = f"the session's job {self.job_id} has ended ({self.record.state})"
            raise UsageError(msg)
        call_id = f"s{next(self._ids)}"
        text = json.dumps(arguments, ensure_ascii=False)
        call = ToolCall(id=call_id, name=tool, arguments=text)
        try:
            answer = self._provider.take(ModelTurn(tool_calls=[call]))
        finally:
            self._idle_since = time.monotonic()
        if answer is None:
            self._thread.join()
            self._raise_ended()
        self._calls += 1
        content = json.loads(answer[0].content)
        result = CallResult(
            ok="error" not in content, result=content.get("result"), error=content.get("error")
        )
        if request_id is not None:
            self._seen[request_id] = result
        return result

    def propose(self, message: str = "") -> Proposal:
        """Ends the calls: the diff is collected, validated, checked in a fresh sandbox and
        decided on, as for any job. Refused (``USAGE_ERROR``) before any call was made."""
        with self._lock:
            if self.active and self._calls == 0:
                msg = "nothing to propose: no tool call has been made in this session"
                raise UsageError(msg)
            return self._propose(message or "proposed")

    def _propose(self, message: str) -> Proposal:
        """Under the lock: the job's end (proposed now with ``message`` if it is active)."""
        if self.active:
            self._provider.ask(ModelTurn(text=message))
        self._thread.join()
        if self._failure is not None and not isinstance(self._failure, PatchboxError):
            raise self._failure
        record = self._job.record
        return Proposal(view=job_view(record, self._job.diff, ""), record=record)

    @property
    def changed(self) -> bool:
        """Whether a call changed (or may have changed) the workspace: an edit, a patch or a
        check that reported files, or a call that failed midway."""
        return any(e.files or e.outcome == "unknown" for e in self.record.ledger)

    def _watch_idle(self) -> None:
        """Ends the session after ``idle_seconds`` without a call (see the module)."""
        limit = self._idle_seconds
        assert limit is not None  # noqa: S101 - started only with a limit
        wait = limit
        while not self._stop.wait(max(wait, 0.01)):
            with self._lock:
                if not self.active or self._stop.is_set():
                    return
                wait = limit - (time.monotonic() - self._idle_since)
                if wait > 0:
                    continue
                self._end_idle(limit)
                return

    def _end_idle(self, seconds: float) -> None:
        """Under the lock: the idle job proposed as it is, or cancelled when it changed
        nothing; its sandbox removed and the repository's lock released."""
        job_id = self.job_id
        if self._calls and self.changed:
            self.idle_end = IdleEnd(seconds=seconds, changed=True)
            self._progress(f"job {job_id}: {seconds:g} s without a call, proposing it as it is")
            # nobody asked for this proposal: it may be half done, so it waits for a person
            self._job.deny_apply(IDLE_DENIAL.format(seconds=seconds))
            try:
                proposal: Proposal | None = self._propose(IDLE_MESSAGE.format(seconds=seconds))
            except Exception as exc:  # the record says it; never a stray thread
                self._progress(f"job {job_id}: {exc}")
                proposal = None
            self.idle_end = IdleEnd(seconds=seconds, changed=True, proposal=proposal)
            self._progress(f"job {job_id} ended idle: {self.record.state}")
            return
        self.idle_end = IdleEnd(seconds=seconds, changed=False)
        self._job.cancel()
        self._thread.join()
        self._progress(f"job {job_id}: {seconds:g} s without a call and no change, cancelled")

    def cancel(self) -> None:
        """Ends the job ``cancelled``; its sandbox is removed. Idempotent. An idle session
        proposing itself is cancelled too (its checks stop)."""
        self._stop.set()
        if self.active:
            self._job.cancel()
        self._thread.join()
        watcher = self._watcher
        if watcher is not None and watcher is not threading.current_thread():
            watcher.join()

    def close(self) -> None:
        """Cancels the job unless it was proposed; nothing is left running."""
        self.cancel()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _raise_ended(self) -> NoReturn:
        failure = self._failure
        if failure is not None and not isinstance(failure, PatchboxError):
            raise failure
        if self._job.failure is not None:
            raise self._job.failure
        if failure is not None:  # refused before its record existed (the path, the lock)
            raise failure
        error = self.record.error or ErrorInfo(code=str(ErrorCode.INTERNAL_ERROR), message="ended")
        code = ErrorCode(error.code) if error.code in ErrorCode.__members__ else None
        raise PatchboxError(error.message, code=code, hint=error.hint)


def open_session(  # noqa: PLR0913 - a job's inputs, all keyword-only
    repo: Path,
    *,
    task: TaskSpec | None = None,
    config: HostConfig | None = None,
    include_local_changes: bool = False,
    trust_repo_config: bool = False,
    runtime: Runtime | None = None,
    client: docker.DockerClient | None = None,
    progress: Progress | None = None,
    idle_seconds: float | None = None,
    follow_from: str | None = None,
) -> Session:
    """Prepares a job (health gate, baseline, environment, sandbox) for the caller to drive.
    Raises the preparation's errors (``NOT_A_REPOSITORY``, ``CONSENT_REQUIRED``, ...) with
    nothing left running. ``idle_seconds``: the session ends itself after that long without
    a call (the module docstring); None: never. ``follow_from``: a follow-up of that job,
    on its result (:func:`controller.api.follow_up`; it stops for review while that job is
    not applied)."""
    config = config or load_config()
    provider = CallerProvider()
    follow, denied = None, None
    if follow_from is not None:
        follow, parent, _diff = follow_up(follow_from)
        if parent.state != "applied":
            denied = f"a follow-up of job {parent.job_id}, which is not applied: review the two"
    request = JobRequest(
        repo=repo,
        task=task or default_task(config),
        provider=provider,
        config=config,
        include_local_changes=include_local_changes,
        trust_repo_config=trust_repo_config,
        runtime=runtime,
        caller_driven=True,
        follow=follow,
        apply_denied=denied,
    )
    job = make_job(request, client=client, progress=progress)
    return Session(job, provider, idle_seconds=idle_seconds, progress=progress)
