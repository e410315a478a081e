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
from controller.crash import failure_of
from controller.errorinfo import ErrorInfo
from controller.errors import ErrorCode, InternalError, PatchboxError
from controller.jobs.attest import Signer, attest, facts, signer_for
from controller.jobs.baselinechecks import cannot_run_error, run_baseline_checks
from controller.jobs.carried import carried_changes
from controller.jobs.decision import DecisionInputs, decide, skips_checks
from controller.jobs.diffstage import apply_decided, record_changeset
from controller.jobs.evidence import write_evidence
from controller.jobs.loop import CANCELLED_MESSAGE, ToolLoop, cancelled_error
from controller.jobs.periodic import cancel_watch, heartbeat
from controller.jobs.reconcile import baseline_unchanged
from controller.jobs.records import (
    ACTIVE,
    JobRecord,
    JobState,
)
from controller.jobs.request import JobRequest, Refusals, new_record, refused
from controller.jobs.required import check_failed, run_required_checks, skipped_checks
from controller.jobs.sandboxes import JobSandboxes, note_prepared
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
NO_CHANGE_MADE = "the job made no change: the model ended without changing a file"
NO_CHANGE_CARRIED = "nothing to carry: the repository as it is now holds the job's change"
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
        self.progress, self._quiet = progress or (lambda _m: None), progress is None
        self.output = output
        """Told each line of a running check's output as it comes (the live output)."""
        self.cancelled = threading.Event()
        self._cancel_reason, self._cancel_code = CANCELLED_MESSAGE, ErrorCode.CANCELLED
        self._late_denial: str | None = None
        self.failure: PatchboxError | None = None
        """The error the job failed with (its record keeps it as data)."""
        self.record = new_record(request, self.identity)
        self._box: DockerSandbox | None = None
        self._gate: NetworkGate | None = None
        self._signer: Signer | None = None
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

    def cancel(
        self, reason: str = CANCELLED_MESSAGE, code: ErrorCode = ErrorCode.CANCELLED
    ) -> None:
        """Stops the job: the provider request is aborted, the running tool or check is
        killed with its container. The job ends ``cancelled`` (``failed`` for another
        ``code``, such as ``INTERRUPTED``) with its diagnostics, and ``reason`` as its error's
        message (the first cancel's: whatever error the stopped step raised, a closed
        channel or a killed check, is the cancel's doing)."""
        if not self.cancelled.is_set():
            self._cancel_reason, self._cancel_code = reason, code
        self.cancelled.set()
        self.request.provider.cancel()
        box = self._box
        if box is not None:
            box.interrupt()  # the job's own thread closes and removes it

    def _doing(self, what: str) -> None:
        """What the job is doing now (told by the stages, the loop and the checks)."""
        self._activity, self._activity_since = what, time.monotonic()

    def run(self, *, refusals: Refusals = "record") -> JobRecord:
        """Runs the job to its end state.

        An unexpected exception (a bug, an untranslated third-party error) ends the record
        ``failed`` with ``INTERNAL_ERROR`` (one after the decision, in the sandbox's removal,
        keeps the decision), its containers removed and its evidence written, and is raised
        as :class:`InternalError` naming the crash report.

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
            unexpected = self._run_stages(contextlib.nullcontext() if raising else self._lock())
            if raising and unexpected is None and refused(self.failure, record, self.cancelled):
                shutil.rmtree(self.store.folder(record.job_id), ignore_errors=True)
                assert self.failure is not None  # noqa: S101 - refused says so
                raise self.failure
        record.timings_ms["total"] = round((time.perf_counter() - started) * 1000)
        try:
            write_evidence(record, self._diff, self.store, self.request.secrets)
            attest(record, self._diff, self.store, self._signer, self.request.secrets)
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
        if self.request.pin is None:
            locate(Path(self.record.repo))
        with self._lock():
            yield

    def _lock(self) -> contextlib.AbstractContextManager[object]:
        """The repository's write lock; none when the caller holds it (attempts of a task)."""
        if self.request.repo_locked:
            return contextlib.nullcontext()
        return write_lock(self.record.repo, holder=self.record.job_id)

    def _run_stages(self, lock: contextlib.AbstractContextManager[object]) -> InternalError | None:
        """The stages under ``lock`` (the repository's), the job's sandboxes closed after
        them; a refusal or failure recorded. Returns an unexpected exception, recorded."""
        unexpected: InternalError | None = None
        try:
            with (
                self._heartbeat(),
                cancel_watch(CANCEL_POLL_SECONDS, self._cancel_requested, self.cancel),
                lock,
            ):
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
                    if self._gate is not None:
                        self._gate.shutdown()
                        self._gate = None
                    if self._prepared is not None:
                        self._prepared.finish()
        except PatchboxError as exc:  # the lock itself: JOB_ALREADY_RUNNING
            self._fail(exc)
        except Exception as exc:  # the sandbox's removal (a bug), recorded and raised by run
            unexpected = unexpected or self._internal(exc)
        return unexpected

    def _heartbeat(
        self, every: float = HEARTBEAT_SECONDS
    ) -> contextlib.AbstractContextManager[None]:
        """A progress line every ``every`` seconds one step lasts (:func:`heartbeat`)."""

        def activity() -> tuple[str, float]:
            return self._activity or self.record.state.replace("_", " "), self._activity_since

        return heartbeat(every, activity, self.progress)

    def _cancel_requested(self) -> bool:
        with contextlib.suppress(OSError, PatchboxError):
            if self.store.cancel_requested(self.record.job_id):
                self.progress("cancelling (requested from another process)")
                return True
        return False

    def _internal(self, exc: Exception) -> InternalError | None:
        """Records an unexpected exception: a crash report, and the job ``failed`` with
        ``INTERNAL_ERROR`` (or ``cancelled``, if it was being cancelled). A Docker engine's
        error nobody translated fails the job with its own code, no report (returns None)."""
        error = failure_of(
            exc,
            context=f"job {self.record.job_id}, state {self.record.state}",
            repo=self.record.repo,
            secrets=self.request.secrets,
        )
        if self.record.state in ACTIVE:
            self._fail(error)
        return error if isinstance(error, InternalError) else None

    def _move(self, state: JobState) -> None:
        if self.cancelled.is_set() and state not in {"failed", "cancelled"}:
            raise cancelled_error()
        self.record.move(state)
        self.store.save(self.record)
        self._doing(state.replace("_", " "))
        self.progress(state.replace("_", " "))

    def _fail(self, exc: PatchboxError) -> None:
        code, message, hint = exc.code, exc.message, exc.hint
        if self.cancelled.is_set():  # what the stopped step raised is the cancel's doing
            code, message, hint = self._cancel_code, self._cancel_reason, None
        cancelled = code is ErrorCode.CANCELLED
        self.record.error = ErrorInfo(code=str(code), message=message, hint=hint)
        self.failure = exc
        for name in ("reasons", "conflicts"):  # why a change set or a rebase was refused
            found = getattr(exc, name, None)
            if found:
                self.record.diagnostics[name] = [
                    r.model_dump() if hasattr(r, "model_dump") else str(r) for r in found
                ]
        if self.record.state not in {"failed", "cancelled"}:
            self.record.move("cancelled" if cancelled else "failed")
        self.store.save(self.record)

    def _stages(self) -> None:
        request, record = self.request, self.record
        task = request.task
        self._move("preparing")
        self._signer = signer_for(request.config)
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

        if request.carry is not None:
            baseline, collected = carried_changes(request, record, image_for, self._move)
        else:
            baseline, collected = self._made(spec, checks, image_for, sandboxes.spare_pool())
        self._move("validating")
        changeset = self._validate(baseline, collected, task)
        if changeset is None:
            record.error = ErrorInfo(
                code=str(ErrorCode.NO_CHANGE),
                message=NO_CHANGE_CARRIED if request.carry else NO_CHANGE_MADE,
            )
            self._move("no_change")
            return
        image_id = sandboxes.image_id(spec.image)
        record.provenance = facts(record, request.config, checks, collected.tree, image_id)
        self._move("checking")
        self._checks(baseline, changeset, checks, spec)
        self._decide(baseline, changeset)

    def _made(
        self,
        spec: SandboxSpec,
        checks: dict[str, CheckSpec],
        image_for: Callable[[Baseline], str] | None,
        pool: SparePool | None,
    ) -> tuple[Baseline, Collected]:
        """The sandbox on a new baseline, the checks before the change, the model's tool
        loop, and the changes it made (the sandbox closed)."""
        request, record, task = self.request, self.record, self.request.task
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
            made=request.follow.baseline if request.follow is not None else None,
        )
        self._box, self._prepared, baseline = prepared.sandbox, prepared, prepared.baseline
        note_prepared(self.record, prepared, time.perf_counter() - t)
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
        collected = collect(prepared.sandbox, baseline)
        prepared.close_later()  # removed while the job goes on; finish waits for it
        self._box = None
        return baseline, collected

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
            save_later=lambda: self.store.turn_saver(record),
            step=self._doing,
            clock=sandbox.clock,
            idle_while_asking=request.caller_driven,
            called=None if self._quiet else lambda done: self.progress(done.line()),
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
            carried=self.request.carry is not None,
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
