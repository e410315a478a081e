"""A job in plain text, as people read it: its summary (for a failed job, why) and its
conversation with the model."""

from __future__ import annotations

from controller.jobs.records import JobRecord
from controller.text import flag_text, visible

FAILED_STATES = frozenset({"failed", "cancelled", "no_change"})
"""States whose account says why: the failing checks' output and the refused tool calls."""
TAIL_LINES = 20


def summary_text(record: JobRecord) -> str:
    """The plain-text account of a job; for a failed one, why: its error, the failing
    checks' last output lines and every refused tool call with its code and message."""
    lines = [f"job {record.job_id}: {record.state}", *_lineage(record)]
    if record.error:
        lines.append(f"error {record.error.code}: {record.error.message}")
    for f in record.files:
        calls = ", ".join(f.calls) or "-"
        lines.append(f"  {f.kind:<7} {f.path} (+{f.added} -{f.removed}) by call(s) {calls}")
    lines += flag_text(c.model_dump() for c in record.control_characters)
    lines += [
        f"  check {c.id} before the change: {c.status} (exit {c.exit_code}, {c.duration_ms} ms)"
        + (f": {c.reason}" if c.reason else "")
        for c in record.baseline_checks
    ]
    lines += [
        f"  check {c.id}: {c.status} (exit {c.exit_code}, {c.duration_ms} ms)"
        for c in record.checks
    ]
    lines += table_text(record)
    lines += network_text(record)
    lines += services_text(record)
    if record.state in FAILED_STATES:
        lines += _cannot_run_output(record)
        for c in record.checks:
            if c.status in {"failed", "timed_out"} and c.output_tail.strip():
                tail = c.output_tail.rstrip("\n").splitlines()[-TAIL_LINES:]
                lines.append(f"output of check {c.id} (last {len(tail)} lines):")
                lines += [f"  | {line}" for line in tail]
        refused = [t for t in record.tool_calls if not t.ok]
        if refused:
            lines.append("failed tool calls:")
            for t in refused:
                message = f": {t.error_message}" if t.error_message else ""
                lines.append(f"  turn {t.turn} {t.id} {t.name}: {t.error_code}{message}")
    elif record.decision is not None and record.decision.reason:
        lines.append(f"decision: {record.decision.reason}")
    return "\n".join(lines)


def _lineage(record: JobRecord) -> list[str]:
    """The job it was rebased from or follows up, and the job that made it stale."""
    lines = []
    parent, stale = record.parent, record.stale
    if parent is not None:
        verb = "follows up" if parent.relation == "follow-up" else "rebased from"
        lines.append(f"{verb} job {parent.job_id}")
    if stale is not None and stale.reason == "followed_up":
        lines.append(f"superseded: its change was applied with its follow-up, job {stale.by}")
    elif stale is not None:
        lines.append(
            f"stale: rebased as job {stale.by}; this job's decision and checks no "
            "longer hold, and it is not applied"
        )
    return lines


def _setup_lines(record: JobRecord) -> list[str]:
    """What the environment's setup reached through its proxy (built by this job)."""
    requests = record.environment.network if record.environment is not None else []
    return [
        f"  environment setup: {r.host}:{r.port} "
        + ("allowed" if r.allowed else f"refused ({r.reason})")
        + f", status {r.status}, {r.bytes_out} B out, {r.bytes_in} B in"
        for r in requests
    ]


def network_text(record: JobRecord) -> list[str]:
    """The network section: every request the environment's setup (when this job built it)
    and each check made through a proxy (empty when nothing declared ``egress``)."""
    runs = [("before the change", c.id, c.network) for c in record.baseline_checks]
    runs += [("", c.id, c.network) for c in record.checks]
    shown = [(when, cid, requests) for when, cid, requests in runs if requests is not None]
    setup = _setup_lines(record)
    if not shown and not setup:
        return []
    lines = ["network (through the job's proxy):", *setup]
    for when, cid, requests in shown:
        label = f"check {cid}" + (f" {when}" if when else "")
        if not requests:
            lines.append(f"  {label}: no request")
        for r in requests or []:
            verdict = "allowed" if r.allowed else f"refused ({r.reason})"
            address = f" [{r.address}]" if r.address else ""
            lines.append(
                f"  {label}: {r.host}:{r.port}{address} {verdict}, status {r.status}, "
                f"{r.bytes_out} B out, {r.bytes_in} B in, {r.end - r.start:.2f} s"
            )
    return lines


def services_text(record: JobRecord) -> list[str]:
    """Each service container of the job: its image, the sandbox it served, its time to
    ready, how it ended, and its log's tail when it failed (empty without services)."""
    if not record.services:
        return []
    lines = ["services:"]
    for s in record.services:
        ready = "never ready" if s.ready_seconds is None else f"ready in {s.ready_seconds:.1f} s"
        lines.append(
            f"  {s.name} ({s.sandbox} sandbox): {s.image} [{s.image_id[:19]}], {ready}, {s.exit}"
        )
        if s.log_tail.strip() and s.exit != "running":
            tail = s.log_tail.rstrip("\n").splitlines()[-TAIL_LINES:]
            lines.append(f"  log of service {s.name} (last {len(tail)} lines):")
            lines += [f"    | {visible(line)}" for line in tail]
    return lines


def _cannot_run_output(record: JobRecord) -> list[str]:
    """The last output lines of each check that could not run on the baseline."""
    lines = []
    for b in record.baseline_checks:
        if b.status == "cannot_run" and b.output_tail.strip():
            tail = b.output_tail.rstrip("\n").splitlines()[-TAIL_LINES:]
            lines.append(f"output of check {b.id} before the change (last {len(tail)} lines):")
            lines += [f"  | {line}" for line in tail]
    return lines


CHANGE_WORDS = {
    "fixed": "fixed",
    "still_failing": "still failing",
    "newly_failing": "newly failing",
    "still_passing": "still passing",
}


def table_text(record: JobRecord) -> list[str]:
    """The before/after table of the required checks (empty without one)."""
    decision = record.decision
    rows = (decision.check_changes or []) if decision is not None else []
    if not rows:
        return []
    lines = ["checks before -> after the change:"]
    lines += [f"  {r.id}: {CHANGE_WORDS[r.change]} ({r.before} -> {r.after})" for r in rows]
    return lines


def transcript_text(record: JobRecord, width: int = 400) -> str:
    """The conversation, readably: each turn's message, cost and calls with their results
    (long texts cut at ``width`` characters; the evidence keeps them whole, bounded)."""

    def cut(text: str) -> str:
        one = text.replace("\n", "\\n")
        return one if len(one) <= width else one[: width - 3] + "..."

    lines: list[str] = []
    for turn in record.transcript:
        cost = ", ".join(f"{k} {v}" for k, v in sorted(turn.usage.items()))
        lines.append(f"turn {turn.turn} (model {turn.model_ms} ms{'; ' + cost if cost else ''})")
        if turn.text:
            lines.append(f"  model: {cut(turn.text)}")
        for c in turn.calls:
            state = c.verdict or ("ok" if c.ok else "error")
            lines.append(f"  call {c.id} {c.name} {cut(c.arguments)}")
            lines.append(f"    -> {state} ({c.duration_ms} ms): {cut(c.result)}")
    return "\n".join(lines) or "no transcript (the job made no model turn)"
