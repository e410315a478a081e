"""``patchbox remote``'s words: a service's job view, its events and their exit status as
text. Every string a service sends is its word, not the controller's: the text is shown
through :func:`controller.text.visible` by the caller, and shapes the service should not
send are skipped."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING

from controller.errors import ExitCode, exit_code_for_error
from controller.text import flag_text, visible

if TYPE_CHECKING:
    from controller.client import Event
    from controller.remoteviews import RemoteJob

ENDED_OK = frozenset({"awaiting_review", "applied"})


def write_line(line: str) -> None:
    try:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()
    except OSError:
        pass


def event_texts(event: Event) -> list[str]:
    """An event in words: one line each, a ``check_output`` event one per output line."""
    data = event.data
    lines = data.get("lines")
    if event.type == "check_output" and isinstance(lines, list):
        head = f"check_output {data.get('check_id')}"
        dropped = data.get("dropped")
        out = [f"{head}: ({dropped} lines not kept)"] if dropped else []
        return out + [f"{head}: {line}" for line in lines]
    return [_event_text(event)]


def _event_text(event: Event) -> str:
    data = event.data
    if event.type == "state":
        extra = f" ({data['reason']})" if data.get("reason") else ""
        error = data.get("error")
        if isinstance(error, dict):
            extra += f" {error.get('code')}: {error.get('message')}"
        return f"state {data.get('state')}{extra}"
    if event.type == "tool_call":
        outcome = data.get("verdict") or ("ok" if data.get("ok") else data.get("error_code"))
        return f"tool_call turn {data.get('turn')} {data.get('id')} {data.get('name')}: {outcome}"
    if event.type == "check":
        return f"check {data.get('id')}: {data.get('status')} ({data.get('duration_ms')} ms)"
    return f"{event.type} {json.dumps(data, sort_keys=True)}"


def job_outcome(view: RemoteJob, *, no_change_ok: bool = False) -> int:
    """The exit status of a job that ended, as ``patchbox run``'s (``no_change`` is 0 with
    ``no_change_ok``, as ``run --no-change-ok`` says)."""
    if view.get("status") in ENDED_OK:
        return ExitCode.OK
    if no_change_ok and view.get("status") == "no_change":
        return ExitCode.OK
    error = view.get("error") or {}
    return exit_code_for_error(str(error.get("code", "")) if isinstance(error, dict) else "")


def network_lines(checks: object) -> list[str]:
    """The network section of a job view: each request its checks made through the job's
    proxy (none for a job whose checks declare no ``egress``)."""
    lines: list[str] = []
    for c in checks if isinstance(checks, list) else []:
        requests = c.get("network") if isinstance(c, dict) else None
        if not isinstance(requests, list):
            continue
        if not requests:
            lines.append(f"  check {c.get('id')}: no request")
        for r in requests:
            if not isinstance(r, dict):
                continue
            verdict = "allowed" if r.get("allowed") is True else f"refused ({r.get('reason')})"
            address = f" [{r.get('address')}]" if r.get("address") else ""
            lines.append(
                f"  check {c.get('id')}: {r.get('host')}:{r.get('port')}{address} {verdict}, "
                f"status {r.get('status')}, {r.get('bytes_out')} B out, {r.get('bytes_in')} B in"
            )
    return ["network (through the job's proxy):", *lines] if lines else []


def services_lines(services: object) -> list[str]:
    """The services section of a job view: each service container, and the log's tail of
    one that failed or exited (escaped: it is the service's own text)."""
    lines: list[str] = []
    for s in _dicts(services):
        ready = s.get("ready_seconds")
        when = f"ready in {ready:.1f} s" if isinstance(ready, (int, float)) else "never ready"
        lines.append(
            visible(
                f"  {s.get('name')} ({s.get('sandbox')} sandbox): {s.get('image')}, {when}, "
                f"{s.get('exit')}"
            )
        )
        tail = s.get("log_tail")
        if isinstance(tail, str) and tail.strip():
            shown = tail.rstrip("\n").splitlines()[-20:]
            lines.append(f"  log of service {visible(str(s.get('name')))}:")
            lines += [f"    | {visible(line)}" for line in shown]
    return ["services:", *lines] if lines else []


def summary(view: RemoteJob) -> str:
    lines = [f"job {view.get('job_id')}: {view.get('status')}"]
    error = view.get("error")
    if isinstance(error, dict):
        lines.append(f"error {error.get('code')}: {error.get('message')}")
    bundle = view.get("bundle")
    if isinstance(bundle, dict):
        lines.append(f"  on bundle {bundle.get('id')} (HEAD {bundle.get('head')})")
    lines += [
        f"  {f.get('change', ''):<7} {f.get('path')} (+{f.get('added')} -{f.get('removed')})"
        for f in view.get("files") or []
    ]
    flags = view.get("control_characters")
    lines += flag_text(f for f in flags if isinstance(f, dict)) if isinstance(flags, list) else []
    lines += [
        f"  check {c.get('id')} before the change: {c.get('status')} "
        f"(exit {c.get('exit_code')}, {c.get('duration_ms')} ms)"
        + (f": {c.get('reason')}" if c.get("reason") else "")
        for c in _dicts(view.get("baseline_checks"))
    ]
    lines += [
        f"  check {c.get('id')}: {c.get('status')} "
        f"(exit {c.get('exit_code')}, {c.get('duration_ms')} ms)"
        for c in view.get("checks") or []
    ]
    lines += _table_lines(view.get("decision"))
    lines += network_lines(view.get("checks"))
    lines += services_lines(view.get("services"))
    lines += [
        f"  turn {t.get('turn')} {t.get('id')} {t.get('name')}: {t.get('error_code')}"
        for t in view.get("tool_calls") or []
        if not t.get("ok")
    ]
    decision = view.get("decision")
    if isinstance(decision, dict) and decision.get("reason") and view.get("status") in ENDED_OK:
        lines.append(f"decision: {decision.get('reason')}")
    if view.get("status") == "awaiting_review":
        job = view.get("job_id")
        lines.append(f"review: patchbox remote show {job} --diff; then patchbox remote apply {job}")
    return "\n".join(lines)


def _dicts(value: object) -> list[dict[str, object]]:
    """The objects of a list the service sent (anything else in it skipped)."""
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _table_lines(decision: object) -> list[str]:
    """The before/after table of the required checks, as ``show`` prints it."""
    from controller.jobs.summary import CHANGE_WORDS

    rows = _dicts(decision.get("check_changes")) if isinstance(decision, dict) else []
    if not rows:
        return []
    return ["checks before -> after the change:"] + [
        f"  {r.get('id')}: {CHANGE_WORDS.get(str(r.get('change')), str(r.get('change')))} "
        f"({r.get('before')} -> {r.get('after')})"
        for r in rows
    ]
