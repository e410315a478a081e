"""Tool argument validation (pure): every bad input is refused before any side effect."""

from __future__ import annotations

import json
from typing import Any

import pytest

from controller.config.task import CheckSpec
from controller.errors import ArgumentsNotAnObjectError, ErrorCode, ToolError
from controller.tools.schemas import (
    MAX_ARGUMENT_BYTES,
    PATCH_EXAMPLE,
    ApplyPatchArgs,
    ReadFileArgs,
    ReplaceTextArgs,
    describe_check,
    parse_arguments,
    tool_schemas,
)
from patchbox_agent import diffs


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
    assert read["properties"]["startLine"]["minimum"] == 1
    assert "relative to the repository top" in read["properties"]["path"]["description"]
    assert schemas["replace_text"]["description"].startswith("Replace text in one file")
    assert ReadFileArgs.model_config.get("extra") == "forbid"
    assert ReplaceTextArgs.model_config.get("strict") is True
    assert ApplyPatchArgs.model_config.get("frozen") is True


def _texts(value: object) -> list[str]:
    """Every string in a JSON value (descriptions, names, enums)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [t for k, v in value.items() for t in (*_texts(k), *_texts(v))]
    if isinstance(value, list):
        return [t for v in value for t in _texts(v)]
    return []


CHECKS = {
    "tests": CheckSpec(argv=["pytest", "-q"], description="the unit tests"),
    "lint": CheckSpec(argv=["ruff", "check", "."], required=False, timeout_seconds=60),
}


@pytest.mark.parametrize("checks", [None, {}, CHECKS], ids=["unknown", "none", "two"])
def test_schemas_are_plain_text_said_once_every_argument_described(
    checks: dict[str, CheckSpec] | None,
) -> None:
    for tool in tool_schemas(checks):
        params = tool["parameters"]
        assert "description" not in params, tool["name"]  # the tool's own, said once
        assert "title" not in params
        for name, prop in params["properties"].items():
            assert prop["description"].strip(), (tool["name"], name)
            assert "anyOf" not in prop, (tool["name"], name)  # optional: left out, not null
            assert "title" not in prop
        texts = _texts(tool)
        for markup in ("``", ":func:", ":class:", ":data:", ":mod:", ":meth:", "`"):
            assert not [t for t in texts if markup in t], (tool["name"], markup)
        descriptions = [
            tool["description"],
            *(p["description"] for p in params["properties"].values()),
        ]
        assert len(descriptions) == len(set(descriptions)), tool["name"]


def test_run_check_names_the_jobs_checks() -> None:
    run_check = next(t for t in tool_schemas(CHECKS) if t["name"] == "run_check")
    check_id = run_check["parameters"]["properties"]["checkId"]
    assert check_id["enum"] == ["lint", "tests"]
    assert "pattern" not in check_id
    assert run_check["description"].endswith(
        "The checks run_check can run (checkId: what it runs):\n"
        "- lint: ruff check . (optional; at most 60 s)\n"
        "- tests: the unit tests (the change must pass it; at most 300 s)"
    )
    parse_arguments("run_check", {"checkId": "lint"})


def test_run_check_says_plainly_when_a_job_has_no_checks() -> None:
    run_check = next(t for t in tool_schemas({}) if t["name"] == "run_check")
    check_id = run_check["parameters"]["properties"]["checkId"]
    assert "enum" not in check_id
    assert check_id["description"] == "No check is configured for this job."
    assert run_check["description"].endswith(
        "This job has no configured checks, so run_check has nothing to run: do not call it."
    )
    unknown = next(t for t in tool_schemas() if t["name"] == "run_check")
    assert "enum" not in unknown["parameters"]["properties"]["checkId"]
    assert "pattern" in unknown["parameters"]["properties"]["checkId"]


def test_a_long_check_command_is_cut() -> None:
    spec = CheckSpec(argv=["sh", "-c", "x" * 1000])
    line = describe_check("long", spec)
    assert len(line) < 400
    assert "..." in line


def test_apply_patch_shows_a_whole_patch_it_takes() -> None:
    apply = next(t for t in tool_schemas() if t["name"] == "apply_patch")
    example = apply["description"].split("Example of a whole patch:\n", 1)[1]
    assert example == PATCH_EXAMPLE
    (patch,) = diffs.parse_patch(example)
    assert (patch.kind, patch.path) == ("modify", "src/app.py")


def test_a_check_is_described_without_control_or_bidi_characters() -> None:
    line = describe_check("x", CheckSpec(argv=["echo", "a\u202eb\x1b[31m"]))
    assert "\u202e" not in line
    assert "\x1b" not in line
    assert line.startswith("x: echo ")
