"""A job whose change is carried, not made (``patchbox rebase``): a new baseline of the
repository as it is now, and the earlier job's diff carried onto it three-way
(:mod:`controller.changes.carry`; ``REBASE_CONFLICT`` names every file that does not merge,
and nothing is written). No model and no sandbox run for it; the engine then validates the
diff, runs the required checks in a fresh sandbox and decides, as for any job."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from controller.changes.carry import carry
from controller.changes.collect import Collected
from controller.errorinfo import Hint
from controller.errors import ErrorCode, PatchboxError
from controller.jobs.records import JobRecord, JobState
from controller.jobs.request import JobRequest
from controller.repo.baseline import Baseline, Mode, build_baseline


def carried_changes(
    request: JobRequest,
    record: JobRecord,
    image_for: Callable[[Baseline], str] | None,
    move: Callable[[JobState], None],
) -> tuple[Baseline, Collected]:
    """The new baseline (recorded, and the environment's image for it when the task has
    one) and the carried diff; ``move`` moves the job to ``running`` while it is carried."""
    source = request.carry
    assert source is not None  # noqa: S101 - only called for a carried job
    t = time.perf_counter()
    mode: Mode = "include-local-changes" if request.include_local_changes else "require-clean"
    pin = request.pin
    try:
        baseline, _report = build_baseline(Path(record.repo), mode)
    except Exception:
        if pin is not None:
            pin.confirm(None)
        raise
    if pin is not None:
        pin.confirm(baseline.repo)
    record.baseline = baseline
    record.diagnostics["baseline_source"] = "rebase"
    if image_for is not None:
        e = time.perf_counter()
        image_for(baseline)
        record.timings_ms["environment"] = round((time.perf_counter() - e) * 1000)
    record.timings_ms["prepare"] = round((time.perf_counter() - t) * 1000)
    move("running")
    t = time.perf_counter()
    carried = carry(
        source.baseline,
        source.diff,
        baseline,
        allowed_paths=request.task.allowed_paths,
        extra_protected=tuple(request.config.protected),
    )
    record.timings_ms["loop"] = round((time.perf_counter() - t) * 1000)
    record.final_message = source.final_message
    if carried.merged:
        record.diagnostics["merged"] = carried.merged
    return baseline, carried.collected


def stale_error(record: JobRecord, verb: str) -> PatchboxError:
    """Why a stale job is not ``verb`` (applied, rebased again, followed up): ``JOB_REBASED``
    naming the job it was rebased as (the remedy: that job), or ``JOB_SUPERSEDED`` naming
    the follow-up whose apply holds its change."""
    assert record.stale is not None  # noqa: S101 - only called for a stale job
    by = record.stale.by
    if record.stale.reason == "followed_up":
        msg = (
            f"job {record.job_id}'s change was applied with its follow-up, job {by} (a revert "
            f"of job {by} undoes both), so it is not {verb}"
        )
        return PatchboxError(msg, code=ErrorCode.JOB_SUPERSEDED)
    msg = (
        f"job {record.job_id} was rebased as job {by}: its decision and checks are stale "
        f"(they were made on the repository as it was), so it is not {verb}"
    )
    return PatchboxError(
        msg, code=ErrorCode.JOB_REBASED, hint=Hint(action="use_rebased", job_id=by)
    )
