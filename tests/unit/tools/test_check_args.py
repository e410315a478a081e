"""run_check with declared arguments on the real agent (over pipes): the values checked
where the workspace is, the argv that ran recorded, reuse per (check, arguments)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from controller.config.task import CheckSpec
from controller.sandbox.local import LocalSandbox
from controller.tools.executor import ToolExecutor
from controller.tools.schemas import RunCheckArgs, parse_arguments, tool_schemas

PY = sys.executable
ECHO = [PY, "-c", "import sys; print(sys.argv[1:])"]


@pytest.fixture
def box(tmp_path: Path) -> Iterator[LocalSandbox]:
    ws = tmp_path / "ws"
    (ws / "tests").mkdir(parents=True)
    (ws / "tests" / "test_a.py").write_text("def test_x():\n    pass\n")
    (ws / "outside.txt").parent.mkdir(exist_ok=True)
    (tmp_path / "secret.txt").write_text("s\n")
    (ws / "tests" / "out").symlink_to(tmp_path)
    (ws / "tests" / "link.py").symlink_to(tmp_path / "secret.txt")
    with LocalSandbox(ws) as sandbox:
        yield sandbox


def _executor(box: LocalSandbox) -> ToolExecutor:
    checks = {
        "echo": CheckSpec.model_validate(
            {
                "argv": [*ECHO, "{tests}", "{mode}"],
                "args": {
                    "tests": {"kind": "pytest_node", "max": 3, "default": ["tests"]},
                    "mode": {"kind": "choice", "choices": ["a", "b"]},
                },
            }
        ),
        "plain": CheckSpec(argv=[*ECHO, "x"]),
    }
    return ToolExecutor(box, checks=checks)


def test_values_replace_defaults_and_the_argv_is_recorded(box: LocalSandbox) -> None:
    ex = _executor(box)
    default = ex.execute(1, "c1", "run_check", {"checkId": "echo"})
    assert default.result is not None
    assert default.result["argv"] == [*ECHO, "tests"]
    assert default.result["output"] == "['tests']\n"
    aimed = ex.execute(
        1, "c2", "run_check", {"checkId": "echo", "args": {"tests": ["tests/test_a.py::test_x"]}}
    )
    assert aimed.result is not None
    assert aimed.result["output"] == "['tests/test_a.py::test_x']\n"
    assert aimed.result["argv"] == [*ECHO, "tests/test_a.py::test_x"]
    assert aimed.result["reused"] is False
    assert "argv" in aimed.for_model()["result"]  # type: ignore[operator]


def test_reuse_is_per_check_and_arguments(box: LocalSandbox) -> None:
    ex = _executor(box)
    args = {"checkId": "echo", "args": {"tests": "tests", "mode": "a"}}
    first = ex.execute(1, "c1", "run_check", args)
    again = ex.execute(
        1, "c2", "run_check", {"checkId": "echo", "args": {"mode": "a", "tests": ["tests"]}}
    )
    other = ex.execute(1, "c3", "run_check", {"checkId": "echo", "args": {"mode": "b"}})
    assert first.result is not None
    assert again.result is not None
    assert other.result is not None
    assert again.result["reused"] is True
    assert again.result["argv"] == first.result["argv"]
    assert other.result["reused"] is False
    assert other.result["output"] == "['tests', 'b']\n"
    edit = ex.execute(
        1, "c4", "replace_text", {"path": "tests/test_a.py", "oldText": "pass", "newText": "x = 1"}
    )
    assert edit.ok
    after = ex.execute(1, "c5", "run_check", args)
    assert after.result is not None
    assert after.result["reused"] is False


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"tests": "tests/nope.py"}, "args.tests[0]: no such file or folder"),
        ({"tests": "tests/nope/x.py::t"}, "args.tests[0]: no such file or folder"),
        ({"tests": "tests::test_x"}, "args.tests[0]: a folder, not a file: a test id names a file"),
        (
            {"tests": "tests/out/secret.txt"},
            "args.tests[0]: not allowed: a symbolic link, which the tools do not follow",
        ),
        (
            {"tests": ["tests", "tests/link.py"]},
            "args.tests[1]: not allowed: a symbolic link, which the tools do not follow",
        ),
        ({"tests": ".env"}, "args.tests[0]: not allowed"),
        (
            {"tests": "tests/../../secret.txt"},
            "args.tests[0]: not allowed: '..' leaves the repository",
        ),
        (
            {"plain": "x"},
            "args.plain: check echo declares no such argument (it takes: mode, tests)",
        ),
    ],
)
def test_refusals_where_the_workspace_is(
    box: LocalSandbox, args: dict[str, object], message: str
) -> None:
    ex = _executor(box)
    done = ex.execute(1, "c1", "run_check", {"checkId": "echo", "args": args})
    assert not done.ok
    assert done.error == {"code": "TOOL_ARGUMENTS_INVALID", "message": message, "retryable": True}
    assert done.effect == "none"


def test_a_check_without_slots_refuses_any_argument(box: LocalSandbox) -> None:
    done = _executor(box).execute(1, "c1", "run_check", {"checkId": "plain", "args": {"x": "y"}})
    assert done.error is not None
    assert done.error["message"] == "args.x: check plain declares no such argument (it takes none)"


def test_the_model_reads_each_checks_arguments() -> None:
    checks = {
        "tests": CheckSpec.model_validate(
            {
                "argv": ["pytest", "-q", "{tests}"],
                "args": {"tests": {"kind": "pytest_node", "max": 20, "default": ["tests"]}},
            }
        ),
        "lint": CheckSpec(argv=["ruff", "check", "."], required=False),
    }
    run_check = next(t for t in tool_schemas(checks) if t["name"] == "run_check")
    args = run_check["parameters"]["properties"]["args"]
    assert args["additionalProperties"] is False
    assert list(args["properties"]) == ["tests"]
    assert args["properties"]["tests"]["description"] == "Values for checks tests (see above)."
    assert run_check["description"].endswith(
        "- tests: pytest -q {tests} (the change must pass it; at most 300 s); argument tests:"
        " a pytest node id (path, then ::name parts, like tests/test_x.py::test_y); up to 20"
        " values; default tests"
    )
    none = next(t for t in tool_schemas({"lint": checks["lint"]}) if t["name"] == "run_check")
    assert none["parameters"]["properties"]["args"]["properties"] == {}
    unknown = next(t for t in tool_schemas() if t["name"] == "run_check")
    assert "anyOf" in unknown["parameters"]["properties"]["args"]["additionalProperties"]
    parsed = parse_arguments("run_check", {"checkId": "tests", "args": {"tests": ["a.py"]}})
    assert isinstance(parsed, RunCheckArgs)
    assert parsed.args == {"tests": ["a.py"]}


def test_more_paths_than_one_sandbox_answer_holds_are_checked_in_parts(box: LocalSandbox) -> None:
    slots = {f"p{n}": {"kind": "path", "max": 100} for n in range(3)}
    spec = CheckSpec.model_validate({"argv": [*ECHO, *(f"{{{n}}}" for n in slots)], "args": slots})
    given = {name: ["tests"] * 100 for name in slots}
    given["p2"] = [*given["p2"][:99], "tests/nope.py"]
    ex = ToolExecutor(box, checks={"many": spec})
    done = ex.execute(1, "c1", "run_check", {"checkId": "many", "args": given})
    assert done.error is not None
    assert done.error["message"] == "args.p2[99]: no such file or folder"
