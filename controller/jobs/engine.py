"""One job from task to decision: the tool loop (:mod:`controller.jobs.loop`), the diff
reconciled with the effect ledger and validated, required checks in a fresh sandbox, and the
decision (:mod:`controller.jobs.decision`).

Every stage writes the job record before it starts, so a later process sees where a job
stopped. A failure never looks like success: the record ends ``failed`` (or ``cancelled``)
with its error code, and the diagnostics gathered so far are kept.
"""

from __future__ import annotations

import contextlib
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import docker
import structlog

from controller.changes.changeset import ChangeSet
from controller.changes.collect import Collected, collect
from controller.config.checks import job_checks
from controller.config.task import CheckSpec, TaskSpec
from controller.crash import internal_error
from controller.errorinfo import ErrorInfo
from controller.errors import (
    ErrorCode,
    InternalError,
    PatchboxError,
)
from controller.jobs.baselinechecks import cannot_run_error, run_baseline_checks
from controller.jobs.decision import DecisionInputs, decide, skips_checks
from controller.jobs.diffstage import apply_decided, record_changeset
from controller.jobs.evidence import write_evidence
from controller.jobs.loop import CANCELLED_MESSAGE, ToolLoop, cancelled_error
from controller.jobs.periodic import periodically
from controller.jobs.reconcile import baseline_unchanged
from controller.jobs.records import (
    ACTIVE,
    JobRecord,
    JobState,
)
from controller.jobs.request import JobRequest, Refusals, new_record, refused
from controller.jobs.required import check_failed, run_required_checks, skipped_checks
from controller.jobs.sandboxes import JobSandboxes
from controller.jobs.store import JobStore, write_lock
from controller.providers.base import ChecksAware
from controller.repo.baseline import Baseline
from controller.repo.layout import locate
from controller.sandbox.base import Sandbox, SandboxSpec, WorkClock
from controller.sandbox.cache import BaselineCache
from controller.sandbox.docker import DockerSandbox
from controller.sandbox.labels import ControllerIdentity, current_identity
from controller.sandbox.netgate import NetworkGate
from controller.sandbox.prepare import Prepared, prepare
from controller.sandbox.spares import SparePool
from controller.tools.executor import ToolExecutor
from controller.tools.watch import OutputListener

log = structlog.get_logger(__name__)

HEARTBEAT_SECONDS = 15.0
"""How long one step may last before a progress line says it still runs."""
CANCEL_POLL_SECONDS = 0.25
"""How often a running job looks for a cancel asked for from another process."""


class Job:
    """Runs one job; :meth:`cancel` may be called from another thread (or a signal)."""

    def __init__(  # noqa: PLR0913 - the job, then its keyword-only listeners
        self,
        client: docker.DockerClient,
        request: JobRequest,
        *,
        store: JobStore | None = None,
        identity: ControllerIdentity | None = None,
        progress: Callable[[str], None] | None = None,
        output: OutputListener | None = None,
    ) -> None:
        self.client = client
        self.request = request
        self.store = store or JobStore()
        self.identity = identity or current_identity()
        self.progress = progress or (lambda _m: None)
        self.output = output
        """Told each line of a running check's output as it comes (the live output)."""
        self.cancelled = threading.Event()
        self._cancel_reason = CANCELLED_MESSAGE
        self._late_denial: str | None = None
        self.failure: PatchboxError | None = None
        """The error the job failed with (its record keeps it as data)."""
        self.record = new_record(request, self.identity)
        self._box: DockerSandbox | None = None
        self._gate: NetworkGate | None = None
        self._diff: str | None = None
        self._prepared: Prepared | None = None
        self._activity = ""
        self._activity_since = time.monotonic()

    @property
    def diff(self) -> str | None:
        """The job's diff, once collected."""
        return self._diff

    def deny_apply(self, reason: str) -> None:
        """From now on the job may not apply itself: ``auto`` and ``trusted-auto`` stop for
        review with ``reason`` (a job proposed by an idle timeout, not by its caller)."""
        self._late_denial = reason

    @property
    def _apply_denied(self) -> str | None:
        return self.request.apply_denied or self._late_denial

    def cancel(self, reason: str = CANCELLED_MESSAGE) -> None:
        """Stops the job: the provider request is aborted, the running tool or check is
        killed with its container. The job ends ``cancelled`` with its diagnostics, and
        ``reason`` as its error's message (the first cancel's: whatever error the stopped
        step raised, a closed channel or a killed check, is the cancel's doing)."""
        if not self.cancelled.is_set():
            self._cancel_reason = reason
        self.cancelled.set()
        self.request.provider.cancel()
        box = self._box
        if box is not None:
            box.interrupt()  # the job's own thread closes and removes it

    def _doing(self, what: str) -> None:
        """What the job is doing now (told by the stages, the loop and the checks)."""
        self._activity, self._activity_since = what, time.monotonic()

    def _heartbeat(
        self, every: float = HEARTBEAT_SECONDS
    ) -> contextlib.AbstractContextManager[None]:
        """While the job runs: a progress line every ``every`` seconds that one step has
        lasted, so a long check, build or model turn shows that it is alive."""

        def beat() -> bool:
            since = time.monotonic() - self._activity_since
            if since >= every:
                what = self._activity or self.record.state.replace("_", " ")
                with contextlib.suppress(Exception):
                    self.progress(f"still {what} ({since:.0f} s)")
            return False

        return periodically(every, beat, "job-heartbeat")

    def run(self, *, refusals: Refusals = "record") -> JobRecord:
        """Runs the job to its end state.

        An unexpected exception (a bug, an untranslated third-party error) ends the record
        ``failed`` with ``INTERNAL_ERROR``, its containers removed and its evidence written,
        and is raised as :class:`InternalError` naming the crash report.

        ``refusals="raise"``: a job refused before it started for what the requester can
        fix (:data:`~controller.jobs.request.REFUSALS`: a path that is not a work tree's
        top, the repository locked by another job, local changes without consent, a blocked
        repository) raises that error and leaves no job record; the path and the lock are
        checked before the record is written. By default such a job ends ``failed`` with it."""
        record = self.record
        raising = refusals == "raise"
        with self._claim() if raising else contextlib.nullcontext():
            self.store.save(record)
            started = time.perf_counter()
            lock = (
                contextlib.nullcontext()
                if raising
                else write_lock(record.repo, holder=record.job_id)
            )
            unexpected = self._run_stages(lock)
            if raising and unexpected is None and refused(self.failure, record, self.cancelled):
                shutil.rmtree(self.store.folder(record.job_id), ignore_errors=True)
                assert self.failure is not None  # noqa: S101 - refused says so
                raise self.failure
        record.timings_ms["total"] = round((time.perf_counter() - started) * 1000)
        try:
            write_evidence(record, self._diff, self.store, self.request.secrets)
        except Exception as exc:
            unexpected = unexpected or self._internal(exc)
        self.store.save(record)
        if unexpected is not None:
            raise unexpected
        return record

    @contextlib.contextmanager
    def _claim(self) -> Iterator[None]:
        """Before the job's record exists: its path is a work tree's top
        (``NOT_A_REPOSITORY``), and the repository's write lock, held until the job ends
        (``JOB_ALREADY_RUNNING``, naming the job that holds it)."""
        record = self.record
        if self.request.pin is None:
            locate(Path(record.repo))
        with write_lock(record.repo, holder=record.job_id):
            yield

    def _run_stages(self, lock: contextlib.AbstractContextManager[object]) -> InternalError | None:
        """The stages under ``lock`` (the repository's), the job's sandboxes closed after
        them; a refusal or failure recorded. Returns an unexpected exception, recorded."""
        unexpected: InternalError | None = None
        try:
            with self._heartbeat(), self._cancel_requests(), lock:
                try:
                    self._stages()
                except PatchboxError as exc:
                    self._fail(exc)
                except Exception as exc:  # recorded here, raised by run
                    unexpected = self._internal(exc)
                finally:
                    if self._box is not None:
                        self._box.close()
                        self._box = None
                    if self._prepared is not None:
                        self._prepared.finish()
                    if self._gate is not None:
                        self._gate.shutdown()
                        self._gate = None
        except PatchboxError as exc:  # the lock itself: JOB_ALREADY_RUNNING
            self._fail(exc)
        return unexpected

    def _cancel_requests(
        self, every: float = CANCEL_POLL_SECONDS
    ) -> contextlib.AbstractContextManager[None]:
        """While the job runs: a cancel asked for from another process (a file in the job's
        folder, :meth:`JobStore.request_cancel`) cancels it as :meth:`cancel` does."""
        job_id = self.record.job_id

        def watch() -> bool:
            with contextlib.suppress(OSError, PatchboxError):
                if self.store.cancel_requested(job_id):
                    self.progress("cancelling (requested from another process)")
                    self.cancel()
                    return True
            return False

        return periodically(every, watch, "job-cancel-requests")

    def _internal(self, exc: Exception) -> InternalError:
        """Records an unexpected exception: a crash report, and the job ``failed`` with
        ``INTERNAL_ERROR`` (or ``cancelled``, if it was being cancelled)."""
        error = internal_error(
            exc,
            context=f"job {self.record.job_id}, state {self.record.state}",
            repo=self.record.repo,
            secrets=self.request.secrets,
        )
        if self.record.state in ACTIVE:
            self._fail(error)
        return error

    def _move(self, state: JobState) -> None:
        if self.cancelled.is_set() and state not in {"failed", "cancelled"}:
            raise cancelled_error()
        self.record.move(state)
        self.store.save(self.record)
        self._doing(state.replace("_", " "))
        self.progress(state.replace("_", " "))

    def _fail(self, exc: PatchboxError) -> None:
        cancelled = exc.code is ErrorCode.CANCELLED or self.cancelled.is_set()
        code = ErrorCode.CANCELLED if cancelled else exc.code
        message, hint = exc.message, exc.hint
        if self.cancelled.is_set():  # what the stopped step raised is the cancel's doing
            message, hint = self._cancel_reason, None
        self.record.error = ErrorInfo(code=str(code), message=message, hint=hint)
        self.failure = exc
        reasons = getattr(exc, "reasons", None)
        if reasons:
            self.record.diagnostics["reasons"] = [
                r.model_dump() if hasattr(r, "model_dump") else str(r) for r in reasons
            ]
        if self.record.state not in {"failed", "cancelled"}:
            self.record.move("cancelled" if cancelled else "failed")
        self.store.save(self.record)

    def _stages(self) -> None:
        request, record = self.request, self.record
        task = request.task
        self._move("preparing")
        if request.pin is not None:
            request.pin.verify()
        checks, environment = job_checks(
            task, request.config, Path(record.repo), trust_repo_config=request.trust_repo_config
        )
        sandboxes = JobSandboxes(self.client, request, record, self.identity, self.progress)
        try:  # the gate holds what was started: removed after the stages, whatever happens
            spec = sandboxes.networked(task, checks, environment, self.cancelled)
        finally:
            self._gate = sandboxes.gate
        image_for = None
        if environment is not None:

            def image_for(baseline: Baseline) -> str:
                nonlocal spec
                built = sandboxes.environment(environment, baseline, self.cancelled)
                record.environment = built
                self.store.save(record)
                spec = spec.model_copy(update={"image": built.tag})
                return built.tag

        config = request.config
        pool = (
            SparePool(
                self.client,
                max_spares=config.spare_sandboxes,
                idle_seconds=config.spare_idle_seconds,
            )
            if config.spare_sandboxes and self._gate is None  # a spare has no network
            else None
        )
        t = time.perf_counter()
        prepared = prepare(
            self.client,
            Path(record.repo),
            spec,
            self.identity,
            mode="include-local-changes" if request.include_local_changes else "require-clean",
            pool=pool,
            image_for=image_for,
            confirm=request.pin.confirm if request.pin is not None else None,
        )
        self._box, self._prepared, baseline = prepared.sandbox, prepared, prepared.baseline
        self._record_prepared(prepared, time.perf_counter() - t)
        if self.cancelled.is_set():
            raise cancelled_error()
        if task.baseline_checks:
            self._baseline_checks(prepared.sandbox, checks, prepared.sandbox.clock)
        self._move("running")
        t = time.perf_counter()
        if isinstance(request.provider, ChecksAware):
            request.provider.use_checks(checks)
        record.final_message = self._tool_loop(prepared.sandbox, checks, task)
        record.timings_ms["loop"] = round((time.perf_counter() - t) * 1000)
        self._move("validating")
        collected = collect(prepared.sandbox, baseline)
        prepared.sandbox.close()
        self._box = None
        changeset = self._validate(baseline, collected, task)
        if changeset is None:
            record.error = ErrorInfo(
                code=str(ErrorCode.NO_CHANGE),
                message="the job made no change: the model ended without changing a file",
            )
            self._move("no_change")
            return
        self._move("checking")
        self._checks(baseline, changeset, checks, spec)
        self._decide(baseline, changeset)

    def _record_prepared(self, prepared: Prepared, seconds: float) -> None:
        record = self.record
        record.baseline = prepared.baseline
        record.timings_ms["prepare"] = round(seconds * 1000)
        if "environment" in prepared.timings_ms:
            record.timings_ms["environment"] = prepared.timings_ms["environment"]
        record.diagnostics["baseline_source"] = prepared.source

    def _tool_loop(
        self, sandbox: DockerSandbox, checks: dict[str, CheckSpec], task: TaskSpec
    ) -> str:
        """The model's calls in ``sandbox``; a check still running when they end is killed."""
        request, record = self.request, self.record
        executor = ToolExecutor(
            sandbox,
            checks=checks,
            allowed_paths=task.allowed_paths,
            extra_protected=tuple(request.config.protected),
            on_output=self.output,
            gate=self._gate,
        )
        loop = ToolLoop(
            provider=request.provider,
            tools=executor,
            limits=task.limits,
            record=record,
            cancelled=self.cancelled,
            save=lambda: self.store.save_turn(record),
            step=self._doing,
            clock=sandbox.clock,
            idle_while_asking=request.caller_driven,
            called=lambda done: self.progress(done.line()),
        )
        try:
            return loop.run()
        finally:
            executor.stop_check()

    def _baseline_checks(
        self, sandbox: Sandbox, checks: dict[str, CheckSpec], clock: WorkClock
    ) -> None:
        """The required checks once on the baseline, in the job's sandbox, before the first
        model turn (:mod:`controller.jobs.baselinechecks`): ``CHECK_CANNOT_RUN`` when one
        cannot start or collect; nothing without a required check."""
        if not any(c.required and not c.mutates for c in checks.values()):
            return
        self.progress("checks before the change")
        t = time.perf_counter()
        clock.pause()  # bounded by the checks' own timeouts, not the wall clock
        try:
            results = run_baseline_checks(
                sandbox,
                checks,
                on_check=lambda cid: self._doing(f"running check {cid} before the change"),
                stop=self.cancelled,
                gate=self._gate,
            )
        finally:
            clock.resume()
        self.record.timings_ms["baseline_checks"] = round((time.perf_counter() - t) * 1000)
        self.record.baseline_checks = results
        self.store.save(self.record)
        if self.cancelled.is_set():
            raise cancelled_error()
        error = cannot_run_error(results)
        if error is not None:
            raise error

    def _validate(
        self, baseline: Baseline, collected: Collected, task: TaskSpec
    ) -> ChangeSet | None:
        """The validated change set, recorded; None when the job made no change."""
        self._diff, prepared = collected.diff, self._prepared
        return record_changeset(
            self.record,
            baseline,
            collected,
            task,
            protected=tuple(self.request.config.protected),
            prepared=prepared.baseline if prepared is not None else None,
        )

    def _checks(
        self,
        baseline: Baseline,
        changeset: ChangeSet,
        checks: dict[str, CheckSpec],
        spec: SandboxSpec,
    ) -> None:
        record, request = self.record, self.request
        if skips_checks(
            record.mode,
            allow_trusted_auto=request.config.allow_trusted_auto,
            consent_trusted_auto=request.consent_trusted_auto,
            apply_denied=self._apply_denied,
        ):
            record.checks = skipped_checks(checks, changeset.diff_sha256)
            return
        if not checks:
            return
        t = time.perf_counter()
        outcomes = run_required_checks(
            self.client,
            baseline=baseline,
            diff=self._diff or "",
            diff_sha256=changeset.diff_sha256,
            checks=checks,
            spec=spec.model_copy(update={"job_id": self.record.job_id}),
            identity=self.identity,
            cache=BaselineCache(),
            stop=self.cancelled,
            on_check=lambda cid: self._doing(f"running check {cid}"),
            gate=self._gate,
        )
        record.timings_ms["checks"] = round((time.perf_counter() - t) * 1000)
        record.checks = outcomes

    def _decide(self, baseline: Baseline, changeset: ChangeSet) -> None:
        """Records :func:`controller.jobs.decision.decide`'s decision, applies the diff when it
        says so, and moves the job to its end state."""
        record, request = self.record, self.request
        auto = record.mode == "auto"  # only auto's gates look at the repository
        decision = decide(
            DecisionInputs.of(
                record,
                allow_auto=request.config.allow_auto,
                allow_trusted_auto=request.config.allow_trusted_auto,
                consent_trusted_auto=request.consent_trusted_auto,
                baseline_unchanged=auto and baseline_unchanged(baseline, changeset),
                apply_denied=self._apply_denied,
            )
        )
        if decision.applied:
            decision = apply_decided(
                baseline,
                self._diff or "",
                decision,
                job_id=record.job_id,
                allowed_paths=request.task.allowed_paths,
                protected=request.config.protected,
                pin=request.pin,
            )
        record.decision = decision
        if decision.failed_checks:
            record.error = check_failed(decision, record.checks)
            self._move("failed")
            return
        self._move("applied" if decision.applied else "awaiting_review")
