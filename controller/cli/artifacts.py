"""``run --output-dir DIR``: what a CI job publishes, written whatever the job's end.

- ``run.json``: the object ``run --json`` prints;
- ``evidence.json``: the job's evidence bundle (no secret, no host path);
- ``diff.patch``: the diff as a ``git format-patch`` mail (subject from the first line of
  the model's summary, else the task's; author ``patchbox``), so ``git am`` applies it on
  the baseline's HEAD; only when the job made a diff;
- ``junit.xml``: each check's own test cases where it wrote JUnit XML, one case per check
  otherwise, and a failing case for a job that failed outside its checks or made no change
  (a skipped one for no change with ``--no-change-ok``);
- ``transcript.json`` and ``transcript.txt``: the conversation;
- ``provenance.intoto.jsonl``: the job's signed attestations, when it was signed (a key
  exists and the job reached a decision with a diff).

A command that ends before any job (bad usage, no daemon) writes ``junit.xml`` with one
failing case and ``error.json``: never an empty report a CI would show as green.

The folder is never removed, nor any file in it but an earlier run's artifacts (:data:`OWN`);
one patchbox made gets a ``.gitignore`` of ``*`` (:func:`prepare_folder`), so inside the
repository it is no local change to the next job.
"""

from __future__ import annotations

import email.utils
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING

from controller.jobs.log import write_atomic
from controller.jobs.report import failed_command_report, report
from controller.jobs.store import ATTESTATIONS
from controller.logs import Scrubber
from controller.text import HIDDEN

if TYPE_CHECKING:
    from collections.abc import Mapping

    from controller.jobs.records import JobRecord
    from controller.jobs.store import JobStore

AUTHOR = "patchbox <patchbox@localhost>"
SUBJECT_CHARS = 72
BODY_CHARS = 4000


_DECORATION = re.compile(r"^(?:[#>*+-]+\s*|\d{1,3}[.)]\s+)+")
"""Markdown's marks at a line's start: headings, quotes, bullets, numbers."""
_LABEL = re.compile(r"(?i)(?:summary|changes?|done|result)\s*:?")
"""A line that only announces what follows."""


def _plain(line: str, scrub: Scrubber) -> str:
    """One line of untrusted text for a mail: no control, format or bidi character, no
    secret, no host path, no space around it."""
    return HIDDEN.sub("", scrub.text(line)).strip()


def _unmarked(line: str) -> str:
    """``line`` on one line of single spaces, without Markdown's marks around it (for a
    subject)."""
    text = " ".join(line.replace("**", "").split())
    return _DECORATION.sub("", text).strip("*_` ").strip()


def _summary(record: JobRecord, scrub: Scrubber) -> tuple[str, list[str]]:
    """The model's summary (its final message): its first line that says something (a line
    like ``Summary:`` only announces it) without Markdown's marks, and the lines after it;
    ``("", [])`` without one."""
    lines = [_plain(line, scrub) for line in (record.final_message or "").splitlines()]
    lines = [line for line in lines if line]
    while lines:
        first = _unmarked(lines.pop(0))
        if first and not _LABEL.fullmatch(first):
            return first, lines
    return "", []


def _subject(line: str) -> str:
    if len(line) > SUBJECT_CHARS:
        return line[: SUBJECT_CHARS - 3].rstrip() + "..."
    return line


def format_patch(record: JobRecord, diff: str, scrub: Scrubber, version: str) -> str:
    """The diff as one ``git format-patch`` mail. The subject is the first line of the
    model's summary (its final message), else the task's first line; the rest of the
    summary and the task become the message body, indented, so no line of it can pass for
    a patch or a mail separator."""
    prompt = str(record.task.get("prompt") or "")
    task = [line for line in (_plain(line, scrub) for line in prompt.splitlines()) if line]
    subject, body_lines = _summary(record, scrub)
    if subject:
        if task:
            body_lines += ["", "Task:", *task] if body_lines else ["Task:", *task]
    else:
        subject = _unmarked(task[0]) if task else ""
        subject, body_lines = subject or f"patchbox job {record.job_id}", task[1:]
    body = "\n".join(("    " + line) if line else "" for line in body_lines)[:BODY_CHARS]
    commit = (record.baseline.head if record.baseline else "") or "0" * 40
    when = email.utils.formatdate(record.updated_at, localtime=True)
    message = [
        f"From {commit} Mon Sep 17 00:00:00 2001",
        f"From: {AUTHOR}",
        f"Date: {when}",
        f"Subject: [PATCH] {_subject(subject)}",
        "",
    ]
    if body:
        message += [body.rstrip(), ""]
    message += [f"patchbox job {record.job_id}", "---", ""]
    text = "\n".join(message) + diff
    if not text.endswith("\n"):
        text += "\n"
    return text + f"-- \npatchbox {version}\n"


OWN = frozenset(
    {
        ".gitignore",
        "run.json",
        "evidence.json",
        "diff.patch",
        "junit.xml",
        "transcript.json",
        "transcript.txt",
        "error.json",
        ATTESTATIONS,
    }
)
"""The names patchbox writes in an output folder; it removes none but these (an earlier
run's that would pass for this one's), never the folder, never another file."""

IGNORE_ALL = b"# patchbox's output folder (run --output-dir): git, and so patchbox, ignores it\n*\n"


def prepare_folder(folder: Path) -> None:
    """Makes ``folder`` (and its parents), and, when it holds nothing but patchbox's own
    files, a ``.gitignore`` of ``*``: a folder patchbox writes inside the repository is then
    not a local change, to git or to the next job's health check. A ``.gitignore`` that is
    there is never replaced, and a folder holding other files is left as it is."""
    existed = folder.is_dir()
    folder.mkdir(parents=True, exist_ok=True)
    marker = folder / ".gitignore"
    if marker.exists() or marker.is_symlink():
        return
    if existed and any(entry.name not in OWN for entry in folder.iterdir()):
        return
    write_atomic(marker, IGNORE_ALL)


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

    prepare_folder(folder)
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
    signed = store.folder(record.job_id) / ATTESTATIONS
    if signed.is_file():
        write_atomic(folder / ATTESTATIONS, signed.read_bytes())
        written.append(ATTESTATIONS)
    else:
        (folder / ATTESTATIONS).unlink(missing_ok=True)
    return written


def write_failure(folder: Path, code: str, message: str) -> None:
    """The artifacts of a command that ended before any job: a failing JUnit case and the
    error. Best effort: a folder that cannot be written changes nothing of the error."""
    try:
        prepare_folder(folder)
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
