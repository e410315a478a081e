"""The tool loop (:class:`controller.jobs.loop.ToolLoop`) with the scripted provider and fake
tools: what it records, and its exits. No Docker."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from controller.config.limits import Limits
from controller.errors import ErrorCode, PatchboxError
from controller.jobs.loop import ToolLoop
from controller.jobs.records import JobRecord
from controller.providers import ScriptedProvider, parse_calls
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
