"""The evidence bundle of a job (docs/architecture.md): ``evidence.json``, the ``.patch`` and
a JUnit XML of the checks, written into the job's folder.

Nothing absolute about this machine goes in: the repository is named by its folder name,
every string is scrubbed of the repository's path, ``$PATCHBOX_HOME``, the user's home and
the value of every secret-looking environment variable (and of any extra secret the caller
names, such as the provider key).
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable
from pathlib import Path, PurePosixPath
from typing import Any

from controller.jobs.records import JobRecord, JobStore, write_atomic
from controller.logs import REDACTED, private_roots, secret_values
from controller.paths import patchbox_home
from controller.tools.text import strip_control

EVIDENCE_VERSION = 1


class Scrubber:
    """Makes every string of a JSON-like value safe to show and store: control and bidi
    characters removed (:func:`controller.tools.text.strip_control`), secrets and host paths
    replaced. Keys are scrubbed like values.

    The repository's parents are host paths too (an error may name the work tree a folder
    is inside): each one of two or more components becomes ``<repo>/..``, ``<repo>/../..``
    and so on. A path is replaced only where its name ends (``/a/b`` not in ``/a/bc``)."""

    def __init__(self, repo: str, secrets: Iterable[str] = ()) -> None:
        self.secrets = sorted(
            {s for s in [*secret_values(), *secrets] if s and len(s) >= 6},
            key=len,
            reverse=True,
        )
        roots = _repo_roots(repo) + [(r, "<path>") for r in private_roots()]
        self.roots = [
            (re.compile(re.escape(root) + r"(?![\w-]|\.[\w.-])"), mark)
            for root, mark in sorted(roots, key=lambda item: len(item[0]), reverse=True)
        ]

    def text(self, value: str) -> str:
        """``value`` without control or bidi characters (first, so a control cannot split a
        secret out of reach; :func:`controller.tools.text.strip_control`), secrets or host
        paths."""
        value = strip_control(value)
        for secret in self.secrets:
            value = value.replace(secret, REDACTED)
        for pattern, mark in self.roots:
            value = pattern.sub(mark, value)  # marks hold no backslash
        return value

    def value(self, data: Any) -> Any:
        if isinstance(data, str):
            return self.text(data)
        if isinstance(data, dict):
            return {self.text(str(k)): self.value(v) for k, v in data.items()}
        if isinstance(data, (list, tuple)):
            return [self.value(v) for v in data]
        return data


def _repo_roots(repo: str) -> list[tuple[str, str]]:
    path = PurePosixPath(repo)
    if len(path.parts) < 2 or not path.is_absolute():
        return []
    roots = [(repo.rstrip("/"), "<repo>")]
    mark = "<repo>"
    for parent in path.parents:
        mark += "/.."
        if len(parent.parts) < 3:  # "/" and "/tmp" name nobody
            break
        roots.append((str(parent), mark))
    return roots


def bundle(record: JobRecord, diff: str | None) -> dict[str, Any]:
    """The evidence as data (before scrubbing)."""
    baseline = record.baseline or {}
    return {
        "evidence_version": EVIDENCE_VERSION,
        "job_id": record.job_id,
        "status": record.state,
        "error": record.error,
        "inputs": {
            "repository": Path(record.repo).name,
            "task": record.task,
            "mode": record.mode,
            "consent": record.consent,
            "runtime": record.runtime,
        },
        "baseline": {
            k: baseline.get(k)
            for k in ("mode", "head", "tree", "commit", "local_digest", "counts", "submodules")
            if k in baseline
        },
        "tool_calls": record.tool_calls,
        "ledger": record.ledger,
        "diff": {
            "sha256": record.diff_sha256,
            "files": record.files,
            "patch_file": "diff.patch" if diff else None,
        },
        "checks": record.checks,
        "decision": record.decision,
        "timings_ms": record.timings_ms,
        "history": [{"state": s, "at": t} for s, t in record.history],
        "final_message": record.final_message,
        "diagnostics": record.diagnostics,
    }


def junit(record: JobRecord, scrub: Scrubber) -> bytes:
    suite = ET.Element(
        "testsuite",
        name="patchbox",
        tests=str(len(record.checks)),
        failures=str(sum(c.get("status") in {"failed", "timed_out"} for c in record.checks)),
        skipped=str(sum(c.get("status") == "skipped" for c in record.checks)),
    )
    for check in record.checks:
        case = ET.SubElement(
            suite,
            "testcase",
            classname=f"patchbox.{record.job_id}",
            name=scrub.text(str(check.get("id"))),
            time=f"{(check.get('duration_ms') or 0) / 1000:.3f}",
        )
        status = check.get("status")
        if status in {"failed", "timed_out"}:
            failure = ET.SubElement(
                case, "failure", message=f"{status} (exit {check.get('exit_code')})"
            )
            failure.text = scrub.text(str(check.get("output_tail") or ""))
        elif status == "skipped":
            reason = scrub.text(str(check.get("reason") or "skipped"))
            ET.SubElement(case, "skipped", message=reason)
        out = ET.SubElement(case, "system-out")
        out.text = scrub.text(str(check.get("output_tail") or ""))
    data: bytes = ET.tostring(suite, encoding="utf-8", xml_declaration=True)
    return data


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
