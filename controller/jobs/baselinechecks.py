"""The required checks run once on the baseline, in the job's own sandbox, before the model's
first turn: what passed and what failed before the change, and whether a check can run at
all in this sandbox.

Each check runs through the sandbox's ``run`` operation, as the ``run_check`` tool runs a
trusted check (argv, the check's environment, bounded by its ``timeout_seconds``, its
output tail cleaned). A check that merely fails is recorded as failing before; one that
cannot even start or collect (:func:`cannot_run`) stops the job before any model turn with
``CHECK_CANNOT_RUN`` and the remedy of an environment. :func:`check_changes` (pure) is the
before/after table the decision and the evidence show.
"""

from __future__ import annotations

import itertools
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import PurePosixPath
from typing import Literal

from controller.config.task import CheckSpec
from controller.errorinfo import Hint
from controller.errors import CheckChangedFilesError, ErrorCode, PatchboxError
from controller.jobs.records import (
    BaselineCheck,
    CheckChange,
    CheckChangeKind,
    CheckResult,
    requests_of,
)
from controller.sandbox.base import RunResult, Sandbox
from controller.sandbox.netgate import NetworkGate, checked
from controller.text import strip_control

OUTPUT_TAIL = 8192

NOT_FOUND_EXIT = 127
"""A shell's "command not found"."""
NOT_EXECUTABLE_EXIT = 126
"""A shell's "found but cannot be executed"."""
PYTEST_INTERRUPTED = 2
"""pytest was interrupted: among others, by errors during collection."""
PYTEST_USAGE = 4
"""pytest's usage error: a bad option (a plugin not installed), a path not found, an import
error while loading a ``conftest.py``."""

_PYTHON_M_MISSING = re.compile(
    r"^\S*python[0-9.]*: (?:No module named |Error while finding module specification for )"
    r"'?([A-Za-z0-9_.]+)",
    re.MULTILINE,
)
"""What ``python3 -m NAME`` prints, and exits 1 with, when NAME cannot be found."""
_COLLECTION_ERRORS = re.compile(r"\b\d+ errors? during collection\b")
_MISSING_MODULE = re.compile(r"ModuleNotFoundError: No module named '([A-Za-z0-9_.]+)'")


def is_pytest(argv: Sequence[str]) -> bool:
    """Whether ``argv`` runs pytest: ``pytest ...``, ``py.test ...`` or ``python -m pytest``."""
    if not argv:
        return False
    if PurePosixPath(argv[0]).name in {"pytest", "py.test"}:
        return True
    return any(a == "-m" and b == "pytest" for a, b in itertools.pairwise(argv))


def cannot_run(argv: Sequence[str], run: RunResult) -> str | None:
    """Why a check cannot even start or collect in this sandbox, or None when it ran (passing
    or failing). The rule (docs/reference.md, "Checks before the change"):

    - the process could not be started (no such file, not executable);
    - exit 127 or 126 (a shell's command not found, not executable);
    - exit 1 with Python's own ``python3: No module named NAME`` (``python3 -m NAME``);
    - for pytest: exit 4 (usage error: an unknown option, a path not found, an import
      error in a ``conftest.py``), or exit 2 with errors during collection that name a
      missing top-level module (``ModuleNotFoundError: No module named 'yaml'``; a dotted
      name such as ``app.new`` may be the task's to create, so it counts as failing).

    A timeout, any other exit status and a signal are results, not this."""
    if run.spawn_error:
        return f"the command could not be started ({run.spawn_error})"
    if run.timed_out or run.exit_code is None:
        return None
    return _not_started(run.exit_code, run.output) or (
        _not_collected(run.exit_code, run.output) if is_pytest(argv) else None
    )


def _not_started(code: int, output: str) -> str | None:
    if code == NOT_FOUND_EXIT:
        return "the command was not found (exit 127)"
    if code == NOT_EXECUTABLE_EXIT:
        return "the command cannot be executed (exit 126)"
    if code == 1 and (missing := _PYTHON_M_MISSING.search(output)) is not None:
        return f"python has no module {missing.group(1)!r} (exit 1)"
    return None


def _not_collected(code: int, output: str) -> str | None:
    if code == PYTEST_USAGE:
        return "pytest could not start (exit 4: a usage error or an import error in a conftest)"
    if code == PYTEST_INTERRUPTED and _COLLECTION_ERRORS.search(output):
        top = sorted({m for m in _MISSING_MODULE.findall(output) if "." not in m})
        if top:
            return f"pytest could not collect: no module {', '.join(top)} (exit 2)"
    return None


def run_baseline_checks(
    sandbox: Sandbox,
    checks: Mapping[str, CheckSpec],
    *,
    on_check: Callable[[str], None] | None = None,
    stop: threading.Event | None = None,
    gate: NetworkGate | None = None,
) -> list[BaselineCheck]:
    """Runs each required check that may not change files (``mutates`` false) once in
    ``sandbox``, in order. Raises ``CHECK_FAILED`` (:class:`CheckChangedFilesError`) when one
    changed a file, as the ``run_check`` tool does."""
    results: list[BaselineCheck] = []
    for check_id, spec in checks.items():
        if not spec.required or spec.mutates:
            continue
        if stop is not None and stop.is_set():
            break
        if on_check is not None:
            on_check(check_id)
        with checked(gate, check_id) as seen:
            run = sandbox.run(
                spec.argv_with(),
                timeout=spec.timeout_seconds,
                env=spec.environment(),
                output_limit=spec.output_limit,
                track_changes=True,
            )
        changes = run.changes
        if changes is not None and changes.count > 0:
            sample = (changes.added + changes.modified + changes.removed)[:10]
            msg = (
                f"check {check_id} changed {changes.count} file(s) on the baseline it was not "
                "declared to change: " + ", ".join(sample)
            )
            raise CheckChangedFilesError(msg)
        result = baseline_result(check_id, spec, run)
        if gate is not None and gate.records():
            result = result.model_copy(update={"network": requests_of(seen)})
        results.append(result)
    return results


def baseline_result(check_id: str, spec: CheckSpec, run: RunResult) -> BaselineCheck:
    """One baseline run as the record keeps it."""
    reason = cannot_run(spec.argv_with(), run)
    status: Literal["passed", "failed", "timed_out", "cannot_run"]
    if reason is not None:
        status = "cannot_run"
    elif run.timed_out:
        status = "timed_out"
    elif run.exit_code == 0:
        status = "passed"
    else:
        status = "failed"
    return BaselineCheck(
        id=check_id,
        status=status,
        exit_code=run.exit_code,
        duration_ms=run.duration_ms,
        output_tail=strip_control(run.output)[-OUTPUT_TAIL:],
        reason=reason,
    )


def cannot_run_error(results: Sequence[BaselineCheck]) -> PatchboxError | None:
    """``CHECK_CANNOT_RUN`` naming each check that could not run, with the remedy of an
    environment; None when every check ran."""
    broken = [r for r in results if r.status == "cannot_run"]
    if not broken:
        return None
    named = "; ".join(f"{r.id}: {r.reason}" for r in broken)
    msg = (
        f"required check(s) cannot run in this sandbox before any change ({named}); "
        "the job stopped before the model's first turn"
    )
    return PatchboxError(
        msg[:1000], code=ErrorCode.CHECK_CANNOT_RUN, hint=Hint(action="use_environment")
    )


def check_changes(
    before: Sequence[BaselineCheck], after: Sequence[CheckResult]
) -> list[CheckChange]:
    """The before/after table: each required check that ran on the baseline and in the check
    sandbox, ``fixed`` (failed before, passes after), ``still_failing``, ``newly_failing``
    (passed before, fails after) or ``still_passing``. A check skipped after (trusted-auto)
    or not run before has no row."""
    was = {b.id: b.status for b in before if b.status != "cannot_run"}
    rows = []
    for check in after:
        if not check.required or check.status == "skipped" or check.id not in was:
            continue
        passed_before, passed_after = was[check.id] == "passed", check.status == "passed"
        kind: CheckChangeKind
        if passed_before:
            kind = "still_passing" if passed_after else "newly_failing"
        else:
            kind = "fixed" if passed_after else "still_failing"
        rows.append(CheckChange(id=check.id, before=was[check.id], after=check.status, change=kind))
    return rows
