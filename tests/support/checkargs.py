"""A job whose check declares an argument, and the calls that aim it: the same at every
front door (CLI, Python API, MCP, service)."""

from __future__ import annotations

import json
from typing import Any

from tests.support.jobs import EDIT, GREET

ECHO = ["python3", "-c", "import sys; print(sys.argv[1:])"]
ECHO_CHECK: dict[str, Any] = {
    "argv": [*ECHO, "{file}"],
    "args": {"file": {"kind": "path", "default": "app.py"}},
    "required": False,
    "timeout_seconds": 60,
}
LIMITS = {"memory_mb": 512, "workspace_mb": 64, "tmp_mb": 32, "wall_seconds": 300}
TASK: dict[str, Any] = {
    "prompt": "Capitalize the greeting.",
    "checks": {"greet": GREET, "echo": ECHO_CHECK},
    "limits": LIMITS,
}
AIMED = {"checkId": "echo", "args": {"file": "check.py"}}
OPTION = {"checkId": "echo", "args": {"file": "--help"}}
PROTECTED = {"checkId": "echo", "args": {"file": ".git/config"}}
UNDECLARED = {"checkId": "greet", "args": {"file": "app.py"}}
REFUSALS = {
    "c2": "args.file: starts with '-': an option is never a value",
    "c3": "args.file: not allowed",
    "c4": "args.file: check greet declares no such argument (it takes none)",
}
"""Each refused call's exact message."""
CALLS: dict[str, Any] = {
    "turns": [
        [{"id": "c1", "name": "run_check", "arguments": AIMED}],
        [{"id": "c2", "name": "run_check", "arguments": OPTION}],
        [{"id": "c3", "name": "run_check", "arguments": PROTECTED}],
        [{"id": "c4", "name": "run_check", "arguments": UNDECLARED}],
        [{"id": "c5", "name": "run_check", "arguments": AIMED}],
        [{"id": "c6", **EDIT}],
    ],
    "final": "done",
}
"""An aimed run, three refusals, the aimed run again (reused), an edit."""
AIMED_ARGV = [*ECHO, "check.py"]
AIMED_OUTPUT = "['check.py']\n"


def check_transcript(transcript: list[dict[str, Any]]) -> None:
    """The transcript of :data:`CALLS`: each run_check's result as the model got it, with
    the argv that ran, the refusals with their exact messages."""
    calls = {c["id"]: c for turn in transcript for c in turn.get("calls", [])}
    first = json.loads(calls["c1"]["result"])["result"]
    assert (first["argv"], first["output"]) == (AIMED_ARGV, AIMED_OUTPUT)
    for call_id, message in REFUSALS.items():
        error = json.loads(calls[call_id]["result"])["error"]
        assert (error["code"], error["message"]) == ("TOOL_ARGUMENTS_INVALID", message)
    again = json.loads(calls["c5"]["result"])["result"]
    assert (again["argv"], again["reused"]) == (AIMED_ARGV, True)


def check_tool_calls(tool_calls: list[dict[str, Any]]) -> None:
    """The job's ``tool_calls`` record of :data:`CALLS`."""
    by_id = {c["id"]: c for c in tool_calls}
    assert by_id["c1"]["verdict"] == "echo: passed"
    for call_id, message in REFUSALS.items():
        assert (by_id[call_id]["ok"], by_id[call_id]["error_code"]) == (
            False,
            "TOOL_ARGUMENTS_INVALID",
        )
        assert by_id[call_id]["error_message"] == message
    assert by_id["c5"]["verdict"] == "echo: passed (reused: nothing changed since it ran)"
