"""docs/ci.md's command, run as a CI runner runs it: in the checked-out repository, the model
behind a real OpenAI-compatible HTTP server on loopback, the real daemon. The artifacts are
checked as a CI and a reviewer use them: the JUnit report (the check's own pytest cases),
``git am`` of the patch, and a failing report (never an empty green one) when the command
fails before any job. The documented workflows are parsed and their scripts run in checkouts
shaped as GitHub's and GitLab's: a pull request that rewrites ``.patchbox/task.json`` does
not choose the task, and the GitHub job's token can only read."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from tests.support.ci import (
    PYTEST_CHECK,
    github_steps,
    gitlab_script,
    junit_root,
    project,
    run_step,
    the_command,
    workflow,
)
from tests.support.loopback import LoopbackServer


def test_both_ci_examples_run_the_documented_command() -> None:
    command = the_command()
    assert command.startswith("patchbox run ")
    assert '--task "$TASK_FILE"' in command
    assert [s["run"] for s in github_steps() if s.get("name") == "Run patchbox"] == [command]
    assert gitlab_script()[-1] == command
    reports = workflow("GitLab CI")["patchbox"]["artifacts"]["reports"]
    assert reports == {"junit": "patchbox-out/junit.xml"}


def test_the_github_job_can_only_read_and_never_takes_the_task_from_the_checkout() -> None:
    """The job's token reads contents and nothing else, none is left in the checkout, the
    event is ``pull_request`` (never ``pull_request_target``), and every script reads the
    task file only from a commit (``git show REV:.patchbox/task.json``), never from the
    work tree; the task path is under the runner's temporary folder."""
    flow = workflow("GitHub Actions")
    events = flow.get("on", flow.get(True))  # YAML 1.1 reads a bare on as true
    assert events == {"pull_request": None}
    job = flow["jobs"]["patchbox"]
    assert job["permissions"] == {"contents": "read"}
    assert "permissions" not in flow or flow["permissions"] == {"contents": "read"}
    steps = github_steps()
    checkout = next(s for s in steps if str(s.get("uses", "")).startswith("actions/checkout"))
    assert checkout["with"] == {"fetch-depth": 2, "persist-credentials": False}
    scripts = [s["run"] for s in steps if "run" in s]
    for where, script in [
        *(("github", s) for s in scripts),
        ("gitlab", "\n".join(gitlab_script())),
    ]:
        bare = re.findall(r"(?<![:\w])\.patchbox/task\.json", script)
        assert bare == [], (where, script)
        assert "--trust-repo-config" not in script
    for step in steps:
        if "TASK_FILE" in step.get("env", {}):
            assert step["env"]["TASK_FILE"].startswith("${{ runner.temp }}/")


def test_a_command_that_fails_before_any_job_writes_a_failing_report(tmp_path: Path) -> None:
    repo = project(tmp_path / "repo", {"tests": PYTEST_CHECK}, "p")
    (repo / ".patchbox" / "task.json").write_text('{"prompt": "p", "unknown": 1}')
    with LoopbackServer() as server:
        done = run_step(repo, server, tmp_path / "bin")
    assert done.returncode == 2
    out = repo / "patchbox-out"
    assert sorted(p.name for p in out.iterdir()) == [".gitignore", "error.json", "junit.xml"]
    root = junit_root(out / "junit.xml")
    [case] = list(root.iter("testcase"))
    failure = case.find("failure")
    assert failure is not None
    assert (failure.get("message") or "").startswith("USAGE_ERROR: ")
    assert root.get("failures") == "1"
    assert json.loads((out / "error.json").read_text())["error"]["code"] == "USAGE_ERROR"
    shutil.rmtree(out)


def test_a_hostile_junit_file_is_refused_not_parsed(tmp_path: Path) -> None:
    from controller.jobs.junit import JunitError, parse_cases

    bomb = b'<?xml version="1.0"?><!DOCTYPE x [<!ENTITY a "aaaa">]><testsuite>&a;</testsuite>'
    with pytest.raises(JunitError, match="DOCTYPE"):
        parse_cases(bomb)
    with pytest.raises(JunitError, match="larger than"):
        parse_cases(b"<testsuite>" + b" " * (4 * 1024 * 1024) + b"</testsuite>")
    with pytest.raises(JunitError, match="not well-formed"):
        parse_cases(b"<testsuite><testcase name='a'></testsuite>")
    cases = parse_cases(
        b'<testsuites><testsuite><testcase name="a" time="x"/>'
        b'<testcase name="b"><error message="boom">trace</error></testcase>'
        b'<testcase name="c"><skipped/></testcase></testsuite></testsuites>'
    )
    assert [(c.name, c.status, c.time) for c in cases] == [
        ("a", "passed", 0.0),
        ("b", "error", 0.0),
        ("c", "skipped", 0.0),
    ]
