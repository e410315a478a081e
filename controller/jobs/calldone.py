"""A tool call that ended, as the loop recorded it (:class:`CallDone`): what it named and
how it ended, for a progress line (``turn 3 run_check tests: failed (exit 1)``)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from controller.text import strip_control

if TYPE_CHECKING:
    from controller.providers.base import ToolCall

SUBJECT_CHARS = 80
"""Characters of a call's subject (a path, a check id, a query) in its progress line."""


@dataclass(frozen=True)
class CallDone:
    """One tool call that ended, as the loop recorded it: what it named and how it ended
    (a check's own verdict and exit code from its result), for a progress line."""

    turn: int
    name: str
    subject: str
    """The path, check id, query or glob the call named; the files a patch wrote; or ''."""
    ok: bool
    error_code: str | None = None
    check_status: str | None = None
    """A check run's ``passed``, ``failed`` or ``timed_out``."""
    exit_code: int | None = None
    reused: bool = False

    @classmethod
    def of(
        cls, turn: int, call: ToolCall, result: Mapping[str, Any] | None, error_code: str | None
    ) -> CallDone:
        """The call's event from its arguments and its result (None: it raised)."""
        status = (result or {}).get("status") if call.name == "run_check" else None
        exit_code = (result or {}).get("exitCode")
        return cls(
            turn=turn,
            name=strip_control(call.name),
            subject=_subject(call, result),
            ok=error_code is None,
            error_code=error_code,
            check_status=status if isinstance(status, str) else None,
            exit_code=exit_code if isinstance(exit_code, int) and status is not None else None,
            reused=bool((result or {}).get("reused")) and status is not None,
        )

    def line(self) -> str:
        """``turn 3 run_check tests: failed (exit 1)``, ``turn 1 read_file src/x.py``."""
        head = " ".join(p for p in (f"turn {self.turn}", self.name, self.subject) if p)
        if self.error_code == "CANCELLED":
            return f"{head}: cancelled"
        if not self.ok:
            return f"{head}: error {self.error_code}"
        if self.check_status is None:
            return head
        notes = [f"exit {self.exit_code}"] if self.exit_code is not None else []
        notes += ["reused"] if self.reused else []
        verdict = self.check_status.replace("_", " ")
        return f"{head}: {verdict}" + (f" ({', '.join(notes)})" if notes else "")


def _subject(call: ToolCall, result: Mapping[str, Any] | None) -> str:
    """What a call named, in one short line (untrusted: controls removed, bounded)."""
    keys = {
        "read_file": ("path",),
        "replace_text": ("path",),
        "run_check": ("checkId",),
        "search_text": ("query",),
        "list_files": ("glob",),
    }.get(call.name, ())
    args: object = {}
    if keys:  # a patch's arguments (the patch) are not read again
        try:
            args = json.loads(call.arguments)
        except (ValueError, RecursionError):
            args = {}
    if not isinstance(args, dict):
        args = {}
    words = [str(args[k]) for k in keys if isinstance(args.get(k), str)]
    if call.name == "search_text" and words:
        words = [json.dumps(words[0][:SUBJECT_CHARS], ensure_ascii=False)]
    if call.name == "apply_patch" and result is not None:
        files = result.get("files")
        paths = [str(f.get("path")) for f in files or [] if isinstance(f, dict)]
        words = [", ".join(paths[:3]) + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")]
    text = " ".join(w for w in words if w).replace("\n", " ")
    text = strip_control(text)
    return text if len(text) <= SUBJECT_CHARS else text[: SUBJECT_CHARS - 3] + "..."
