"""The wire models: snake_case attributes, the agent's camelCase names on the wire (pure).

``tests/data/wire_names.json`` holds what the models gave before their attributes were
renamed: the tools' JSON Schemas as sent to the model, and the keys of every agent result.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from controller.config.task import CheckSpec
from controller.errors import ErrorCode, ToolError
from controller.sandbox import base, protocol
from controller.sandbox.base import DEFAULT_OUTPUT_LIMIT, RunResult, Sandbox
from controller.sandbox.calls import RAW_CHUNK, AgentCalls
from controller.sandbox.docker import DockerSandbox
from controller.sandbox.local import LocalSandbox
from controller.tools.executor import check_result
from controller.tools.schemas import (
    ARGUMENT_MODELS,
    MAX_ARGUMENT_BYTES,
    ReadFileArgs,
    parse_arguments,
    tool_schemas,
)
from patchbox_agent import bounds, diffs, frames, globs, jail, search
from tests.support.paths import REPO_ROOT

ROOT = REPO_ROOT
GOLDEN = json.loads((ROOT / "tests" / "data" / "wire_names.json").read_text())

HASH = "0" * 64
RESULTS: dict[type[BaseModel], dict[str, Any]] = {
    base.SearchTextResult: {
        "hits": [{"path": "a.py", "line": 1, "text": "x"}],
        "truncated": False,
        "filesScanned": 3,
        "version": 1,
        "cached": False,
    },
    base.ReadFileResult: {
        "path": "a.py",
        "startLine": 1,
        "endLine": 2,
        "totalLines": 9,
        "content": "a\nb\n",
        "truncated": True,
    },
    base.ReplaceTextResult: {
        "path": "a.py",
        "line": 2,
        "removedLines": 1,
        "addedLines": 3,
        "sha256Before": HASH,
        "sha256After": "1" * 64,
        "version": 2,
    },
    base.ApplyPatchResult: {
        "files": [
            {
                "path": "b.py",
                "oldPath": "a.py",
                "kind": "rename",
                "added": 1,
                "removed": 0,
                "sha256Before": HASH,
                "sha256After": None,
            }
        ],
        "version": 3,
    },
    RunResult: {
        "exitCode": 0,
        "signal": None,
        "timedOut": False,
        "cancelled": False,
        "spawnError": None,
        "output": "ok\n",
        "outputBytes": 3,
        "truncated": False,
        "durationMs": 12,
        "changes": {"added": ["n.py"], "removed": [], "modified": [], "count": 1},
        "oomKills": 0,
    },
}


def _py_files() -> list[Path]:
    roots = ("controller", "bench", "tests", "sandbox-image")
    return sorted(p for root in roots for p in (ROOT / root).rglob("*.py"))


def test_no_camel_case_attributes_left() -> None:
    marker = "noqa: " + "N815"
    found = [str(p.relative_to(ROOT)) for p in _py_files() if marker in p.read_text()]
    assert found == []


def test_tool_schemas_unchanged() -> None:
    assert tool_schemas() == GOLDEN["tools"]
    for name, model in ARGUMENT_MODELS.items():
        (sent,) = (t["parameters"] for t in tool_schemas() if t["name"] == name)
        assert list(sent["properties"]) == list(model.model_json_schema()["properties"])


def test_result_keys_unchanged() -> None:
    for name, keys in GOLDEN["results"].items():
        model = getattr(base, name)
        for mode in ("validation", "serialization"):
            schema = model.model_json_schema(mode=mode)
            assert sorted(schema["properties"]) == keys, (name, mode)


@pytest.mark.parametrize("model", list(RESULTS), ids=lambda m: m.__name__)
def test_results_validate_and_dump_with_the_agents_names(model: type[BaseModel]) -> None:
    wire = RESULTS[model]
    parsed = model.model_validate(wire)
    assert parsed.model_dump() == wire
    assert parsed.model_dump(mode="json") == wire
    assert json.loads(parsed.model_dump_json()) == wire
    assert model.model_validate(parsed.model_dump()) == parsed


def test_result_attributes_are_snake_case() -> None:
    run = RunResult.model_validate(RESULTS[RunResult])
    assert (run.exit_code, run.timed_out, run.spawn_error) == (0, False, None)
    assert (run.output_bytes, run.duration_ms) == (3, 12)
    read = base.ReadFileResult.model_validate(RESULTS[base.ReadFileResult])
    assert (read.start_line, read.end_line, read.total_lines) == (1, 2, 9)
    done = base.ApplyPatchResult.model_validate(RESULTS[base.ApplyPatchResult])
    assert (done.files[0].old_path, done.files[0].sha256_before) == ("a.py", HASH)


def test_check_result_keeps_its_keys() -> None:
    view = check_result("unit", RunResult.model_validate(RESULTS[RunResult]), ["pytest", "-q"])
    assert view == {
        "verdict": "unit: passed",
        "checkId": "unit",
        "status": "passed",
        "exitCode": 0,
        "signal": None,
        "durationMs": 12,
        "output": "ok\n",
        "outputTruncated": False,
        "changes": {"added": ["n.py"], "removed": [], "modified": [], "count": 1},
        "reused": False,
        "argv": ["pytest", "-q"],
    }


@pytest.mark.parametrize(
    ("tool", "args"),
    [
        ("list_files", {"max_results": 5}),
        ("search_text", {"query": "x", "max_results": 5}),
        ("read_file", {"path": "a.py", "start_line": 1}),
        ("read_file", {"path": "a.py", "end_line": 1}),
        ("replace_text", {"path": "a.py", "old_text": "a", "newText": "b"}),
        ("replace_text", {"path": "a.py", "oldText": "a", "new_text": "b"}),
        ("run_check", {"check_id": "unit"}),
    ],
)
def test_arguments_refuse_attribute_names(tool: str, args: dict[str, Any]) -> None:
    with pytest.raises(ToolError) as info:
        parse_arguments(tool, args)
    assert info.value.code == ErrorCode.TOOL_ARGUMENTS_INVALID


def test_arguments_take_the_schema_names() -> None:
    read = parse_arguments("read_file", '{"path": "a.py", "startLine": 2, "endLine": 4}')
    assert isinstance(read, ReadFileArgs)
    assert (read.start_line, read.end_line) == (2, 4)
    assert read.model_dump() == {
        "path": "a.py",
        "startLine": 2,
        "endLine": 4,
        "lineNumbers": False,
    }


def test_shared_limits_are_the_agents() -> None:
    schemas = {t["name"]: t["parameters"]["properties"] for t in tool_schemas()}
    assert schemas["list_files"]["maxResults"]["maximum"] == bounds.MAX_LIST_RESULTS
    assert schemas["search_text"]["maxResults"]["maximum"] == bounds.MAX_SEARCH_RESULTS
    assert schemas["search_text"]["query"]["maxLength"] == bounds.MAX_QUERY
    assert schemas["read_file"]["path"]["maxLength"] == jail.MAX_PATH_BYTES
    assert schemas["read_file"]["startLine"]["maximum"] == bounds.MAX_LINE_NUMBER
    assert schemas["list_files"]["glob"]["maxLength"] == globs.MAX_PATTERN
    assert schemas["apply_patch"]["patch"]["maxLength"] == diffs.MAX_BYTES
    assert MAX_ARGUMENT_BYTES > diffs.MAX_BYTES
    # The defaults the model reads in the descriptions are the agent's.
    described = schemas["list_files"]["maxResults"]["description"]
    assert f"(default {bounds.DEFAULT_LIST_RESULTS})" in described
    described = schemas["search_text"]["maxResults"]["description"]
    assert f"(default {bounds.DEFAULT_SEARCH_RESULTS})" in described
    described = schemas["read_file"]["endLine"]["description"]
    assert f"up to {bounds.MAX_READ_LINES} lines" in described
    read_doc = next(t["description"] for t in tool_schemas() if t["name"] == "read_file")
    assert f"at most {bounds.MAX_READ_LINES} lines" in read_doc
    assert base.SearchHit.model_fields["text"].metadata[0].max_length == search.MAX_LINE_CHARS
    assert RAW_CHUNK == bounds.RAW_CHUNK
    assert DEFAULT_OUTPUT_LIMIT == bounds.DEFAULT_RUN_OUTPUT
    check = CheckSpec(argv=["true"])
    assert check.output_limit == bounds.DEFAULT_RUN_OUTPUT
    for name in ("PROTOCOL_VERSION", "MAGIC", "KIND_JSON", "KIND_BINARY", "KIND_SIGNED"):
        assert getattr(protocol, name) == getattr(frames, name)
    assert protocol.HEADER.format == frames.HEADER.format


def test_run_is_defined_once() -> None:
    contract = inspect.signature(Sandbox.run)
    assert inspect.signature(AgentCalls.run) == contract
    assert contract.parameters["output_limit"].default == DEFAULT_OUTPUT_LIMIT
    for impl in (DockerSandbox, LocalSandbox):
        assert impl.run is AgentCalls.run
