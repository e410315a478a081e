"""What happens to a job's validated diff: a person reviews it, or it is applied by itself.

Pure: :func:`decide` takes what the job found (:class:`DecisionInputs`) and returns the
:class:`Decision` to record; it reads nothing and applies nothing. ``review`` always waits for
a person. ``auto`` applies only when every gate holds (the operator enabled it, the required
checks passed, no file is deleted, no dependency or configuration path is touched, no added
line holds a control, format or bidi character, the repository is as the baseline saw it);
otherwise it falls back to review, naming the gates
that failed. ``trusted-auto`` applies without running the project's checks, and only with
both the operator's enablement and the job's consent; otherwise it falls back to review.
Neither applies for a requester that may not apply the job at all (``apply_denied``: a
service tenant without ``allow_apply``, a job on an uploaded bundle): both stop for review,
saying why.

When the required checks ran on the baseline too (``baseline``), each is compared before and
after (:func:`controller.jobs.baselinechecks.check_changes`). Every required check that
does not pass after the change fails the job (``failed_checks``), whatever it did before:
the table says which of them failed before too (``still_failing``) and which the change
broke, so a reviewer sees what the change is answerable for. Auto applies only when every
required check passes after the change.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from controller.jobs.baselinechecks import check_changes
from controller.jobs.records import BaselineCheck, CheckResult, Decision, FileChange, JobRecord
from controller.tools.policy import write_denial


class DecisionInputs(BaseModel):
    """Everything :func:`decide` looks at."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    mode: str
    """The task's mode: ``review``, ``auto`` or ``trusted-auto``."""
    allow_auto: bool
    """The operator's ``allow_auto``."""
    allow_trusted_auto: bool
    """The operator's ``allow_trusted_auto``."""
    consent_trusted_auto: bool
    """The caller's consent to trusted-auto mode."""
    checks: list[CheckResult]
    """The checks as run (or skipped) in the check sandbox."""
    files: list[FileChange]
    """The validated diff's files."""
    baseline_unchanged: bool
    """Whether the repository still is as the baseline saw it (auto's last gate)."""
    apply_denied: str | None = None
    """Why whoever asked for the job may not apply it (a service tenant without
    ``allow_apply``, a job on an uploaded bundle); None when it may."""
    control_lines: int = 0
    """The diff's added lines flagged for control, format or bidi characters (no person
    reads a diff auto applies: such a line waits for one)."""
    baseline: list[BaselineCheck] = []
    """The required checks as run on the baseline before the model's first turn (empty when
    they were not)."""

    @classmethod
    def of(  # noqa: PLR0913 - the record, then keyword-only settings
        cls,
        record: JobRecord,
        *,
        allow_auto: bool,
        allow_trusted_auto: bool,
        consent_trusted_auto: bool,
        baseline_unchanged: bool,
        apply_denied: str | None,
    ) -> DecisionInputs:
        """The inputs of ``record``'s decision (its mode, checks, files, flagged lines and
        checks before the change) with the operator's and the caller's settings."""
        return cls(
            mode=record.mode,
            allow_auto=allow_auto,
            allow_trusted_auto=allow_trusted_auto,
            consent_trusted_auto=consent_trusted_auto,
            checks=record.checks,
            files=record.files,
            baseline_unchanged=baseline_unchanged,
            apply_denied=apply_denied,
            control_lines=len(record.control_characters),
            baseline=record.baseline_checks,
        )


def skips_checks(
    mode: str,
    *,
    allow_trusted_auto: bool,
    consent_trusted_auto: bool,
    apply_denied: str | None = None,
) -> bool:
    """Whether the project's checks are skipped: trusted-auto, enabled and consented to, for
    a requester that may apply (else the checks run and the job stops for review)."""
    return (
        mode == "trusted-auto"
        and allow_trusted_auto
        and consent_trusted_auto
        and apply_denied is None
    )


def decide(inputs: DecisionInputs) -> Decision:
    """The decision about the diff. ``applied`` true means the rules say apply: the caller
    applies, and records :func:`with_conflict` when that fails. ``failed_checks`` names the
    required checks that did not pass (the job then fails ``CHECK_FAILED``); ``still_failing``
    names those of them that failed on the baseline too."""
    mode = inputs.mode
    skipped = skips_checks(
        mode,
        allow_trusted_auto=inputs.allow_trusted_auto,
        consent_trusted_auto=inputs.consent_trusted_auto,
        apply_denied=inputs.apply_denied,
    )
    table = [] if skipped else check_changes(inputs.baseline, inputs.checks)
    still = [row.id for row in table if row.change == "still_failing"]
    failed = [
        c.id for c in inputs.checks if c.required and c.status != "passed" and not skipped
    ] or None
    still_failing, changes = still or None, table or None
    if mode == "review":
        reason = "review: a person applies or discards"
        return Decision(
            mode=mode,
            reason=reason,
            failed_checks=failed,
            still_failing=still_failing,
            check_changes=changes,
        )
    if mode == "auto":
        passed = not failed and not still and bool(inputs.checks)
        gates = auto_gates(inputs, checks_passed=passed)
        failing = [name for name, ok in gates.items() if not ok]
        if failing:
            hints = GATE_HINTS | {"apply_permitted": inputs.apply_denied or ""}
            reason = "auto fell back to review: " + ", ".join(
                f"{name} ({hints[name]})" for name in failing
            )
            return Decision(
                mode=mode,
                gates=gates,
                reason=reason,
                failed_checks=failed,
                still_failing=still_failing,
                check_changes=changes,
            )
        return Decision(
            mode=mode,
            applied=True,
            gates=gates,
            reason="auto: every gate holds",
            check_changes=changes,
        )
    if skipped:
        return Decision(
            mode=mode,
            applied=True,
            checks="skipped (trusted-auto): no claim that checks passed",
            reason="trusted-auto with operator enablement and consent",
        )
    if inputs.apply_denied is not None:
        why = inputs.apply_denied
    elif not inputs.allow_trusted_auto:
        why = "not enabled by the operator (allow_trusted_auto = false in the host configuration)"
    else:
        why = "no consent to it (consent_trusted_auto is not set)"
    return Decision(
        mode=mode,
        reason="trusted-auto fell back to review: " + why,
        failed_checks=failed,
        still_failing=still_failing,
        check_changes=changes,
    )


def auto_gates(inputs: DecisionInputs, *, checks_passed: bool) -> dict[str, bool]:
    """Auto's gates by name, in the order they are reported; each true when it holds."""
    files = inputs.files
    paths = [f.path for f in files] + [f.old_path for f in files if f.old_path]
    return {
        "operator_enabled": inputs.allow_auto,
        "apply_permitted": inputs.apply_denied is None,
        "checks_passed": checks_passed,
        "no_deleted_file": all(f.kind != "delete" for f in files),
        # the write policy's list: manifests, lock files, git and CI config, hooks
        "no_dependency_or_config_path": all(write_denial(p, None, ()) is None for p in paths),
        "no_control_characters": inputs.control_lines == 0,
        "baseline_unchanged": inputs.baseline_unchanged,
    }


GATE_HINTS = {
    "operator_enabled": "allow_auto = false in the host configuration",
    "apply_permitted": "the requester may not apply the job",
    "checks_passed": "a required check did not pass, or there is none",
    "no_deleted_file": "the diff deletes a file",
    "no_dependency_or_config_path": "the diff touches a manifest, lock file or config",
    "no_control_characters": "an added line holds control, format or bidi characters",
    "baseline_unchanged": "a file the diff touches changed since the baseline",
}
"""What a failing auto gate means, in the user's words (the switch that blocks it); for
``apply_permitted`` the reason says why (the input's ``apply_denied``)."""


def with_conflict(decision: Decision, message: str) -> Decision:
    """``decision`` after its apply failed on a conflict: not applied, and why."""
    return decision.model_copy(update={"applied": False, "apply_conflict": message})
