"""``run --output-dir DIR``: what a CI job publishes, written whatever the job's end.

- ``run.json``: the object ``run --json`` prints;
- ``evidence.json``: the job's evidence bundle (no secret, no host path);
- ``diff.patch``: the diff as a ``git format-patch`` mail (subject from the task's first
  line, author ``patchbox``), so ``git am`` applies it on the baseline's HEAD; only when
  the job made a diff;
- ``junit.xml``: each check's own test cases where it wrote JUnit XML, one case per check
  otherwise, and a failing case for a job that failed outside its checks or made no change
  (a skipped one for no change with ``--no-change-ok``);
- ``transcript.json`` and ``transcript.txt``: the conversation.

A command that ends before any job (bad usage, no daemon) writes ``junit.xml`` with one
failing case and ``error.json``: never an empty report a CI would show as green.
"""

from __future__ import annotations

import email.utils
import json
from pathlib import Path
from typing import TYPE_CHECKING

from controller.jobs.log import write_atomic
from controller.jobs.report import failed_command_report, report
from controller.logs import Scrubber

if TYPE_CHECKING:
    from collections.abc import Mapping

    from controller.jobs.records import JobRecord, JobStore

AUTHOR = "patchbox <patchbox@localhost>"
SUBJECT_CHARS = 72
BODY_CHARS = 4000


def format_patch(record: JobRecord, diff: str, scrub: Scrubber, version: str) -> str:
    """The diff as one ``git format-patch`` mail. The task's lines after the first become
    the message body, indented, so no line of it can pass for a patch or a mail separator."""
    prompt = str(record.task.get("prompt") or "")
    lines = [scrub.text(line).strip() for line in prompt.splitlines()]
    lines = [line for line in lines if line] or [f"patchbox job {record.job_id}"]
    subject = " ".join(lines[0].split())
    if len(subject) > SUBJECT_CHARS:
        subject = subject[: SUBJECT_CHARS - 3].rstrip() + "..."
    body = "\n".join("    " + line for line in lines[1:])[:BODY_CHARS]
    commit = (record.baseline.head if record.baseline else "") or "0" * 40
    when = email.utils.formatdate(record.updated_at, localtime=True)
    message = [
        f"From {commit} Mon Sep 17 00:00:00 2001",
        f"From: {AUTHOR}",
        f"Date: {when}",
        f"Subject: [PATCH] {subject}",
        "",
    ]
    if body:
        message += [body, ""]
    message += [f"patchbox job {record.job_id}", "---", ""]
    text = "\n".join(message) + diff
    if not text.endswith("\n"):
        text += "\n"
    return text + f"-- \npatchbox {version}\n"


def write_artifacts(  # noqa: PLR0913 - a finished job's parts, all keyword-only
    folder: Path,
    *,
    record: JobRecord,
    diff: str | None,
    store: JobStore,
    secrets: tuple[str, ...],
    version: str,
    view: Mapping[str, object],
    no_change_ok: bool = False,
) -> list[str]:
    """Writes the artifacts of a finished job into ``folder``; returns their names."""
    from controller.jobs.summary import transcript_text

    folder.mkdir(parents=True, exist_ok=True)
    scrub = Scrubber(record.repo, secrets)
    written = ["run.json"]
    write_atomic(folder / "run.json", json.dumps(view, indent=2, sort_keys=True).encode())
    evidence = store.folder(record.job_id) / "evidence.json"
    data = json.loads(evidence.read_text()) if evidence.is_file() else {}
    write_atomic(folder / "evidence.json", json.dumps(data, indent=2, sort_keys=True).encode())
    written.append("evidence.json")
    target = folder / "diff.patch"
    if diff:
        patch = format_patch(record, diff, scrub, version)
        write_atomic(target, patch.encode("utf-8", "surrogateescape"))
        written.append("diff.patch")
    else:
        target.unlink(missing_ok=True)  # an older run's patch must not pass for this one's
    write_atomic(folder / "junit.xml", report(record, scrub, no_change_ok=no_change_ok))
    written.append("junit.xml")
    transcript = data.get("transcript", [])
    write_atomic(folder / "transcript.json", json.dumps(transcript, indent=2).encode())
    write_atomic(folder / "transcript.txt", (scrub.text(transcript_text(record)) + "\n").encode())
    written += ["transcript.json", "transcript.txt"]
    (folder / "error.json").unlink(missing_ok=True)
    return written


def write_failure(folder: Path, code: str, message: str) -> None:
    """The artifacts of a command that ended before any job: a failing JUnit case and the
    error. Best effort: a folder that cannot be written changes nothing of the error."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        write_atomic(folder / "junit.xml", failed_command_report(code, message))
        error = {"error": {"code": code, "message": message}}
        write_atomic(folder / "error.json", json.dumps(error, indent=2).encode())
        for stale in (
            "run.json",
            "evidence.json",
            "diff.patch",
            "transcript.json",
            "transcript.txt",
        ):
            (folder / stale).unlink(missing_ok=True)
    except OSError:
        return
