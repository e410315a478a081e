"""A check's declared arguments (pure): the declaration at load, the values a call gives."""

from __future__ import annotations

from typing import Any

import pytest

from controller.config.checkargs import check_values, workspace_paths
from controller.config.checks import read_repo_checks
from controller.config.task import CheckSpec, task_from
from controller.errors import ErrorCode, ToolError, UsageError

TESTS = {"kind": "pytest_node", "max": 20, "default": ["tests"]}


def _spec(**slots: dict[str, Any]) -> CheckSpec:
    argv = ["python3", "-m", "pytest", "-q", *(f"{{{n}}}" for n in slots)]
    return CheckSpec.model_validate({"argv": argv, "args": slots})


def test_defaults_expand_and_values_replace_them() -> None:
    spec = CheckSpec.model_validate(
        {
            "argv": ["python3", "-m", "pytest", "-q", "-n", "{workers}", "{tests}"],
            "args": {"tests": TESTS, "workers": {"kind": "int", "range": [1, 8], "default": 2}},
        }
    )
    assert spec.argv_with() == ["python3", "-m", "pytest", "-q", "-n", "2", "tests"]
    values = check_values("t", spec.args, {"tests": ["a.py::t", "b.py"], "workers": "4"})
    assert values == {"tests": ("a.py::t", "b.py"), "workers": ("4",)}
    assert spec.argv_with(values) == ["python3", "-m", "pytest", "-q", "-n", "4", "a.py::t", "b.py"]
    assert workspace_paths(spec.args, values) == [
        ("args.tests[0]", "a.py", True),
        ("args.tests[1]", "b.py", False),
    ]


def test_a_slot_without_default_expands_to_nothing() -> None:
    spec = _spec(path={"kind": "path"})
    assert spec.argv_with() == ["python3", "-m", "pytest", "-q"]
    assert spec.argv_with({"path": ("src",)}) == ["python3", "-m", "pytest", "-q", "src"]


def test_a_check_without_args_is_as_before() -> None:
    spec = CheckSpec(argv=["sh", "-c", "echo {x} {}"])
    assert spec.argv_with() == ["sh", "-c", "echo {x} {}"]


@pytest.mark.parametrize(
    ("argv", "args", "fragment"),
    [
        (["pytest", "{tests}"], {}, "argv[1] names {tests}, which args does not declare"),
        (["pytest"], {"tests": TESTS}, "args declares tests, which argv never names"),
        (["pytest", "--x={tests}"], {"tests": TESTS}, "argv[1] holds {tests} inside other text"),
        (["pytest", "{tests}", "{tests}"], {"tests": TESTS}, "names {tests} more than once"),
        (["p", "{t}"], {"t": {"kind": "path", "default": "/etc"}}, "default: use a path relative"),
        (["p", "{t}"], {"t": {"kind": "path", "default": "-x"}}, "default: starts with '-'"),
        (["p", "{t}"], {"t": {"kind": "path", "default": "../x"}}, "'..' leaves the repository"),
        (["p", "{t}"], {"t": {"kind": "path", "default": ".git/config"}}, "default: not allowed"),
        (["p", "{t}"], {"t": {"kind": "path", "default": ["a", "b"]}}, "more than max (1)"),
        (["p", "{t}"], {"t": {"kind": "path", "default": []}}, "must not be an empty list"),
        (["p", "{t}"], {"t": {"kind": "choice"}}, "a choice slot needs choices"),
        (["p", "{t}"], {"t": {"kind": "choice", "choices": ["a", "a"]}}, "choices must differ"),
        (["p", "{t}"], {"t": {"kind": "choice", "choices": ["-v"]}}, "choices[0]: starts with"),
        (["p", "{t}"], {"t": {"kind": "choice", "choices": ["a"], "default": "b"}}, "not one of"),
        (["p", "{t}"], {"t": {"kind": "path", "choices": ["a"]}}, "choices are for a choice"),
        (["p", "{t}"], {"t": {"kind": "int"}}, "an int slot needs a range"),
        (["p", "{t}"], {"t": {"kind": "int", "range": [5, 1]}}, "0 <= lowest <= highest"),
        (["p", "{t}"], {"t": {"kind": "int", "range": [-3, 1]}}, "0 <= lowest <= highest"),
        (["p", "{t}"], {"t": {"kind": "int", "range": [1, 3], "default": 9}}, "not in the range"),
        (["p", "{t}"], {"t": {"kind": "path", "range": [1, 3]}}, "range is for an int slot"),
        (["p", "{t}"], {"t": {"kind": "glob"}}, "kind"),
        (["p", "{t}"], {"t": {"kind": "path", "max": 0}}, "max"),
        (["p", "{t}"], {"t": {"kind": "path", "max": 101}}, "max"),
        (["p", "{t}"], {"t": {"kind": "path", "extra": 1}}, "extra"),
        (["p", "{t}"], {"t": {"kind": "pytest_node", "default": "a.py::t x"}}, "not a pytest node"),
        (["p", "{1t}"], {"1t": {"kind": "path"}}, "args"),
    ],
)
def test_a_bad_declaration_is_a_usage_error_at_load(
    argv: list[str], args: dict[str, Any], fragment: str
) -> None:
    with pytest.raises(UsageError) as info:
        task_from({"prompt": "x", "checks": {"tests": {"argv": argv, "args": args}}})
    assert fragment in info.value.message


def test_the_repository_checks_file_is_validated_the_same_way(tmp_path: Any) -> None:
    (tmp_path / ".patchbox").mkdir()
    (tmp_path / ".patchbox" / "checks.json").write_text(
        '{"tests": {"argv": ["pytest", "{tests}"], "args": {}}}'
    )
    with pytest.raises(UsageError, match="which args does not declare"):
        read_repo_checks(tmp_path)
    (tmp_path / ".patchbox" / "checks.json").write_text(
        '{"tests": {"argv": ["pytest", "{tests}"], "args": {"tests": {"kind": "path"}}}}'
    )
    assert read_repo_checks(tmp_path)["tests"].args["tests"].kind == "path"


SLOTS = CheckSpec.model_validate(
    {
        "argv": ["x", "{tests}", "{path}", "{mode}", "{n}"],
        "args": {
            "tests": TESTS,
            "path": {"kind": "path"},
            "mode": {"kind": "choice", "choices": ["fast", "full"]},
            "n": {"kind": "int", "range": [1, 8]},
        },
    }
).args


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ({"tests": "tests/test_a.py::test_x"}, {"tests": ("tests/test_a.py::test_x",)}),
        ({"tests": ["t.py::C::test_x[a-1/b]"]}, {"tests": ("t.py::C::test_x[a-1/b]",)}),
        ({"tests": ["src dir/t.py"]}, {"tests": ("src dir/t.py",)}),
        ({"path": "src/é.py"}, {"path": ("src/é.py",)}),
        ({"mode": "full"}, {"mode": ("full",)}),
        ({"n": 8}, {"n": ("8",)}),
        ({"n": ["1"]}, {"n": ("1",)}),
        (None, {}),
        ({}, {}),
    ],
)
def test_good_values(given: dict[str, object] | None, expected: dict[str, object]) -> None:
    assert check_values("c", SLOTS, given) == expected


PURE_REFUSALS: list[tuple[dict[str, object], str]] = [
    ({"tests": "-k"}, "args.tests[0]: starts with '-': an option is never a value"),
    ({"tests": ["a.py", "--"]}, "args.tests[1]: starts with '-': an option is never a value"),
    ({"tests": "a\x00b"}, "args.tests[0]: holds NUL"),
    ({"tests": "a\nb"}, "args.tests[0]: holds a line break"),
    ({"tests": "a\x1bb"}, "args.tests[0]: holds a control, format or separator character"),
    ({"tests": "a\u202eb"}, "args.tests[0]: holds a control, format or separator character"),
    ({"tests": "x" * 1025}, "args.tests[0]: longer than 1024 bytes"),
    ({"tests": ["a.py"] * 21}, "args.tests: 21 values, but it takes at most 20 values"),
    ({"path": ["a", "b"]}, "args.path: 2 values, but it takes one value"),
    ({"tests": []}, "args.tests: an empty list (leave the argument out for its default)"),
    ({"tests": 3}, "args.tests[0]: a pytest_node value must be a string"),
    ({"n": 9}, "args.n: not in the range 1 to 8"),
    ({"n": "-1"}, "args.n: starts with '-': an option is never a value"),
    ({"n": True}, "args.n: not a whole number"),
    ({"n": "3.5"}, "args.n: not a whole number"),
    ({"mode": "fastest"}, "args.mode: not one of: fast, full"),
    (
        {"nope": "x"},
        "args.nope: check c declares no such argument (it takes: mode, n, path, tests)",
    ),
]


@pytest.mark.parametrize(("given", "message"), PURE_REFUSALS)
def test_refused_values_say_exactly_why(given: dict[str, object], message: str) -> None:
    with pytest.raises(ToolError) as info:
        check_values("c", SLOTS, given)
    assert info.value.code is ErrorCode.TOOL_ARGUMENTS_INVALID
    assert info.value.message == message


def test_a_check_without_slots_takes_no_argument() -> None:
    with pytest.raises(ToolError) as info:
        check_values("lint", {}, {"x": "y"})
    assert info.value.message == "args.x: check lint declares no such argument (it takes none)"
