"""The scripted provider and its calls file: tables of valid and invalid files."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from controller.errors import ErrorCode, UsageError
from controller.providers import (
    CancelledError,
    Provider,
    ProviderError,
    ScriptedProvider,
    ToolCall,
    ToolResult,
    load_calls,
    parse_calls,
)
from controller.providers import scripted as scripted_module
from controller.providers.base import ModelTurn
from controller.tools.schemas import ReplaceTextArgs, SearchTextArgs, parse_arguments

SPEC_EXAMPLE: dict[str, Any] = {
    "turns": [
        [{"id": "c1", "name": "search_text", "arguments": {"query": "def parse_items"}}],
        [
            {
                "id": "c1",
                "name": "replace_text",
                "arguments": {
                    "path": "src/parser.py",
                    "oldText": "    return text.split(',')",
                    "newText": "    return text.split(',') if text.strip() else []",
                },
            }
        ],
    ],
    "final": "Done.",
}


def answer(turn: ModelTurn, content: str = "ok") -> list[ToolResult]:
    return [ToolResult(call_id=c.id, name=c.name, content=content) for c in turn.tool_calls]


def test_spec_example_plays_turn_by_turn() -> None:
    with ScriptedProvider(parse_calls(json.dumps(SPEC_EXAMPLE))) as scripted:
        first = scripted.next_turn([])
        assert first.tool_calls == [
            ToolCall(id="c1", name="search_text", arguments='{"query": "def parse_items"}')
        ]
        assert parse_arguments("search_text", first.tool_calls[0].arguments) == SearchTextArgs(
            query="def parse_items"
        )
        assert first.text is None
        second = scripted.next_turn(answer(first, "src/parser.py:3"))
        assert [c.id for c in second.tool_calls] == ["c1"]
        replace = SPEC_EXAMPLE["turns"][1][0]["arguments"]
        assert parse_arguments("replace_text", second.tool_calls[0].arguments) == ReplaceTextArgs(
            **replace
        )
        final = scripted.next_turn(answer(second))
        assert final.tool_calls == []
        assert final.text == "Done."
        with pytest.raises(ProviderError, match="already ended"):
            scripted.next_turn([])
        received = scripted.received
    assert [[r.content for r in results] for results in received] == [
        [],
        ["src/parser.py:3"],
        ["ok"],
    ]


def test_arguments_are_reserialized_exactly() -> None:
    arguments = {
        "path": "ü/𝄞.py",
        "oldText": 'a "quoted"\n\ttab',
        "newText": "",
        "n": [1, 2.5, None, True],
    }
    calls = parse_calls(
        json.dumps({"turns": [[{"id": "x", "name": "replace_text", "arguments": arguments}]]})
    )
    turn = ScriptedProvider(calls).next_turn([])
    assert json.loads(turn.tool_calls[0].arguments) == arguments


def test_no_turns_gives_a_final_first_turn() -> None:
    provider = ScriptedProvider(parse_calls('{"turns": []}'))
    turn = provider.next_turn([])
    assert turn.tool_calls == []
    assert turn.text is None


def test_results_must_answer_the_previous_turn() -> None:
    provider = ScriptedProvider(parse_calls(json.dumps(SPEC_EXAMPLE)))
    stray = [ToolResult(call_id="c1", name="search_text", content="x")]
    with pytest.raises(ValueError, match="previous turn"):
        provider.next_turn(stray)
    first = provider.next_turn([])
    for wrong in ([], stray * 2, [ToolResult(call_id="c2", name="search_text", content="x")]):
        with pytest.raises(ValueError, match="previous turn"):
            provider.next_turn(wrong)
    assert provider.next_turn(answer(first)).tool_calls[0].name == "replace_text"


def test_cancel_is_final() -> None:
    provider: Provider = ScriptedProvider(parse_calls(json.dumps(SPEC_EXAMPLE)))
    provider.next_turn([])
    provider.cancel()
    with pytest.raises(CancelledError) as caught:
        provider.next_turn([])
    assert caught.value.code == ErrorCode.CANCELLED
    provider.close()
    provider.close()


def _call(**fields: Any) -> dict[str, Any]:
    return {"id": "c1", "name": "read_file", "arguments": {"path": "a"}} | fields


@pytest.mark.parametrize(
    "value",
    [
        {"turns": []},
        {"turns": [], "final": None},
        {"turns": [[_call()]], "final": ""},
        {"turns": [[_call(), _call(id="c2")], [_call()]]},
        {"turns": [[_call(name="not_a_tool", arguments={})]]},
        {"turns": [[_call(arguments={"deep": [[{"a": 1}]]})]]},
        {"turns": [[_call(id="x" * 256)]], "final": "y" * 1024 * 1024},
        {"turns": [[_call(id=f"c{n}") for n in range(256)]]},
    ],
)
def test_valid_calls_files(value: dict[str, Any]) -> None:
    calls = parse_calls(json.dumps(value))
    assert len(calls.turns) == len(value["turns"])
    assert calls.final == value.get("final")


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("", "not valid JSON"),
        ("{", "not valid JSON"),
        ("[]", "not a JSON object"),
        ('{"turns": [], "turns": []}', "duplicate key"),
        ('{"turns": [[{"id": "c", "name": "n", "arguments": {"x": NaN}}]]}', "non-finite"),
        ("{}", "turns: Field required"),
        ('{"turns": [], "extra": 1}', "extra: unknown key (known keys: final, turns)"),
        ('{"turns": {}}', "turns"),
        ('{"turns": [[]]}', "turns.0: List should have at least 1 item"),
        ('{"turns": [{}]}', "turns.0"),
        ('{"turns": [], "final": 3}', "final"),
        ('{"turns": [], "final": "' + "y" * (1024 * 1024 + 1) + '"}', "final"),
        (json.dumps({"turns": [[_call(arguments="{}")]]}), "turns.0.0.arguments"),
        (json.dumps({"turns": [[_call(arguments=[])]]}), "turns.0.0.arguments"),
        (json.dumps({"turns": [[_call(more=1)]]}), "turns.0.0.more"),
        (
            json.dumps({"turns": [[{"id": "c1", "name": "read_file"}]]}),
            "turns.0.0.arguments: Field required",
        ),
        (json.dumps({"turns": [[_call(id="")]]}), "turns.0.0.id"),
        (json.dumps({"turns": [[_call(id=7)]]}), "turns.0.0.id"),
        (json.dumps({"turns": [[_call(id="x" * 257)]]}), "turns.0.0.id"),
        (json.dumps({"turns": [[_call(name="")]]}), "turns.0.0.name"),
        (json.dumps({"turns": [[_call(name="n" * 129)]]}), "turns.0.0.name"),
        (json.dumps({"turns": [[_call()], [_call(), _call()]]}), "turn 1 repeats a tool call id"),
        (
            json.dumps({"turns": [[_call(id=f"c{n}") for n in range(257)]]}),
            "turns.0: List should have at most 256 items",
        ),
        ("[" * 100 + "]" * 100, "not valid JSON (nested too deeply)"),
        (json.dumps({"turns": [[_call(arguments={"n": 10**50})]]}), "number too long"),
        (b"\xff{}", "not valid JSON"),
    ],
)
def test_invalid_calls_files(text: str | bytes, fragment: str) -> None:
    with pytest.raises(UsageError) as caught:
        parse_calls(text)
    assert fragment in caught.value.message
    assert caught.value.code == ErrorCode.USAGE_ERROR


def test_calls_file_size_bound(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    text = json.dumps(SPEC_EXAMPLE)
    monkeypatch.setattr(scripted_module, "MAX_CALLS_FILE_BYTES", len(text))
    assert len(parse_calls(text).turns) == 2
    path = tmp_path / "calls.json"
    path.write_text(text + " ")
    with pytest.raises(UsageError, match=f"larger than {len(text)} bytes"):
        load_calls(path)
    with pytest.raises(UsageError, match="larger than"):
        parse_calls(text + " ")


def test_load_calls(tmp_path: Path) -> None:
    path = tmp_path / "calls.json"
    path.write_text(json.dumps(SPEC_EXAMPLE))
    provider = load_calls(path)
    assert provider.next_turn([]).tool_calls[0].name == "search_text"
    assert load_calls(str(path)).next_turn([]).tool_calls[0].id == "c1"


def test_load_calls_refuses(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"calls file '.*/missing.json' not found"):
        load_calls(tmp_path / "missing.json")
    with pytest.raises(UsageError, match="not a regular file"):
        load_calls(tmp_path)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(UsageError, match="not a regular file"):
        load_calls(fifo)
    bad = tmp_path / "bad.json"
    bad.write_text('{"turns": [[{"id": "c1"}]]}')
    with pytest.raises(UsageError, match=r"invalid calls file: turns\.0\.0\.name: Field required"):
        load_calls(bad)
    if os.geteuid() != 0:
        locked = tmp_path / "locked.json"
        locked.write_text("{}")
        locked.chmod(0)
        with pytest.raises(UsageError, match="cannot be read"):
            load_calls(locked)
