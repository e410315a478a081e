"""The changes a job made, held to its effect ledger: every changed path accounted for by a
completed tool call and as that call left it, every path a call wrote present in the
changes (:func:`reconcile`); and whether the work tree still holds what an ``auto`` apply
expects (:func:`baseline_unchanged`)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING

from controller.changes.collect import Collected, baseline_sha256
from controller.errors import ErrorCode, PatchboxError
from controller.repo.layout import locate, operations_in_progress

if TYPE_CHECKING:
    from controller.changes.changeset import ChangeSet
    from controller.jobs.records import JobRecord, LedgerEntry
    from controller.repo.baseline import Baseline


def reconcile(
    collected: Collected,
    record: JobRecord,
    baseline: Baseline | None,
) -> None:
    """Reconciles the changes with the ledger both ways, against each path's final state
    (:func:`final_states`). Fails the job (``CHANGESET_INVALID``, naming the paths) when

    - a changed path is accounted for by no completed call;
    - a changed path is not as its last completed call left it (another hash, or present
      though that call removed it, or removed though it wrote it);
    - a path whose last completed call was an edit is missing from the changes: a file
      the edit wrote must be there with the reported hash, a file it removed must be
      reported removed, unless the baseline already holds exactly that (a later edit
      undid an earlier one). A file hidden from the agent's change detection is caught
      here instead of silently leaving the diff.

    A check's entry names a path without its final content: it settles nothing but
    that the path may have changed. ``baseline`` is the job's own (a job that prepared
    none has nothing to compare with: every unsettled path counts as missing). What is wrong
    is written to the record's ``diagnostics``."""
    final = final_states(record.ledger)
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
    held = (
        baseline_sha256(baseline, unsettled)
        if baseline is not None
        else dict.fromkeys(unsettled, "")
    )
    missing = sorted(p for p, s in unsettled.items() if held[p] != (None if s == "gone" else s))
    if unaccounted or mismatched or missing:
        diagnostics = record.diagnostics
        diagnostics["unaccounted"] = sorted(unaccounted)[:50]
        diagnostics["mismatched"] = sorted(mismatched)[:50]
        diagnostics["missing"] = missing[:50]
        parts = []
        if unaccounted:
            parts.append("changed by no tool call: " + ", ".join(sorted(unaccounted)[:10]))
        if mismatched:
            parts.append("not as the last tool call left it: " + ", ".join(sorted(mismatched)[:10]))
        if missing:
            parts.append(
                "reported by a tool call but missing from the changes: " + ", ".join(missing[:10])
            )
        msg = "the change set is invalid: " + "; ".join(parts)
        raise PatchboxError(msg[:1000], code=ErrorCode.CHANGESET_INVALID)


def final_states(ledger: list[LedgerEntry]) -> dict[str, str]:
    """Each path's state after the last completed call that names it: the SHA-256 an
    edit reported, ``gone`` when a patch removed it (or renamed it away), ``unknown``
    when the entry has no hash otherwise (a check's, which says only what changed)."""
    final: dict[str, str] = {}
    for entry in ledger:
        if entry.outcome != "done":
            continue
        patch = entry.tool == "apply_patch"
        for f in entry.files:
            final[f.path] = f.sha256 or ("gone" if patch else "unknown")
    return final


def baseline_unchanged(baseline: Baseline, changeset: ChangeSet) -> bool:
    """No git operation in progress, and every touched path as in the baseline (other paths
    and HEAD may differ, as apply allows). A diagnosis only: apply re-checks under its own
    lock."""
    try:
        layout = locate(Path(baseline.repo))
    except PatchboxError:
        return False
    if operations_in_progress(layout):
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
