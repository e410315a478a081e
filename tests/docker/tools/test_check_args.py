"""A check's declared arguments against a real container, under runc and runsc: an attack
table of values, each refused with its exact reason (nothing runs), and a real pytest suite
aimed at one node through the Python API, which runs exactly that test, while the required
check that decides the job runs the whole suite (its defaults)."""

from __future__ import annotations

import re
from pathlib import Path

import docker

from controller import api
from controller.config.host import HostConfig
from controller.config.task import CheckSpec, TaskSpec
from controller.jobs.store import JobStore
from controller.sandbox.base import Runtime
from controller.tools.executor import ToolExecutor
from tests.support.harness import AgentWorkspace
from tests.support.jobs import make_repo
from tests.support.sandbox import SandboxFactory

ECHO = ["python3", "-c", "import sys; print(sys.argv[1:])"]
CHECK = CheckSpec.model_validate(
    {
        "argv": [*ECHO, "{tests}", "{file}", "{mode}", "{n}"],
        "args": {
            "tests": {"kind": "pytest_node", "max": 20, "default": ["tests"]},
            "file": {"kind": "path"},
            "mode": {"kind": "choice", "choices": ["fast", "full"]},
            "n": {"kind": "int", "range": [1, 8]},
        },
    }
)
OPTION = "starts with '-': an option is never a value"
DOTDOT = "not allowed: '..' leaves the repository"
ABSOLUTE = "use a path relative to the repository top (like src/app.py), not an absolute path"
LINK = "not allowed: a symbolic link, which the tools do not follow"
GLOB = "holds a glob character (* ? [ ]): name one path"
MISSING = "no such file or folder"
CONTROL = "holds a control, format or separator character"
MALFORMED = (
    "not a valid path: use a path relative to the repository top, with / between names and"
    " no empty or '.' parts"
)
NODE = (
    "not a pytest node id: after the path, '::' then names of letters, digits and _ (the last"
    " may end with a [parameter id] of printable characters, no spaces)"
)

ATTACKS: list[tuple[str, dict[str, object], str]] = [
    # options and -- tricks
    ("option -k", {"tests": "-k"}, f"args.tests[0]: {OPTION}"),
    ("option -k joined", {"tests": "-ktest_x or True"}, f"args.tests[0]: {OPTION}"),
    ("double dash", {"tests": "--"}, f"args.tests[0]: {OPTION}"),
    ("option after a path", {"tests": ["tests", "--collect-only"]}, f"args.tests[1]: {OPTION}"),
    ("rootdir", {"tests": "--rootdir=/"}, f"args.tests[0]: {OPTION}"),
    ("plugin", {"tests": ["-p", "evil"]}, f"args.tests[0]: {OPTION}"),
    ("path option", {"file": "-"}, f"args.file: {OPTION}"),
    ("negative int", {"n": "-1"}, f"args.n: {OPTION}"),
    # traversal and absolute paths
    ("dotdot", {"file": "../etc/passwd"}, f"args.file: {DOTDOT}"),
    ("inner dotdot", {"file": "src/../../etc"}, f"args.file: {DOTDOT}"),
    ("node dotdot", {"tests": "tests/../../x.py::test_x"}, f"args.tests[0]: {DOTDOT}"),
    ("absolute", {"file": "/etc/passwd"}, f"args.file: {ABSOLUTE}"),
    ("absolute workspace", {"tests": "/workspace/tests"}, f"args.tests[0]: {ABSOLUTE}"),
    ("dot part", {"file": "./tests"}, f"args.file: {MALFORMED}"),
    ("trailing slash", {"file": "tests/"}, f"args.file: {MALFORMED}"),
    ("backslash", {"file": "tests\\test_a.py"}, f"args.file: {MALFORMED}, backslashes or control characters"),
    # protected paths: the same bare answer whether they exist or not
    ("git config", {"file": ".git/config"}, "args.file: not allowed"),
    ("git folder", {"file": ".git"}, "args.file: not allowed"),
    ("env", {"file": ".env"}, "args.file: not allowed"),
    ("env missing, folded", {"file": "sub/.ENV.local"}, "args.file: not allowed"),
    ("ssh key", {"file": "~/.ssh/id_rsa"}, "args.file: not allowed"),
    ("node in git", {"tests": ".git/config::test_x"}, "args.tests[0]: not allowed"),
    ("docker config", {"file": ".docker/config.json"}, "args.file: not allowed"),
    # links out of the workspace and to protected files
    ("link to a folder outside", {"file": "tests/out"}, f"args.file: {LINK}"),
    ("through a link", {"file": "tests/out/secret.txt"}, f"args.file: {LINK}"),
    ("link to a file outside", {"file": "tests/link.py"}, f"args.file: {LINK}"),
    ("node through a link", {"tests": "tests/link.py::test_x"}, f"args.tests[0]: {LINK}"),
    ("link to protected", {"file": "tests/env_link"}, f"args.file: {LINK}"),
    ("link to /etc/passwd", {"file": "src/abs"}, f"args.file: {LINK}"),
    # globs
    ("star", {"tests": "tests/*.py"}, f"args.tests[0]: {GLOB}"),
    ("double star", {"file": "**"}, f"args.file: {GLOB}"),
    ("question mark", {"tests": "tests/test_?.py"}, f"args.tests[0]: {GLOB}"),
    ("bracket", {"tests": "tests/[ab].py"}, f"args.tests[0]: {GLOB}"),
    # unicode look-alikes: names that are not there
    ("fullwidth slash", {"file": "tests\uff0ftest_a.py"}, f"args.file: {MISSING}"),
    ("division slash", {"file": "tests\u2215test_a.py"}, f"args.file: {MISSING}"),
    ("hyphen look-alike", {"tests": "\u2010k"}, f"args.tests[0]: {MISSING}"),
    ("minus look-alike", {"tests": "\u2212\u2212collect-only"}, f"args.tests[0]: {MISSING}"),
    ("bidi override", {"file": "tests\u202e"}, f"args.file: {CONTROL}"),
    ("zero width", {"file": "te\u200bsts"}, f"args.file: {CONTROL}"),
    # NUL, line breaks, controls
    ("nul", {"file": "tests\x00/x"}, "args.file: holds NUL"),
    ("newline", {"file": "tests\n-k"}, "args.file: holds a line break"),
    ("carriage return", {"tests": "tests\r"}, "args.tests[0]: holds a line break"),
    ("escape", {"file": "tests\x1b[31m"}, f"args.file: {CONTROL}"),
    ("tab", {"file": "tests\tx"}, f"args.file: {CONTROL}"),
    # sizes
    ("1000 values", {"tests": ["tests"] * 1000}, "args.tests: 1000 values, but it takes at most 20 values"),
    ("two values for one", {"file": ["src", "tests"]}, "args.file: 2 values, but it takes one value"),
    ("oversize", {"file": "a" * 1025}, "args.file: longer than 1024 bytes"),
    ("oversize multibyte", {"file": "\u00e9" * 513}, "args.file: longer than 1024 bytes"),
    ("empty", {"file": ""}, "args.file: empty"),
    ("empty list", {"tests": []}, "args.tests: an empty list (leave the argument out for its default)"),
    # wrong kinds, shell text, undeclared
    ("not a string", {"tests": 7}, "args.tests[0]: a pytest_node value must be a string"),
    ("not a number", {"n": "abc"}, "args.n: not a whole number"),
    ("out of range", {"n": 9}, "args.n: not in the range 1 to 8"),
    ("choice with shell", {"mode": "fast; rm -rf /"}, "args.mode: not one of: fast, full"),
    ("choice case", {"mode": "FAST"}, "args.mode: not one of: fast, full"),
    ("node with a space", {"tests": "tests/test_a.py::test x"}, f"args.tests[0]: {NODE}"),
    ("param with a space", {"tests": "tests/test_a.py::test_x[a b]"}, f"args.tests[0]: {NODE}"),
    ("node of a folder", {"tests": "tests::test_x"}, "args.tests[0]: a folder, not a file: a test id names a file"),
    ("command substitution", {"file": "$(id)"}, f"args.file: {MISSING}"),
    ("backticks", {"file": "`id`"}, f"args.file: {MISSING}"),
    ("missing", {"file": "nope.py"}, f"args.file: {MISSING}"),
    ("undeclared", {"k": "x"}, "args.k: check t declares no such argument (it takes: file, mode, n, tests)"),
]  # fmt: skip


def _workspace(make_sandbox: SandboxFactory, runtime: Runtime) -> AgentWorkspace:
    ws = AgentWorkspace("docker", make_sandbox(runtime=runtime), Path("/workspace"), "/tmp/outside")
    ws.setup(
        {"tests/test_a.py": "def test_x():\n    pass\n", "src/app.py": "x = 1\n"},
        links={
            "tests/out": "{outside}",
            "tests/link.py": "{outside}/secret.txt",
            "tests/env_link": "../.env",
            "src/abs": "/etc/passwd",
        },
        outside={"secret.txt": "secret\n"},
    )
    made = ws.box.run(
        ["sh", "-c", "mkdir -p .git && echo x > .git/config && echo S=1 > .env"], timeout=30
    )
    assert made.exit_code == 0, made.output
    return ws


def test_every_attack_is_refused_with_its_exact_reason(
    make_sandbox: SandboxFactory, runtime: Runtime
) -> None:
    assert len(ATTACKS) >= 40
    ws = _workspace(make_sandbox, runtime)
    ex = ToolExecutor(ws.box, checks={"t": CHECK})
    wrong = []
    for n, (name, args, message) in enumerate(ATTACKS):
        done = ex.execute(1, f"c{n}", "run_check", {"checkId": "t", "args": args})
        got = done.error["message"] if done.error else f"ran: {done.result}"
        code = done.error["code"] if done.error else None
        if (code, got) != ("TOOL_ARGUMENTS_INVALID", message):
            wrong.append((name, code, got))
    assert wrong == []
    good = ex.execute(
        2,
        "ok",
        "run_check",
        {"checkId": "t", "args": {"tests": "tests/test_a.py::test_x", "file": "src", "n": 3}},
    )
    assert good.result is not None
    assert good.result["output"] == "['tests/test_a.py::test_x', 'src', '3']\n"
    assert good.result["argv"] == [*ECHO, "tests/test_a.py::test_x", "src", "3"]


def _suite(files: int, tests: int) -> dict[str, str]:
    out = {"pyproject.toml": "[tool.pytest.ini_options]\ntestpaths = ['tests']\n"}
    for f in range(files):
        body = "import pytest\n\n"
        body += "".join(f"def test_{t}():\n    assert {t} == {t}\n\n" for t in range(tests))
        body += "@pytest.mark.parametrize('v', [1, 2, 3])\ndef test_p(v):\n    assert v\n"
        out[f"tests/test_m{f}.py"] = body
    return out


PASSED = re.compile(r"(\d+) passed")


def _passed(output: str) -> int:
    found = PASSED.findall(output)
    assert found, output
    return int(found[-1])


def test_an_aimed_pytest_check_runs_exactly_that_test(
    docker_client: docker.DockerClient, sandbox_image: str, runtime: Runtime, tmp_path: Path
) -> None:
    del sandbox_image
    repo = make_repo(tmp_path / "repo", _suite(3, 10))  # 3 files x (10 + 3) = 39 tests
    task = TaskSpec.model_validate(
        {
            "prompt": "Aim the tests.",
            "checks": {
                "tests": {
                    "argv": ["python3", "-m", "pytest", "-q", "-p", "no:cacheprovider", "{tests}"],
                    "args": {"tests": {"kind": "pytest_node", "max": 20, "default": ["tests"]}},
                }
            },
            "limits": {"memory_mb": 512, "workspace_mb": 64, "tmp_mb": 32, "wall_seconds": 300},
        }
    )
    config = HostConfig(spare_sandboxes=0)
    with api.open_session(
        repo, task=task, config=config, runtime=runtime, client=docker_client
    ) as session:
        one = session.call(
            "run_check", {"checkId": "tests", "args": {"tests": ["tests/test_m1.py::test_4"]}}
        )
        assert one.result is not None
        assert one.result["status"] == "passed"
        assert _passed(one.result["output"]) == 1
        assert one.result["argv"][-1] == "tests/test_m1.py::test_4"
        param = session.call(
            "run_check",
            {
                "checkId": "tests",
                "args": {"tests": ["tests/test_m2.py::test_p[2]", "tests/test_m0.py"]},
            },
        )
        assert param.result is not None
        assert _passed(param.result["output"]) == 1 + 13
        again = session.call(
            "run_check", {"checkId": "tests", "args": {"tests": "tests/test_m1.py::test_4"}}
        )
        assert again.result is not None
        assert again.result["reused"] is True
        assert again.result["output"] == one.result["output"]
        whole = session.call("run_check", {"checkId": "tests"})
        assert whole.result is not None
        assert _passed(whole.result["output"]) == 39
        refused = session.call("run_check", {"checkId": "tests", "args": {"tests": "-x"}})
        assert (refused.ok, refused.code) == (False, "TOOL_ARGUMENTS_INVALID")
        assert refused.error is not None
        assert refused.error["message"] == f"args.tests[0]: {OPTION}"
        edit = {
            "path": "tests/test_m0.py",
            "oldText": "assert 0 == 0",
            "newText": "assert 0 == 0 + 0",
        }
        assert session.call("replace_text", edit).ok
        proposal = session.propose("aimed")
    record = JobStore().load(proposal.job_id)
    assert [c.status for c in record.baseline_checks] == ["passed"]
    assert _passed(record.baseline_checks[0].output_tail) == 39  # the defaults, always
    assert [c.status for c in record.checks] == ["passed"]
    assert _passed(record.checks[0].output_tail) == 39
