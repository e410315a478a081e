"""The job's diff as its evidence keeps it: read and written again byte for byte (a CRLF
file's lines keep their CR), whoever reads it (the api's views, settling an interrupted
apply)."""

from __future__ import annotations

from pathlib import Path

from controller.api.views import job_diff as api_job_diff
from controller.jobs import settle
from controller.jobs.evidence import job_diff
from controller.jobs.records import JobRecord
from controller.jobs.store import JobStore

DIFF = (
    b"diff --git a/w.bat b/w.bat\n--- a/w.bat\n+++ b/w.bat\n@@ -1,2 +1,2 @@\n"
    b" @echo off\r\n-echo one\r\n+echo two\r\n"
)


def test_a_crlf_diff_is_kept_byte_for_byte_when_its_evidence_is_written_again(
    tmp_path: Path,
) -> None:
    store = JobStore(tmp_path / "jobs")
    record = JobRecord(job_id="j1", repo=str(tmp_path), state="awaiting_review")
    store.save(record)
    patch = store.folder("j1") / "diff.patch"
    patch.write_bytes(DIFF)
    assert job_diff(store, "j1") == DIFF.decode()
    assert api_job_diff is job_diff
    settle._evidence(store, record)  # what settling an interrupted apply writes again
    assert patch.read_bytes() == DIFF
    assert job_diff(store, "j2") is None
