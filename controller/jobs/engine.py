"""One job from task to decision: the tool loop, the effect ledger, the diff,
validation, required checks in a fresh sandbox, and the decision.

Every stage writes the job record before it starts, so a later process sees where a job
stopped. A failure never looks like success: the record ends ``failed`` (or ``cancelled``)
with its error code, and the diagnostics gathered so far are kept.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
import structlog

from controller.changes.collect import Collected, baseline_sha256, collect
from controller.changes.validate import ChangeSet, validate_changeset
from controller.config.checks import resolve_checks
from controller.config.host import HostConfig
from controller.config.task import CheckSpec, TaskSpec
from controller.crash import internal_message, write_report
from controller.errors import ErrorCode, InternalError, LimitExceededError, PatchboxError
from controller.jobs.evidence import write_evidence
from controller.jobs.records import ACTIVE, JobRecord, JobState, JobStore, write_lock
from controller.jobs.required import run_required_checks
from controller.providers.base import CancelledError, ModelTurn, Provider, ToolResult
from controller.repo.baseline import Baseline
from controller.sandbox.base import Runtime, SandboxSpec
from controller.sandbox.docker import DockerSandbox
from controller.sandbox.image import ImageBuilder
from controller.sandbox.labels import ControllerIdentity, current_identity, new_job_id
from controller.sandbox.prepare import BaselineCache, Prepared, SparePool, prepare
from controller.tools.executor import ToolExecutor, ToolOutcome

log = structlog.get_logger(__name__)

MAX_RESULT_BYTES = 64 * 1024 * 1024
"""Tool-result bytes sent back to the model over a whole job."""
LOCK_NAMES = frozenset(
    {
        "package-lock.json",
        "yarn.lock",
        "pnpm-lock.yaml",
        "poetry.lock",
        "pipfile.lock",
        "uv.lock",
        "cargo.lock",
        "go.sum",
        "gemfile.lock",
        "composer.lock",
        "requirements.txt",
        "pyproject.toml",
        "package.json",
        "setup.py",
        "setup.cfg",
    }
)


@dataclass
class JobRequest:
    """What the operator asked for; all of it trusted."""

    repo: Path
    task: TaskSpec
    provider: Provider
    config: HostConfig = field(default_factory=HostConfig)
    include_local_changes: bool = False
    trust_repo_config: bool = False
    consent_trusted_auto: bool = False
    runtime: Runtime | None = None
    secrets: tuple[str, ...] = ()
    """Values that must appear nowhere (the provider key): scrubbed from the evidence."""


class Job:
    """Runs one job; :meth:`cancel` may be called from another thread (or a signal)."""

    def __init__(
        self,
        client: docker.DockerClient,
        request: JobRequest,
        *,
        store: JobStore | None = None,
        identity: ControllerIdentity | None = None,
        progress: Callable[[str], None] | None = None,
    ) -> None:
        self.client = client
        self.request = request
        self.store = store or JobStore()
        self.identity = identity or current_identity()
        self.progress = progress or (lambda _m: None)
        self.cancelled = threading.Event()
        self.record = JobRecord(
            job_id=new_job_id(),
            repo=str(request.repo.resolve()),
            task=request.task.model_dump(mode="json"),
            mode=request.task.mode,
            consent={
                "include_local_changes": request.include_local_changes,
                "trust_repo_config": request.trust_repo_config,
                "trusted_auto": request.consent_trusted_auto,
            },
            runtime=request.runtime or request.config.runtime,
            controller=self.identity.token,
            controller_host=self.identity.host,
        )
        self._box: DockerSandbox | None = None
        self._diff: str | None = None
        self._version = 0
        self._prepared: Prepared | None = None

    # -- public ---------------------------------------------------------------------------

    @property
    def diff(self) -> str | None:
        """The job's diff, once collected."""
        return self._diff

    def cancel(self) -> None:
        """Stops the job: the provider request is aborted, the running tool or check is
        killed with its container. The job ends ``cancelled`` with its diagnostics."""
        self.cancelled.set()
        self.request.provider.cancel()
        box = self._box
        if box is not None:
            box.interrupt()  # the job's own thread closes and removes it

    def run(self) -> JobRecord:
        """Runs the job to its end state.

        An unexpected exception (a bug, an untranslated third-party error) ends the record
        ``failed`` with ``INTERNAL_ERROR``, its containers removed and its evidence written,
        and is raised as :class:`InternalError` naming the crash report."""
        record = self.record
        self.store.save(record)
        started = time.perf_counter()
        unexpected: InternalError | None = None
        try:
            with write_lock(record.repo):
                try:
                    self._stages()
                except PatchboxError as exc:
                    self._fail(exc)
                except Exception as exc:  # recorded here, raised below
                    unexpected = self._internal(exc)
                finally:
                    if self._box is not None:
                        self._box.close()
                        self._box = None
                    if self._prepared is not None:
                        self._prepared.finish()
        except PatchboxError as exc:  # the lock itself: JOB_ALREADY_RUNNING
            self._fail(exc)
        record.timings_ms["total"] = round((time.perf_counter() - started) * 1000)
        try:
            write_evidence(record, self._diff, self.store, self.request.secrets)
        except Exception as exc:
            unexpected = unexpected or self._internal(exc)
        self.store.save(record)
        if unexpected is not None:
            raise unexpected
        return record

    def _internal(self, exc: Exception) -> InternalError:
        """Records an unexpected exception: a crash report, and the job ``failed`` with
        ``INTERNAL_ERROR`` (or ``cancelled``, if it was being cancelled)."""
        report = write_report(
            exc,
            context=f"job {self.record.job_id}, state {self.record.state}",
            repo=self.record.repo,
            secrets=self.request.secrets,
        )
        error = InternalError(internal_message(exc, report), report=report)
        error.__cause__ = exc
        if self.record.state in ACTIVE:
            self._fail(error)
        return error

    # -- stages ---------------------------------------------------------------------------

    def _move(self, state: JobState) -> None:
        if self.cancelled.is_set() and state not in {"failed", "cancelled"}:
            raise PatchboxError("the job was cancelled", code=ErrorCode.CANCELLED)
        self.record.move(state)
        self.store.save(self.record)
        self.progress(state.replace("_", " "))

    def _fail(self, exc: PatchboxError) -> None:
        cancelled = exc.code is ErrorCode.CANCELLED or self.cancelled.is_set()
        code = ErrorCode.CANCELLED if cancelled else exc.code
        self.record.error = {"code": str(code), "message": exc.message}
        reasons = getattr(exc, "reasons", None)
        if reasons:
            self.record.diagnostics["reasons"] = [
                r.model_dump() if hasattr(r, "model_dump") else str(r) for r in reasons
            ]
        if self.record.state not in {"failed", "cancelled"}:
            self.record.move("cancelled" if cancelled else "failed")
        self.store.save(self.record)

    def _spec(self, limits_from: TaskSpec) -> SandboxSpec:
        image = ImageBuilder(self.client, self.progress).ensure().tag
        runtime = self.record.runtime
        return SandboxSpec(
            image=image,
            job_id=self.record.job_id,
            runtime="runsc" if runtime == "runsc" else "runc",
            limits=limits_from.limits,
            protected=tuple(self.request.config.protected),
        )

    def _stages(self) -> None:
        request, record = self.request, self.record
        task = request.task
        self._move("preparing")
        checks = resolve_checks(
            task.checks or self.request.config.checks,
            None,
            Path(record.repo),
            trust_repo_config=request.trust_repo_config,
        )
        spec = self._spec(task)
        config = request.config
        pool = (
            SparePool(
                self.client,
                max_spares=config.spare_sandboxes,
                idle_seconds=config.spare_idle_seconds,
            )
            if config.spare_sandboxes
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
        )
        self._box = prepared.sandbox
        self._prepared = prepared
        baseline = prepared.baseline
        record.baseline = baseline.model_dump(mode="json")
        record.timings_ms["prepare"] = round((time.perf_counter() - t) * 1000)
        record.diagnostics["baseline_source"] = prepared.source
        if self.cancelled.is_set():
            raise PatchboxError("the job was cancelled", code=ErrorCode.CANCELLED)
        self._move("running")
        t = time.perf_counter()
        executor = ToolExecutor(
            prepared.sandbox,
            checks=checks,
            allowed_paths=task.allowed_paths,
            extra_protected=tuple(config.protected),
        )
        self._loop(executor, task)
        record.timings_ms["loop"] = round((time.perf_counter() - t) * 1000)
        self._move("validating")
        collected = collect(prepared.sandbox, baseline)
        prepared.sandbox.close()
        self._box = None
        changeset = self._validate(baseline, collected, task)
        self._move("checking")
        self._checks(baseline, changeset, checks, spec)
        self._decide(baseline, changeset)

    def _loop(self, executor: ToolExecutor, task: TaskSpec) -> None:
        provider, record, limits = self.request.provider, self.record, task.limits
        deadline = time.monotonic() + limits.wall_seconds
        results: list[ToolResult] = []
        budget = {"calls": limits.max_tool_calls, "bytes": MAX_RESULT_BYTES}
        for turn in range(1, limits.max_turns + 2):
            if self.cancelled.is_set():
                raise PatchboxError("the job was cancelled", code=ErrorCode.CANCELLED)
            if time.monotonic() > deadline:
                raise LimitExceededError(f"wall-clock limit of {limits.wall_seconds:g} s reached")
            try:
                model_turn: ModelTurn = provider.next_turn(results)
            except CancelledError as exc:
                raise PatchboxError("the job was cancelled", code=ErrorCode.CANCELLED) from exc
            if not model_turn.tool_calls:
                if turn == 1:
                    raise PatchboxError(
                        "the model's first turn has no tool call: it does not use tools",
                        code=ErrorCode.MODEL_TOOL_CALL_UNSUPPORTED,
                    )
                record.final_message = (model_turn.text or "")[:4000]
                return
            if turn > limits.max_turns:
                raise LimitExceededError(f"more than {limits.max_turns} turns")
            results = self._turn(executor, turn, model_turn, budget)
            self.store.save(record)
        raise LimitExceededError(f"more than {limits.max_turns} turns")

    def _turn(
        self, executor: ToolExecutor, turn: int, model_turn: ModelTurn, budget: dict[str, int]
    ) -> list[ToolResult]:
        """Runs one turn's calls in order; the budget counts calls and result bytes down."""
        results = []
        for call in model_turn.tool_calls:
            budget["calls"] -= 1
            if budget["calls"] < 0:
                limit = self.request.task.limits.max_tool_calls
                raise LimitExceededError(f"more than {limit} tool calls")
            outcome = self._call(executor, turn, call.id, call.name, call.arguments)
            content = json.dumps(outcome.for_model(), ensure_ascii=False)
            budget["bytes"] -= len(content.encode())
            if budget["bytes"] < 0:
                raise LimitExceededError("tool results exceed the job's byte limit")
            results.append(ToolResult(call_id=call.id, name=call.name, content=content))
        return results

    def _call(
        self, executor: ToolExecutor, turn: int, call_id: str, name: str, arguments: str
    ) -> ToolOutcome:
        record = self.record
        entry: dict[str, Any] = {"turn": turn, "id": call_id, "name": name}
        try:
            outcome = executor.execute(turn, call_id, name, arguments)
        except PatchboxError as exc:
            code = ErrorCode.CANCELLED if self.cancelled.is_set() else exc.code
            entry |= {"ok": False, "error_code": str(code)}
            record.tool_calls.append(entry)
            if name in {"replace_text", "apply_patch", "run_check"}:
                record.ledger.append(self._ledger(turn, call_id, name, None, "unknown"))
            raise
        entry |= {"ok": outcome.ok, "error_code": (outcome.error or {}).get("code")}
        record.tool_calls.append(entry)
        if outcome.effect != "none" or (name in {"replace_text", "apply_patch"}):
            done = "done" if outcome.ok else "rejected"
            record.ledger.append(self._ledger(turn, call_id, name, outcome, done))
        self._track_version(outcome)
        return outcome

    def _track_version(self, outcome: ToolOutcome) -> None:
        """The workspace version after a call: reported by the agent's tools; a process
        run does not report it and bumps it once."""
        result = outcome.result or {}
        if isinstance(result.get("version"), int):
            self._version = result["version"]
        elif outcome.tool == "run_check" and outcome.ok and not result.get("reused"):
            self._version += 1

    def _ledger(
        self, turn: int, call_id: str, name: str, outcome: ToolOutcome | None, state: str
    ) -> dict[str, Any]:
        """One side-effecting call: intent, version before, files with hashes."""
        result = (outcome.result if outcome is not None else None) or {}
        files: list[dict[str, Any]] = []
        if name == "replace_text" and "path" in result:
            files.append({"path": result["path"], "sha256": result.get("sha256After")})
        elif name == "apply_patch":
            for f in result.get("files", []):
                files.append({"path": f.get("path"), "sha256": f.get("sha256After")})
                if f.get("oldPath"):
                    files.append({"path": f["oldPath"], "sha256": None})
        elif name == "run_check":
            changes = result.get("changes") or {}
            for key in ("added", "modified", "removed"):
                files += [{"path": p, "sha256": None} for p in changes.get(key, [])]
        before = self._version
        intent = {"replace_text": "edit", "apply_patch": "patch", "run_check": "check"}[name]
        return {
            "turn": turn,
            "id": call_id,
            "tool": name,
            "intent": intent,
            "version_before": before,
            "files": files,
            "outcome": state,
        }

    def _validate(self, baseline: Baseline, collected: Collected, task: TaskSpec) -> ChangeSet:
        record = self.record
        self._diff = collected.diff
        record.diff_sha256 = collected.diff_sha256
        self._reconcile(collected)  # first: a reported file hidden from the changes is named
        if not collected.diff:
            raise PatchboxError("the job made no change", code=ErrorCode.CHANGESET_INVALID)
        changeset = validate_changeset(
            baseline,
            collected.diff,
            allowed_paths=task.allowed_paths,
            extra_protected=tuple(self.request.config.protected),
        )
        record.files = [
            {
                "path": f.path,
                "old_path": f.old_path,
                "kind": f.kind,
                "added": f.added,
                "removed": f.removed,
                "sha256_before": f.sha256_before,
                "sha256_after": f.sha256_after,
                "calls": [
                    e["id"]
                    for e in record.ledger
                    if any(x.get("path") == f.path for x in e.get("files", []))
                ],
            }
            for f in changeset.files
        ]
        return changeset

    def _reconcile(self, collected: Collected) -> None:
        """Reconciles the changes with the ledger both ways, against each path's final state
        (:meth:`_final_states`). Fails the job (``CHANGESET_INVALID``, naming the paths) when

        - a changed path is accounted for by no completed call;
        - a changed path is not as its last completed call left it (another hash, or present
          though that call removed it, or removed though it wrote it);
        - a path whose last completed call was an edit is missing from the changes: a file
          the edit wrote must be there with the reported hash, a file it removed must be
          reported removed, unless the baseline already holds exactly that (a later edit
          undid an earlier one). A file hidden from the agent's change detection is caught
          here instead of silently leaving the diff.

        A check's entry names a path without its final content: it settles nothing but
        that the path may have changed. The baseline is the job's own (a job that prepared
        none has nothing to compare with: every unsettled path counts as missing)."""
        final = self._final_states(self.record.ledger)
        changed = {f.path: f for f in collected.files}
        unaccounted = [p for p in changed if p not in final]
        mismatched = []
        for path, f in changed.items():
            state = final.get(path, "")
            if state in {"", "unknown"}:
                continue
            removed = f.kind == "removed"
            if removed != (state == "gone") or (not removed and f.sha256 != state):
                mismatched.append(path)
        unsettled = {p: s for p, s in final.items() if p not in changed and s != "unknown"}
        prepared = self._prepared
        held = (
            baseline_sha256(prepared.baseline, unsettled)
            if prepared is not None
            else dict.fromkeys(unsettled, "")
        )
        missing = sorted(p for p, s in unsettled.items() if held[p] != (None if s == "gone" else s))
        if unaccounted or mismatched or missing:
            diagnostics = self.record.diagnostics
            diagnostics["unaccounted"] = sorted(unaccounted)[:50]
            diagnostics["mismatched"] = sorted(mismatched)[:50]
            diagnostics["missing"] = missing[:50]
            parts = []
            if unaccounted:
                parts.append("changed by no tool call: " + ", ".join(sorted(unaccounted)[:10]))
            if mismatched:
                parts.append(
                    "not as the last tool call left it: " + ", ".join(sorted(mismatched)[:10])
                )
            if missing:
                parts.append(
                    "reported by a tool call but missing from the changes: "
                    + ", ".join(missing[:10])
                )
            msg = "the change set is invalid: " + "; ".join(parts)
            raise PatchboxError(msg[:1000], code=ErrorCode.CHANGESET_INVALID)

    @staticmethod
    def _final_states(ledger: list[dict[str, Any]]) -> dict[str, str]:
        """Each path's state after the last completed call that names it: the SHA-256 an
        edit reported, ``gone`` when a patch removed it (or renamed it away), ``unknown``
        when the entry has no hash otherwise (a check's, which says only what changed)."""
        final: dict[str, str] = {}
        for entry in ledger:
            if entry["outcome"] != "done":
                continue
            patch = entry.get("tool") == "apply_patch"
            for f in entry["files"]:
                sha = f.get("sha256")
                final[f["path"]] = sha or ("gone" if patch else "unknown")
        return final

    def _checks(
        self,
        baseline: Baseline,
        changeset: ChangeSet,
        checks: dict[str, CheckSpec],
        spec: SandboxSpec,
    ) -> None:
        record = self.record
        if record.mode == "trusted-auto" and self._trusted_auto_allowed():
            record.checks = [
                {
                    "id": cid,
                    "status": "skipped",
                    "exit_code": None,
                    "duration_ms": 0,
                    "output_tail": "",
                    "diff_sha256": changeset.diff_sha256,
                    "required": c.required,
                    "reason": "trusted-auto: project checks skipped",
                    "source": "none",
                }
                for cid, c in checks.items()
            ]
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
        )
        record.timings_ms["checks"] = round((time.perf_counter() - t) * 1000)
        record.checks = [o.as_dict() for o in outcomes]

    def _trusted_auto_allowed(self) -> bool:
        return self.request.config.allow_trusted_auto and self.request.consent_trusted_auto

    def _decide(self, baseline: Baseline, changeset: ChangeSet) -> None:
        record = self.record
        mode = record.mode
        skipped = mode == "trusted-auto" and self._trusted_auto_allowed()
        failed_required = [
            c["id"]
            for c in record.checks
            if c["required"] and c["status"] != "passed" and not skipped
        ]
        decision: dict[str, Any] = {"mode": mode, "applied": False, "gates": {}}
        if mode == "review":
            decision["reason"] = "review: a person applies or discards"
        elif mode == "auto":
            gates = self._auto_gates(baseline, changeset, failed_required)
            decision["gates"] = gates
            failing = [name for name, ok in gates.items() if not ok]
            if failing:
                decision["reason"] = "auto fell back to review: " + ", ".join(failing)
            else:
                decision["applied"] = self._apply(baseline, decision)
                decision["reason"] = "auto: every gate holds"
        elif skipped:
            decision["checks"] = "skipped (trusted-auto): no claim that checks passed"
            decision["applied"] = self._apply(baseline, decision)
            decision["reason"] = "trusted-auto with operator enablement and consent"
        else:
            decision["reason"] = "trusted-auto fell back to review: " + (
                "not enabled by the operator"
                if not self.request.config.allow_trusted_auto
                else "no consent flag"
            )
        if failed_required:
            decision["failed_checks"] = failed_required
        # assigned whole: the record validates (and copies) what it is given
        record.decision = decision
        if failed_required:
            self.record.error = {
                "code": str(ErrorCode.CHECK_FAILED),
                "message": "required check(s) did not pass: " + ", ".join(failed_required),
            }
            self._move("failed")
            return
        self._move("applied" if decision["applied"] else "awaiting_review")

    def _auto_gates(
        self, baseline: Baseline, changeset: ChangeSet, failed_required: list[str]
    ) -> dict[str, bool]:
        from controller.tools.policy import write_denial

        paths = [f.path for f in changeset.files] + [
            f.old_path for f in changeset.files if f.old_path
        ]
        return {
            "operator_enabled": self.request.config.allow_auto,
            "checks_passed": not failed_required and bool(self.record.checks),
            "no_deleted_file": all(f.kind != "delete" for f in changeset.files),
            "no_dependency_or_config_path": all(
                Path(p).name.lower() not in LOCK_NAMES and write_denial(p, None, ()) is None
                for p in paths
            ),
            "baseline_unchanged": baseline_unchanged(baseline, changeset),
        }

    def _apply(self, baseline: Baseline, decision: dict[str, Any]) -> bool:
        from controller.changes.apply import ApplyConflictError, apply_changeset

        try:
            apply_changeset(
                baseline,
                self._diff or "",
                job_id=self.record.job_id,
                allowed_paths=self.request.task.allowed_paths,
                extra_protected=tuple(self.request.config.protected),
            )
        except ApplyConflictError as exc:
            decision["apply_conflict"] = exc.message
            return False
        return True


def baseline_unchanged(baseline: Baseline, changeset: ChangeSet) -> bool:
    """Same HEAD, no git operation in progress, and every touched path as in the baseline
    (other paths may differ). A diagnosis only: apply re-checks under its own lock."""
    import hashlib

    from controller.repo.layout import locate, operations_in_progress, resolve_head

    try:
        layout = locate(Path(baseline.repo))
    except PatchboxError:
        return False
    head, _ = resolve_head(layout)
    if head != baseline.head or operations_in_progress(layout):
        return False
    for f in changeset.files:
        for path, want in ((f.old_path or f.path, f.sha256_before),):
            target = layout.top / path
            if want is None:
                if target.exists() or target.is_symlink():
                    return False
                continue
            try:
                if target.is_symlink() or hashlib.sha256(target.read_bytes()).hexdigest() != want:
                    return False
            except OSError:
                return False
    return True
