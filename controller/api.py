"""The engine as a Python API: what the CLI, the MCP server and scripts call.

Two ways to make a job:

- :func:`run_job`: a task and a model provider; the job runs to its decision.
- :func:`open_session`: the caller is the model. The session prepares the job as ``run``
  does (health gate, baseline, a sandbox), then each :meth:`Session.call` is one tool call
  in the sandbox, with the same tools, argument rules, limits, ledger and transcript as a
  model's; :meth:`Session.propose` collects the diff, validates it, runs the required checks
  in a fresh sandbox and decides, exactly as a job does.

Then, on a job awaiting review: :func:`apply_job`, :func:`revert_job`, :func:`discard_job`.
Every error is a :class:`controller.errors.PatchboxError` with its code.

.. code-block:: python

    from pathlib import Path
    from controller import api

    with api.open_session(Path("~/src/project").expanduser()) as session:
        hits = session.call("search_text", {"query": "def parse_date"})
        edit = {"path": "dates.py", "oldText": "%d/%m/%Y", "newText": "%Y-%m-%d"}
        session.call("replace_text", edit)
        proposal = session.propose("ISO dates")
    if proposal.status == "awaiting_review":
        api.apply_job(proposal.job_id)
"""

from __future__ import annotations

import hashlib
import itertools
import json
import queue
import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from pydantic import BaseModel, ConfigDict

from controller.config.host import HostConfig, load_config
from controller.config.task import TaskSpec
from controller.errors import CancelledError, ErrorCode, PatchboxError, UsageError
from controller.jobs.records import JobRecord, JobStore, write_lock
from controller.logs import Scrubber
from controller.providers.base import ModelTurn, ToolCall, ToolResult, check_results

if TYPE_CHECKING:
    import docker

    from controller.changes.apply import ApplyResult, RevertResult
    from controller.jobs.engine import Job
    from controller.providers.base import Provider
    from controller.repo.pin import RepoPin
    from controller.sandbox.base import Runtime

SESSION_PROMPT = "interactive session"
"""The task prompt of a session opened without a task."""
Progress = Callable[[str], None]


def default_task(config: HostConfig) -> TaskSpec:
    """The task of a session opened without one: the host configuration's checks (the
    engine adds the repository's with ``trust_repo_config``), the default limits."""
    limits = config.limits.model_dump() if config.limits is not None else {}
    return TaskSpec.model_validate({"prompt": SESSION_PROMPT, "limits": limits})


# -- views and state ----


def job_view(
    record: JobRecord, diff: str | None, evidence: str, secrets: tuple[str, ...] = ()
) -> dict[str, Any]:
    """The one JSON object of ``run --json``. Messages and check output are
    scrubbed of secrets and host paths like the evidence; the diff is shown as it is."""
    view = Scrubber(record.repo, secrets, paths=False).value(_view(record, evidence))
    view["diff"] = diff or ""
    return dict(view)


CHECK_VIEW = frozenset({"id", "status", "exit_code", "duration_ms", "output_tail"})


def _view(record: JobRecord, evidence: str) -> dict[str, Any]:
    stored = record.model_dump(mode="json")
    return {
        "job_id": record.job_id,
        "status": record.state,
        "error": record.error,
        "files": [
            {"path": f.path, "change": f.kind, "added": f.added, "removed": f.removed}
            for f in record.files
        ],
        "control_characters": [c.model_dump(mode="json") for c in record.control_characters],
        "checks": [c.model_dump(mode="json", include=set(CHECK_VIEW)) for c in record.checks],
        "tool_calls": stored["tool_calls"],
        "evidence": evidence,
        "decision": stored["decision"],
    }


# -- running a job with a model ----------------------------------------------------------


def run_job(  # noqa: PLR0913 - a job's inputs, all keyword-only
    repo: Path,
    task: TaskSpec,
    provider: Provider,
    *,
    config: HostConfig | None = None,
    include_local_changes: bool = False,
    trust_repo_config: bool = False,
    consent_trusted_auto: bool = False,
    runtime: Runtime | None = None,
    secrets: tuple[str, ...] = (),
    client: docker.DockerClient | None = None,
    progress: Progress | None = None,
) -> tuple[JobRecord, str | None]:
    """Runs one job to its end state; returns its record and its diff (None without one)."""
    job = make_job(
        repo,
        task,
        provider,
        config=config,
        include_local_changes=include_local_changes,
        trust_repo_config=trust_repo_config,
        consent_trusted_auto=consent_trusted_auto,
        runtime=runtime,
        secrets=secrets,
        client=client,
        progress=progress,
    )
    return job.run(), job.diff


def make_job(  # noqa: PLR0913 - a job's inputs, all keyword-only
    repo: Path,
    task: TaskSpec,
    provider: Provider,
    *,
    config: HostConfig | None,
    include_local_changes: bool,
    trust_repo_config: bool,
    consent_trusted_auto: bool,
    runtime: Runtime | None,
    secrets: tuple[str, ...],
    client: docker.DockerClient | None,
    progress: Progress | None,
    pin: RepoPin | None = None,
    apply_denied: str | None = None,
) -> Job:
    """The job, not started. ``pin``: a service job's repository, held to the folder its
    tenant submitted (:mod:`controller.repo.pin`). ``apply_denied`` says why the requester
    may not apply it (the service's tenant without ``allow_apply``): its ``auto`` and
    ``trusted-auto`` stop for review."""
    from controller.jobs.engine import Job, JobRequest
    from controller.sandbox.dockerclient import connect

    request = JobRequest(
        repo=repo,
        task=task,
        provider=provider,
        config=config or load_config(),
        include_local_changes=include_local_changes,
        trust_repo_config=trust_repo_config,
        consent_trusted_auto=consent_trusted_auto,
        runtime=runtime,
        secrets=secrets,
        pin=pin,
        apply_denied=apply_denied,
    )
    return Job(client or connect(), request, progress=progress)


# -- a session: the caller is the model --------------------------------------------------


@dataclass(frozen=True)
class CallResult:
    """One tool call's outcome, as a model gets it: ``result`` when ``ok``, else ``error``
    (``{"code", "message"}``; the code is one of the tools' error codes)."""

    ok: bool
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None

    @property
    def code(self) -> str | None:
        return None if self.error is None else str(self.error.get("code"))


@dataclass(frozen=True)
class Proposal:
    """What :meth:`Session.propose` ended with (the keys of ``run --json``)."""

    job_id: str
    status: str
    diff: str
    files: list[dict[str, Any]]
    checks: list[dict[str, Any]]
    error: dict[str, str] | None
    decision: dict[str, Any] | None
    record: JobRecord = field(repr=False)

    def as_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "status": self.status,
            "diff": self.diff,
            "files": self.files,
            "checks": self.checks,
            "error": self.error,
            "decision": self.decision,
            "apply": f"patchbox apply {self.job_id}" if self.status == "awaiting_review" else None,
        }


_END = object()


class _CallerProvider:
    """The provider of a session: each turn is what the caller asks for next. ``next_turn``
    hands the previous turn's results to the caller and waits for its next request."""

    def __init__(self) -> None:
        self._requests: queue.Queue[ModelTurn | object] = queue.Queue()
        self._results: queue.Queue[list[ToolResult] | object] = queue.Queue()
        self._cancelled = threading.Event()
        self._last: ModelTurn | None = None
        self.waiting = threading.Event()
        """Set while the engine waits for the caller's next turn."""

    def next_turn(self, results: list[ToolResult]) -> ModelTurn:
        check_results(self._last, results)
        if self._last is not None:
            self._results.put(list(results))
        self.waiting.set()
        request = self._requests.get()
        self.waiting.clear()
        if request is _END or self._cancelled.is_set():
            raise CancelledError("the session was cancelled")
        assert isinstance(request, ModelTurn)  # noqa: S101 - only turns are queued
        self._last = request
        return request

    def ask(self, turn: ModelTurn) -> None:
        self._requests.put(turn)

    def answer(self, timeout: float) -> list[ToolResult] | object:
        """The results of the turn asked, or :data:`_END` when the job ended instead."""
        try:
            return self._results.get(timeout=timeout)
        except queue.Empty:
            return _END

    def job_ended(self) -> None:
        self._results.put(_END)

    def cancel(self) -> None:
        self._cancelled.set()
        self._requests.put(_END)

    def close(self) -> None:
        return None


class Session:
    """One job driven by its caller (see the module docstring). Use :func:`open_session`;
    always :meth:`close` it (or use ``with``): an open session holds a sandbox."""

    def __init__(self, job: Job, provider: _CallerProvider) -> None:
        self._job = job
        self._provider = provider
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._seen: dict[str, CallResult] = {}
        self._calls = 0
        self._end: JobRecord | None = None
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"session-{job.record.job_id}")
        self._thread.start()
        while not provider.waiting.wait(0.05):
            if not self._thread.is_alive():
                self._raise_ended()

    def _run(self) -> None:
        try:
            self._end = self._job.run()
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

    def call(
        self, tool: str, arguments: dict[str, Any], request_id: str | None = None
    ) -> CallResult:
        """Runs one tool call in the sandbox. A repeated ``request_id`` returns the first
        call's result without running it again. Raises the job's error when the call ended
        the job (a broken sandbox, a limit), and ``USAGE_ERROR`` once the session ended."""
        with self._lock:
            if request_id is not None and request_id in self._seen:
                return self._seen[request_id]
            if not self.active:
                msg = f"the session's job {self.job_id} has ended ({self.record.state})"
                raise UsageError(msg)
            call_id = f"s{next(self._ids)}"
            text = json.dumps(arguments, ensure_ascii=False)
            call = ToolCall(id=call_id, name=tool, arguments=text)
            self._provider.ask(ModelTurn(tool_calls=[call]))
            answer = self._provider.answer(timeout=self._job.request.task.limits.wall_seconds + 60)
            if not isinstance(answer, list):
                self._thread.join()
                self._raise_ended()
            self._calls += 1
            content = json.loads(answer[0].content)
            result = CallResult(
                ok=bool(content.get("ok")), result=content.get("result"), error=content.get("error")
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
            if self.active:
                self._provider.ask(ModelTurn(text=message or "proposed"))
            self._thread.join()
            if self._failure is not None and not isinstance(self._failure, PatchboxError):
                raise self._failure
            record = self._job.record
            view = job_view(record, self._job.diff, "")
            return Proposal(
                job_id=record.job_id,
                status=record.state,
                diff=self._job.diff or "",
                files=view["files"],
                checks=view["checks"],
                error=record.error,
                decision=view["decision"],
                record=record,
            )

    def cancel(self) -> None:
        """Ends the job ``cancelled``; its sandbox is removed. Idempotent."""
        if self.active:
            self._job.cancel()
        self._thread.join()

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
        error = self.record.error or {"code": str(ErrorCode.INTERNAL_ERROR), "message": "ended"}
        code = ErrorCode(error["code"]) if error["code"] in ErrorCode.__members__ else None
        raise PatchboxError(error["message"], code=code)


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
) -> Session:
    """Prepares a job (health gate, baseline, environment, sandbox) for the caller to drive.
    Raises the preparation's errors (``NOT_A_REPOSITORY``, ``CONSENT_REQUIRED``, ...) with
    nothing left running."""
    config = config or load_config()
    provider = _CallerProvider()
    job = make_job(
        repo,
        task or default_task(config),
        provider,
        config=config,
        include_local_changes=include_local_changes,
        trust_repo_config=trust_repo_config,
        consent_trusted_auto=False,
        runtime=runtime,
        secrets=(),
        client=client,
        progress=progress,
    )
    return Session(job, provider)


# -- after the decision ------------------------------------------------------------------


def job_diff(store: JobStore, job_id: str) -> str | None:
    """The diff a job made, as its evidence keeps it, byte for byte (None without one): a
    carriage return stays one (a text-mode read would make it a newline)."""
    path = store.folder(job_id) / "diff.patch"
    try:
        return path.read_bytes().decode("utf-8", "surrogateescape")
    except FileNotFoundError:
        return None


def apply_job(
    job_id: str,
    *,
    merge: bool = False,
    config: HostConfig | None = None,
    pin: RepoPin | None = None,
) -> tuple[JobRecord, ApplyResult]:
    """Applies a job awaiting review to its work tree, all or nothing (``APPLY_CONFLICT``
    naming the files otherwise; with ``merge``, files changed meanwhile merge three-way).
    ``pin``: a service job's repository, verified first and written only as the folder
    pinned (``REPO_NOT_ALLOWED``, nothing written, otherwise)."""
    from controller.changes.apply import apply_changeset
    from controller.changes.journal import fault_point
    from controller.jobs.evidence import write_evidence
    from controller.jobs.records import Decision
    from controller.jobs.settle import held

    store = JobStore()
    with held(store, job_id, pin=pin) as record:
        if record.state != "awaiting_review":
            msg = f"job {record.job_id} is {record.state}; only a job awaiting review is applied"
            raise UsageError(msg)
        if record.baseline is None:
            msg = f"job {record.job_id} has no baseline"
            raise UsageError(msg)
        diff = job_diff(store, record.job_id) or ""
        with write_lock(record.repo):
            result = apply_changeset(
                record.baseline,
                diff,
                job_id=record.job_id,
                allowed_paths=record.allowed_paths,
                extra_protected=tuple((config or load_config()).protected),
                merge=merge,
                pin=pin,
            )
        record.move("applied")
        decision = record.decision or Decision(mode=record.mode, reason="no decision was recorded")
        record.decision = decision.model_copy(
            update={"applied_by": "user", "merged": result.merged}
        )
        store.save(record)
        fault_point("apply.recorded")
        write_evidence(record, diff, store)
    return record, result


class RemoteOrigin(BaseModel):
    """Where a diff applied with :func:`apply_remote_diff` came from (kept in the local
    job's ``diagnostics["remote"]``; shown, never trusted)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    server: str
    job_id: str
    bundle: str


def apply_remote_diff(  # noqa: PLR0913 - the diff, where it applies, keyword-only rules
    repo: Path,
    diff: str | bytes,
    commit: str,
    *,
    origin: RemoteOrigin,
    allowed_paths: list[str] | None = None,
    merge: bool = False,
    config: HostConfig | None = None,
) -> tuple[JobRecord, ApplyResult]:
    """Applies a diff made elsewhere on ``commit`` (a service's bundle job) to the work tree
    of ``repo`` as :func:`apply_job` applies a local job: the baseline is ``commit``'s tree
    (``APPLY_CONFLICT`` when the repository does not have it), then
    :func:`controller.changes.apply.apply_changeset` with every rule of a local job (the
    protected paths of ``config``, config paths only as ``allowed_paths`` names them,
    links, modes, sizes), the touched paths' check on the work tree and the journal.

    The apply is a local job of its own (a new id, ``diagnostics["remote"]`` says where it
    came from): ``patchbox jobs`` lists it, ``patchbox revert`` undoes it. It is recorded
    (``awaiting_review``, with its diff) before the apply starts; when the apply is refused
    before it wrote anything (``CHANGESET_INVALID``, ``APPLY_CONFLICT``, ...) the record is
    removed again, so a refused diff leaves nothing behind."""
    from controller.changes.apply import apply_changeset
    from controller.changes.journal import Journal
    from controller.errors import ApplyConflictError
    from controller.jobs.evidence import write_evidence
    from controller.jobs.records import Decision, FileChange
    from controller.repo.baseline import commit_baseline
    from controller.sandbox.labels import new_job_id

    config = config or load_config()
    baseline = commit_baseline(repo, commit)
    if baseline is None:
        msg = (
            f"cannot apply: the diff was made on commit {commit[:12]}, which this repository "
            "does not have (fetch it, or apply in the repository the job was sent from); "
            "nothing was written"
        )
        raise ApplyConflictError([], msg)
    raw = diff.encode("utf-8", "surrogateescape") if isinstance(diff, str) else diff
    text = raw.decode("utf-8", "surrogateescape")
    store = JobStore()
    task: dict[str, Any] = {} if allowed_paths is None else {"allowed_paths": allowed_paths}
    record = JobRecord(
        job_id=new_job_id(),
        repo=baseline.repo,
        state="awaiting_review",
        task=task,
        baseline=baseline,
        diagnostics={"remote": origin.model_dump()},
        diff_sha256=hashlib.sha256(raw).hexdigest(),
    )
    record.history = [("awaiting_review", record.created_at)]
    store.save(record)
    write_evidence(record, text, store)
    try:
        with write_lock(record.repo):
            result = apply_changeset(
                baseline,
                raw,
                job_id=record.job_id,
                allowed_paths=record.allowed_paths,
                extra_protected=tuple(config.protected),
                merge=merge,
            )
    except BaseException:
        if Journal().phase(record.job_id) == "none":  # nothing was written: nothing kept
            shutil.rmtree(store.folder(record.job_id), ignore_errors=True)
        raise
    record.files = [
        FileChange.model_validate(f.model_dump(include=set(FileChange.model_fields)))
        for f in result.changeset.files
    ]
    record.move("applied")
    reason = f"the diff of job {origin.job_id} on {origin.server}"
    record.decision = Decision(
        mode=record.mode, reason=reason, applied_by="user", merged=result.merged
    )
    store.save(record)
    write_evidence(record, text, store)
    return record, result


def revert_job(job_id: str, *, pin: RepoPin | None = None) -> tuple[JobRecord, RevertResult]:
    """Undoes an applied job exactly (``REVERT_CONFLICT`` when a touched path changed);
    ``pin`` as for :func:`apply_job`."""
    from controller.changes.apply import revert_changeset
    from controller.changes.journal import fault_point
    from controller.jobs.evidence import write_evidence
    from controller.jobs.settle import held

    store = JobStore()
    with held(store, job_id, pin=pin) as record:
        if record.state != "applied":
            msg = f"job {record.job_id} is {record.state}; only an applied job is reverted"
            raise UsageError(msg)
        with write_lock(record.repo):
            result = revert_changeset(record.job_id, pin=pin)
        record.move("reverted")
        store.save(record)
        fault_point("revert.recorded")
        write_evidence(record, job_diff(store, record.job_id), store)
    return record, result


DISCARDABLE = frozenset({"awaiting_review", "failed", "cancelled"})


def discard_job(job_id: str, *, pin: RepoPin | None = None) -> JobRecord:
    """Drops a job awaiting review, failed or cancelled; the repository is not touched.
    ``pin``: a service job's repository path must still lead inside its tenant's roots, or
    nowhere (:meth:`~controller.repo.pin.RepoPin.check_roots`; ``REPO_NOT_ALLOWED``
    otherwise)."""
    from controller.jobs.evidence import write_evidence
    from controller.jobs.settle import held

    store = JobStore()
    with held(store, job_id, pin=pin) as record:
        if record.state not in DISCARDABLE:
            msg = (
                f"job {record.job_id} is {record.state}; only a job awaiting review, failed or "
                "cancelled is discarded"
            )
            raise UsageError(msg)
        if pin is not None:
            pin.check_roots()
        record.move("discarded")
        store.save(record)
        write_evidence(record, job_diff(store, record.job_id), store)
    return record


def job(job_id: str) -> JobRecord:
    """A job's record (``USAGE_ERROR`` for an unknown id), settled with the journal first
    (:mod:`controller.jobs.settle`): its state says what the work tree holds."""
    from controller.jobs.settle import settled

    store = JobStore()
    return settled(store, store.load(job_id))


__all__ = [
    "CallResult",
    "Proposal",
    "RemoteOrigin",
    "Session",
    "apply_job",
    "apply_remote_diff",
    "discard_job",
    "job",
    "job_diff",
    "job_view",
    "make_job",
    "open_session",
    "revert_job",
    "run_job",
]
