"""Tool argument validation (pure): every bad input is refused before any side effect."""

from __future__ import annotations

import json
from typing import Any

import pytest

from controller.errors import ArgumentsNotAnObjectError, ErrorCode, ToolError
from controller.tools.schemas import (
    MAX_ARGUMENT_BYTES,
    ApplyPatchArgs,
    ReadFileArgs,
    ReplaceTextArgs,
    parse_arguments,
    tool_schemas,
)


@pytest.mark.parametrize(
    ("tool", "args"),
    [
        ("list_files", {}),
        ("list_files", {"glob": "src/**/*.py", "maxResults": 10}),
        ("search_text", {"query": "def parse_items"}),
        ("search_text", {"query": "a.*b", "regex": True, "glob": "*.py", "maxResults": 5}),
        ("read_file", {"path": "src/a.py", "startLine": 1, "endLine": 1}),
        ("replace_text", {"path": "a.py", "oldText": "x", "newText": ""}),
        ("apply_patch", {"patch": "diff --git a/a b/a\n"}),
        ("run_check", {"checkId": "tests"}),
    ],
)
def test_valid_arguments(tool: str, args: dict[str, Any]) -> None:
    parsed = parse_arguments(tool, json.dumps(args))
    assert parsed.model_dump(exclude_none=True, exclude_defaults=True) == {
        k: v for k, v in args.items() if not (k == "regex" and v is False)
    }
    assert parse_arguments(tool, args) == parsed


@pytest.mark.parametrize(
    ("tool", "raw", "fragment"),
    [
        ("list_files", '{"glob": "*", "extra": 1}', "extra"),
        ("list_files", '{"maxResults": "10"}', "maxResults"),
        ("list_files", '{"maxResults": 0}', "maxResults"),
        ("list_files", '{"maxResults": 10.0}', "maxResults"),
        ("list_files", '{"maxResults": true}', "maxResults"),
        ("list_files", '{"glob": ""}', "glob"),
        ("search_text", "{}", "query"),
        ("search_text", '{"query": "x", "regex": "yes"}', "regex"),
        ("read_file", '{"path": "a", "startLine": 5, "endLine": 2}', "endLine"),
        ("read_file", '{"path": 7}', "path"),
        ("read_file", '{"path": "a", "path": "b"}', "not valid JSON"),
        ("read_file", '{"path": "a", "startLine": NaN}', "not valid JSON"),
        ("read_file", '{"path": "a"', "not valid JSON"),
        ("replace_text", '{"path": "a", "oldText": "", "newText": "x"}', "oldText"),
        ("replace_text", '{"path": "a", "oldText": "x", "newText": "x"}', "differ"),
        ("replace_text", '{"path": "a", "oldText": "x"}', "newText"),
        ("apply_patch", '{"patch": ""}', "patch"),
        ("run_check", '{"checkId": "tests; rm -rf /"}', "checkId"),
        ("run_check", '{"checkId": "../x"}', "checkId"),
        ("no_such_tool", "{}", "unknown tool"),
    ],
)
def test_invalid_arguments_are_retryable(tool: str, raw: str, fragment: str) -> None:
    with pytest.raises(ToolError) as info:
        parse_arguments(tool, raw)
    assert info.value.code is ErrorCode.TOOL_ARGUMENTS_INVALID
    assert not isinstance(info.value, ArgumentsNotAnObjectError)
    assert fragment in info.value.message


@pytest.mark.parametrize("raw", ["[]", '"path"', "42", "null"])
def test_non_object_arguments_end_the_job(raw: str) -> None:
    with pytest.raises(ArgumentsNotAnObjectError):
        parse_arguments("read_file", raw)


def test_oversized_arguments_end_the_job() -> None:
    big = json.dumps({"patch": "x" * MAX_ARGUMENT_BYTES})
    with pytest.raises(ArgumentsNotAnObjectError, match="too large"):
        parse_arguments("apply_patch", big)


def test_error_messages_do_not_echo_values() -> None:
    marker = "sk-live-do-not-echo"
    with pytest.raises(ToolError) as info:
        parse_arguments("read_file", json.dumps({"path": "a", "startLine": marker}))
    assert marker not in info.value.message


def test_schemas_are_generated_from_the_models() -> None:
    schemas = {s["name"]: s for s in tool_schemas()}
    assert set(schemas) == {
        "list_files",
        "search_text",
        "read_file",
        "replace_text",
        "apply_patch",
        "run_check",
    }
    read = schemas["read_file"]["parameters"]
    assert read["required"] == ["path"]
    assert read["additionalProperties"] is False
    assert read["properties"]["startLine"]["anyOf"][0]["minimum"] == 1
    assert "relative POSIX path" in read["properties"]["path"]["description"]
    assert schemas["replace_text"]["description"].startswith("Replace the one exact occurrence")
    assert ReadFileArgs.model_config.get("extra") == "forbid"
    assert ReplaceTextArgs.model_config.get("strict") is True
    assert ApplyPatchArgs.model_config.get("frozen") is True
