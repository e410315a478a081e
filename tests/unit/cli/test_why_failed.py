"""Why a job failed, in plain text, and the whole conversation: ``run`` and ``show`` name the
error, the failing check's last output lines and every refused tool call with its code and
message (never a decision for a failed job); ``show --transcript`` prints each turn's
message, calls, arguments and results, which the evidence keeps too. Through the CLI, on a
real repository and the real daemon."""

from __future__ import annotations

from controller.jobs.records import JobRecord, TranscriptCall, TranscriptTurn
from controller.jobs.summary import summary_text, transcript_text


def test_transcript_text_cuts_long_values_and_keeps_lines_single() -> None:
    record = JobRecord(job_id="j", repo="/r")
    record.transcript.append(
        TranscriptTurn(
            turn=1,
            text="a\nb",
            usage={"input_tokens": 5, "output_tokens": 2},
            model_ms=3,
            calls=[
                TranscriptCall(id="c", name="read_file", arguments="{}", ok=True, result="x" * 1000)
            ],
        )
    )
    text = transcript_text(record, width=50)
    assert "turn 1 (model 3 ms; input_tokens 5, output_tokens 2)" in text
    assert "model: a\\nb" in text
    assert "x" * 47 + "..." in text
    assert "x" * 48 not in text
    empty = JobRecord(job_id="k", repo="/r")
    assert transcript_text(empty) == "no transcript (the job made no model turn)"
    assert summary_text(empty) == "job k: created"
