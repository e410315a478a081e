"""The evidence bundle of a job (docs/architecture.md): ``evidence.json``, the ``.patch`` and
a JUnit XML of the checks, written into the job's folder.

Nothing absolute about this machine goes in: the repository is named by its folder name,
every string is scrubbed of the repository's path, ``$PATCHBOX_HOME``, the user's home and
the value of every secret-looking environment variable (and of any extra secret the caller
names, such as the provider key).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from controller.jobs.log import write_atomic
from controller.jobs.records import CheckChange, JobRecord
from controller.jobs.report import report
from controller.jobs.store import JobStore
from controller.logs import Scrubber
from controller.paths import patchbox_home

EVIDENCE_VERSION = 1


BASELINE_KEYS = frozenset(
    {"mode", "head", "tree", "commit", "local_digest", "counts", "submodules"}
)
"""What the evidence says of the baseline: no host path, no timing of this machine."""


def bundle(record: JobRecord, diff: str | None) -> dict[str, Any]:
    """The evidence as JSON data (before scrubbing); the job's parts as the record stores
    them."""
    stored = record.model_dump(mode="json")
    baseline = record.baseline
    return {
        "evidence_version": EVIDENCE_VERSION,
        "job_id": record.job_id,
        "status": record.state,
        "error": stored["error"],
        "inputs": {
            "repository": Path(record.repo).name,
            "task": stored["task"],
            "mode": record.mode,
            "consent": stored["consent"],
            "runtime": record.runtime,
        },
        "baseline": {}
        if baseline is None
        else baseline.model_dump(mode="json", include=set(BASELINE_KEYS)),
        "tool_calls": stored["tool_calls"],
        "transcript": stored.get("transcript", []),
        "ledger": stored["ledger"],
        "diff": {
            "sha256": record.diff_sha256,
            "files": stored["files"],
            "control_characters": [c.model_dump(mode="json") for c in record.control_characters],
            "patch_file": "diff.patch" if diff else None,
        },
        "environment": stored.get("environment"),
        "baseline_checks": stored.get("baseline_checks", []),
        "checks": stored["checks"],
        "services": stored.get("services", []),
        "check_changes": [c.model_dump(mode="json") for c in changes_of(record)],
        "decision": stored["decision"],
        "timings_ms": stored["timings_ms"],
        "history": [{"state": s, "at": t} for s, t in record.history],
        "final_message": record.final_message,
        "diagnostics": stored["diagnostics"],
        "parent": stored.get("parent"),
        "stale": stored.get("stale"),
        "attempt": stored.get("attempt"),
    }


def changes_of(record: JobRecord) -> list[CheckChange]:
    """The before/after table of the job's required checks (its decision's; empty when the
    checks did not run on the baseline or the job was not decided)."""
    decision = record.decision
    return list(decision.check_changes or []) if decision is not None else []


def junit(record: JobRecord, scrub: Scrubber) -> bytes:
    """The job's JUnit XML (:func:`controller.jobs.junit.report`)."""
    return report(record, scrub)


def job_diff(store: JobStore, job_id: str) -> str | None:
    """The diff a job made, as its evidence keeps it, byte for byte (None without one)."""
    path = store.folder(job_id) / "diff.patch"
    try:
        return path.read_bytes().decode("utf-8", "surrogateescape")
    except FileNotFoundError:
        return None


def write_evidence(
    record: JobRecord, diff: str | None, store: JobStore, secrets: Iterable[str] = ()
) -> Path:
    """Writes the bundle, the patch and the JUnit XML; returns the bundle's path. The path
    given to users is relative to ``$PATCHBOX_HOME``."""
    scrub = Scrubber(record.repo, secrets)
    folder = store.folder(record.job_id)
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    data = scrub.value(bundle(record, diff))
    write_atomic(folder / "evidence.json", json.dumps(data, indent=2, sort_keys=True).encode())
    if diff:
        write_atomic(folder / "diff.patch", diff.encode("utf-8", "surrogateescape"))
    write_atomic(folder / "checks.junit.xml", junit(record, scrub))
    return folder / "evidence.json"


def relative_to_home(path: Path) -> str:
    """``path`` relative to ``$PATCHBOX_HOME`` (what ``run --json`` reports)."""
    try:
        return str(path.relative_to(patchbox_home()))
    except ValueError:
        return str(Path("jobs") / path.parent.name / path.name)
