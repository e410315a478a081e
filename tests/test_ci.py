"""docs/ci.md's command, run as a CI runner runs it: in the checked-out repository, the model
behind a real OpenAI-compatible HTTP server on loopback, the real daemon. The artifacts are
checked as a CI and a reviewer use them: the JUnit report (the check's own pytest cases),
``git am`` of the patch, and a failing report (never an empty green one) when the command
fails before any job."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import docker
import pytest

from tests.support.git import git, init
from tests.support.jobs import APP_AFTER, FILES
from tests.support.loopback import LoopbackServer, json_reply

ROOT = Path(__file__).resolve().parent.parent
DOC = (ROOT / "docs" / "ci.md").read_text()
TESTS = (
    "from app import greet\n\n\ndef test_capital():\n    assert greet('x') == 'Hello x'\n\n\n"
    "def test_name():\n    assert greet('x').endswith('x')\n"
)
EDIT_ARGS = json.dumps({"path": "app.py", "oldText": '"hello "', "newText": '"Hello "'})


def junit_root(path: Path) -> ET.Element:
    """The report patchbox wrote (its own output, not untrusted input)."""
    return ET.fromstring(path.read_bytes())  # noqa: S314


def the_command() -> str:
    """The command of docs/ci.md's step: the block after the ``ci-script`` marker."""
    found = re.search(r"<!-- ci-script -->\n```sh\n(.*?)```", DOC, re.DOTALL)
    assert found is not None
    return found.group(1).strip()


def test_both_ci_examples_run_the_documented_command() -> None:
    command = the_command()
    assert command.startswith("patchbox run ")
    assert f"run: {command}\n" in DOC  # GitHub Actions
    assert f"    - {command}\n" in DOC  # GitLab CI
    assert "junit: patchbox-out/junit.xml" in DOC


def chat(calls: list[tuple[str, str, str]], text: str | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = [
            {"id": i, "type": "function", "function": {"name": n, "arguments": a}}
            for i, n, a in calls
        ]
    return {
        "id": "c",
        "object": "chat.completion",
        "model": "m",
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }


def project(root: Path, checks: dict[str, Any], prompt: str) -> Path:
    task = {
        "prompt": prompt,
        "checks": checks,
        "limits": {"memory_mb": 512, "workspace_mb": 64, "tmp_mb": 32, "wall_seconds": 300},
    }
    files = {**FILES, "test_app.py": TESTS, ".patchbox/task.json": json.dumps(task)}
    return init(root, files, message="start").path


def run_step(repo: Path, server: LoopbackServer, bin_dir: Path) -> subprocess.CompletedProcess[str]:
    """The documented command, through the shell, with ``patchbox`` on PATH as installed."""
    bin_dir.mkdir(exist_ok=True)
    shim = bin_dir / "patchbox"
    shim.write_text(f'#!/bin/sh\nPYTHONPATH="{ROOT}" exec "{sys.executable}" -m controller "$@"\n')
    shim.chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "OPENAI_BASE_URL": f"{server.url}/v1",
        "OPENAI_API_KEY": "sk-ci-test-key-123456",
        "PATCHBOX_MODEL": "m",
        "PATCHBOX_PROVIDER_API": "chat",
        "PATCHBOX_PROVIDER_STREAM": "false",
    }
    return subprocess.run(
        ["sh", "-c", the_command()],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


PYTEST_CHECK = {
    "argv": ["python3", "-m", "pytest", "-q", "-p", "no:cacheprovider", "--junitxml=/tmp/j.xml"],
    "junit": "/tmp/j.xml",
}


def test_the_documented_step_publishes_a_patch_git_am_applies_and_the_checks_own_cases(
    docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> None:
    del docker_client, sandbox_image
    repo = project(
        tmp_path / "repo",
        {"tests": PYTEST_CHECK, "greet": {"argv": ["python3", "check.py"]}},
        "Capitalize the greeting.\nKeep the rest as it is.\n--- not a patch line\nFrom a mail",
    )
    with LoopbackServer() as server:
        server.play(
            json_reply(chat([("c1", "replace_text", EDIT_ARGS)])),
            json_reply(chat([], "Done: the greeting is capitalized.")),
        )
        done = run_step(repo, server, tmp_path / "bin")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "review: patchbox show" in done.stdout
    out = repo / "patchbox-out"
    names = sorted(p.name for p in out.iterdir())
    assert names == [
        "diff.patch",
        "evidence.json",
        "junit.xml",
        "run.json",
        "transcript.json",
        "transcript.txt",
    ]
    run = json.loads((out / "run.json").read_text())
    assert run["status"] == "awaiting_review"
    evidence = (out / "evidence.json").read_text()
    assert "sk-ci-test-key-123456" not in evidence
    assert str(repo) not in evidence
    assert json.loads(evidence)["transcript"][-1]["text"] == "Done: the greeting is capitalized."
    assert "call c1 replace_text" in (out / "transcript.txt").read_text()

    suites = {s.get("name"): s for s in junit_root(out / "junit.xml").iter("testsuite")}
    assert set(suites) == {"tests", "greet"}
    cases = [c.get("name") for c in suites["tests"].iter("testcase")]
    assert cases == ["test_capital", "test_name"]
    assert suites["tests"].get("failures") == "0"
    assert [c.get("name") for c in suites["greet"].iter("testcase")] == ["greet"]

    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(repo), str(clone))
    git(clone, "am", str(out / "diff.patch"))
    assert (clone / "app.py").read_text() == APP_AFTER
    log = git(clone, "log", "-1", "--format=%an <%ae>%n%s%n%b")
    author, subject, *body = log.splitlines()
    assert author == "patchbox <patchbox@localhost>"
    assert subject == "Capitalize the greeting."
    assert "    --- not a patch line" in body
    assert git(clone, "show", "--stat", "--format=", "HEAD").split()[0] == "app.py"


def test_a_failing_job_is_red_in_the_report_and_the_exit_status(
    docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> None:
    del docker_client, sandbox_image
    repo = project(tmp_path / "repo", {"tests": PYTEST_CHECK}, "Break nothing.")
    wrong = json.dumps({"path": "app.py", "oldText": '"hello "', "newText": '"HELLO "'})
    with LoopbackServer() as server:
        server.play(
            json_reply(chat([("c1", "replace_text", wrong)])),
            json_reply(chat([], "done")),
        )
        done = run_step(repo, server, tmp_path / "bin")
    assert done.returncode == 1
    assert "output of check tests" in done.stdout
    root = junit_root(repo / "patchbox-out" / "junit.xml")
    failed = [c.get("name") for c in root.iter("testcase") if c.find("failure") is not None]
    assert failed == ["test_capital"]


def test_a_command_that_fails_before_any_job_writes_a_failing_report(tmp_path: Path) -> None:
    repo = project(tmp_path / "repo", {"tests": PYTEST_CHECK}, "p")
    (repo / ".patchbox" / "task.json").write_text('{"prompt": "p", "unknown": 1}')
    with LoopbackServer() as server:
        done = run_step(repo, server, tmp_path / "bin")
    assert done.returncode == 2
    out = repo / "patchbox-out"
    assert sorted(p.name for p in out.iterdir()) == ["error.json", "junit.xml"]
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
