"""The Python API (controller.api) on real repositories and the real daemon: a session the
caller drives tool by tool, its proposal decided as any job's, apply and revert through the
same calls the CLI makes, idempotent request ids, refusals, and nothing left running. The
example of docs/api.md runs as written."""

from __future__ import annotations

from pathlib import Path

from controller import api
from controller.jobs.store import JobStore


def test_a_stored_diff_is_read_back_byte_for_byte(tmp_path: Path) -> None:
    """A carriage return in a diff (a CR LF file, or a CR the model wrote) stays one: a
    text-mode read turned it into a newline, and apply then refused the diff."""
    store = JobStore(tmp_path)
    (tmp_path / "j1").mkdir()
    raw = b"+crlf line\r\n+a\rb\n+not utf-8 \x9b\n"
    (tmp_path / "j1" / "diff.patch").write_bytes(raw)
    diff = api.job_diff(store, "j1")
    assert diff is not None
    assert diff.encode("utf-8", "surrogateescape") == raw
    assert api.job_diff(store, "j2") is None
