"""The tool loop (:class:`controller.jobs.loop.ToolLoop`) with the scripted provider and fake
tools: what it records, and its exits. No Docker."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest

from controller.config.limits import Limits
from controller.errors import ErrorCode, PatchboxError
from controller.jobs.loop import ToolLoop
from controller.jobs.records import JobRecord
from controller.providers import ScriptedProvider, parse_calls
from controller.sandbox.base import WorkClock
from tests.support.loop import FakeTools

SHA = "a" * 64


def loop(
    turns: list[list[tuple[str, str]]],
    tools: FakeTools | None = None,
    final: str | None = "done",
    **limits: Any,
) -> ToolLoop:
    script = {
        "turns": [[{"id": i, "name": n, "arguments": {}} for i, n in t] for t in turns],
        "final": final,
    }
    return ToolLoop(
        ScriptedProvider(parse_calls(json.dumps(script))),
        tools or FakeTools(),
        Limits(**limits),
        JobRecord(job_id="j", repo="/r"),
        threading.Event(),
        lambda: None,
    )


def code_of(run: ToolLoop) -> ErrorCode:
    with pytest.raises(PatchboxError) as info:
        run.run()
    return info.value.code


def test_every_call_is_recorded_and_effects_enter_the_ledger() -> None:
    tools = FakeTools(
        {
            "replace_text": {"path": "a.py", "sha256After": SHA, "version": 1},
            "run_check": {"changes": {"added": ["gen.txt"]}},
            "apply_patch": {"error": {"code": "PATCH_REJECTED", "message": "no"}},
        }
    )
    run = loop(
        [
            [("c1", "read_file"), ("c2", "replace_text")],
            [("c3", "run_check")],
            [("c4", "apply_patch")],
        ],
        tools,
        final="all done",
    )
    assert run.run() == "all done"
    data = run.record.model_dump(mode="json")
    assert [(c["turn"], c["id"], c["ok"], c["error_code"]) for c in data["tool_calls"]] == [
        (1, "c1", True, None),
        (1, "c2", True, None),
        (2, "c3", True, None),
        (3, "c4", False, "PATCH_REJECTED"),
    ]
    assert data["ledger"] == [
        {
            "turn": 1,
            "id": "c2",
            "tool": "replace_text",
            "intent": "edit",
            "version_before": 0,
            "files": [{"path": "a.py", "sha256": SHA}],
            "outcome": "done",
        },
        {
            "turn": 2,
            "id": "c3",
            "tool": "run_check",
            "intent": "check",
            "version_before": 1,
            "files": [{"path": "gen.txt", "sha256": None}],
            "outcome": "done",
        },
        {
            "turn": 3,
            "id": "c4",
            "tool": "apply_patch",
            "intent": "patch",
            "version_before": 2,
            "files": [],
            "outcome": "rejected",
        },
    ]


def test_a_call_that_raises_leaves_an_unknown_entry_and_ends_the_loop() -> None:
    run = loop([[("c1", "replace_text")]], FakeTools(raises="c1"))
    assert code_of(run) is ErrorCode.SANDBOX_FAILED
    [call] = run.record.tool_calls
    assert (call.id, call.ok, call.error_code) == ("c1", False, "SANDBOX_FAILED")
    assert [(e.id, e.outcome, e.files) for e in run.record.ledger] == [("c1", "unknown", [])]


@pytest.mark.parametrize(
    ("turns", "limits", "code", "recorded"),
    [
        ([], {}, ErrorCode.MODEL_TOOL_CALL_UNSUPPORTED, 0),
        ([[("c1", "read_file")]] * 3, {"max_turns": 2}, ErrorCode.LIMIT_EXCEEDED, 2),
        (
            [[("c1", "read_file"), ("c2", "read_file")]],
            {"max_tool_calls": 1},
            ErrorCode.LIMIT_EXCEEDED,
            1,
        ),
    ],
    ids=["first_turn_without_call", "turns", "tool_calls"],
)
def test_exits_are_exceptions(
    turns: list[list[tuple[str, str]]], limits: dict[str, Any], code: ErrorCode, recorded: int
) -> None:
    run = loop(turns, **limits)
    assert code_of(run) is code
    assert len(run.record.tool_calls) == recorded


def test_a_cancelled_loop_asks_the_model_nothing() -> None:
    run = loop([[("c1", "read_file")]])
    run.cancelled.set()
    assert code_of(run) is ErrorCode.CANCELLED
    assert run.record.tool_calls == []


class _SlowCaller(ScriptedProvider):
    """A scripted provider that takes ``wait`` seconds before each turn (a caller between
    its calls)."""

    def __init__(self, script: str, wait: float) -> None:
        super().__init__(parse_calls(script))
        self.wait = wait

    def next_turn(self, results: list[Any]) -> Any:
        time.sleep(self.wait)
        return super().next_turn(results)


def _slow(*, idle: bool) -> ToolLoop:
    turns = [[{"id": f"c{i}", "name": "list_files", "arguments": {}}] for i in range(4)]
    script = {"turns": turns, "final": "done"}
    return ToolLoop(
        _SlowCaller(json.dumps(script), 0.3),
        FakeTools(),
        Limits(wall_seconds=0.5),
        JobRecord(job_id="j", repo="/r"),
        threading.Event(),
        lambda: None,
        idle_while_asking=idle,
    )


def test_the_wall_clock_counts_a_callers_waits_only_when_they_are_work() -> None:
    # a model's turns are work: four turns of 0.3 s exceed a wall clock of 0.5 s
    assert code_of(_slow(idle=False)) is ErrorCode.LIMIT_EXCEEDED
    # a session's caller between its calls is idle: the same turns fit
    run = _slow(idle=True)
    assert run.run() == "done"
    assert len(run.record.tool_calls) == 4


def test_a_work_clock_counts_only_while_it_runs() -> None:
    clock = WorkClock(10.0)
    time.sleep(0.05)
    clock.pause()
    used = clock.used()
    assert 0.05 <= used < 1.0
    time.sleep(0.1)
    assert clock.used() == used  # paused: nothing counted
    clock.pause()  # idempotent
    clock.resume()
    clock.resume()
    time.sleep(0.05)
    assert clock.used() >= used + 0.05
    assert not clock.expired()
    assert WorkClock(0.0).expired()


def test_a_failed_check_reads_as_its_verdict_in_the_record_and_the_transcript() -> None:
    """The call ran (ok), the check failed: the record and the transcript say the check's own
    verdict, never a bare "ok"."""
    from controller.jobs.summary import transcript_text

    verdict = "tests: failed, exit 1"
    tools = FakeTools(
        {"run_check": {"verdict": verdict, "checkId": "tests", "status": "failed", "exitCode": 1}}
    )
    run = loop([[("c1", "run_check"), ("c2", "list_files")]], tools)
    assert run.run() == "done"
    data = run.record.model_dump(mode="json")
    assert [(c["id"], c["ok"], c.get("verdict")) for c in data["tool_calls"]] == [
        ("c1", True, verdict),
        ("c2", True, None),
    ]
    (turn, _final) = run.record.transcript
    check, listing = turn.calls
    assert check.verdict == verdict
    assert json.loads(check.result) == {
        "result": {"verdict": verdict, "checkId": "tests", "status": "failed", "exitCode": 1}
    }
    assert json.loads(listing.result) == {"result": {}}
    text = transcript_text(run.record)
    assert f"    -> {verdict} (" in text
    assert "-> ok" in text  # the listing's call
    assert text.count("-> ok") == 1


def test_each_call_that_ends_is_told_as_one_progress_line() -> None:
    tools = FakeTools(
        {
            "run_check": {"checkId": "tests", "status": "failed", "exitCode": 1},
            "apply_patch": {"files": [{"path": f"f{i}.py"} for i in range(5)]},
            "replace_text": {"error": {"code": "PATCH_REJECTED", "message": "no"}},
        }
    )
    script = {
        "turns": [
            [
                {"id": "c1", "name": "read_file", "arguments": {"path": "src/x.py\x1b[2J"}},
                {"id": "c2", "name": "run_check", "arguments": {"checkId": "tests"}},
            ],
            [{"id": "c3", "name": "apply_patch", "arguments": {"patch": "x"}}],
            [{"id": "c4", "name": "search_text", "arguments": {"query": "a\nb"}}],
            [{"id": "c5", "name": "replace_text", "arguments": {"path": "a.py"}}],
        ],
        "final": "done",
    }
    told: list[str] = []
    run = ToolLoop(
        ScriptedProvider(parse_calls(json.dumps(script))),
        tools,
        Limits(),
        JobRecord(job_id="j", repo="/r"),
        threading.Event(),
        lambda: None,
        called=lambda done: told.append(done.line()),
    )
    assert run.run() == "done"
    assert told == [
        "turn 1 read_file src/x.py",  # no escape sequence reaches the line
        "turn 1 run_check tests: failed (exit 1)",
        "turn 2 apply_patch f0.py, f1.py, f2.py and 2 more",
        'turn 3 search_text "a\\nb"',
        "turn 4 replace_text a.py: error PATCH_REJECTED",
    ]


def test_a_listener_that_fails_does_not_end_the_job() -> None:
    run = loop([[("c1", "read_file")]])

    def broken(_done: object) -> None:
        raise RuntimeError("listener")

    run.called = broken
    assert run.run() == "done"
    assert [c.id for c in run.record.tool_calls] == ["c1"]
