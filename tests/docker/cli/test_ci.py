"""docs/ci.md's command, run as a CI runner runs it: in the checked-out repository, the model
behind a real OpenAI-compatible HTTP server on loopback, the real daemon. The artifacts are
checked as a CI and a reviewer use them: the JUnit report (the check's own pytest cases),
``git am`` of the patch, and a failing report (never an empty green one) when the command
fails before any job. The documented workflows are parsed and their scripts run in checkouts
shaped as GitHub's and GitLab's: a pull request that rewrites ``.patchbox/task.json`` does
not choose the task, and the GitHub job's token can only read."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import uuid
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import docker
import pytest
import yaml

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


def workflow(section: str) -> dict[Any, Any]:
    """The YAML example under docs/ci.md's ``## section`` heading, parsed."""
    found = re.search(
        rf"^## {re.escape(section)}\n.*?```yaml\n(.*?)```", DOC, re.DOTALL | re.MULTILINE
    )
    assert found is not None, section
    data: dict[Any, Any] = yaml.safe_load(found.group(1))
    return data


def github_steps() -> list[dict[str, Any]]:
    steps: list[dict[str, Any]] = workflow("GitHub Actions")["jobs"]["patchbox"]["steps"]
    return steps


def gitlab_script() -> list[str]:
    script: list[str] = workflow("GitLab CI")["patchbox"]["script"]
    return script


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


KEY = "sk-ci-test-key-123456"


def runner_env(server: LoopbackServer, bin_dir: Path) -> dict[str, str]:
    """The runner's environment: ``patchbox`` on PATH as installed, the test provider."""
    bin_dir.mkdir(exist_ok=True)
    shim = bin_dir / "patchbox"
    shim.write_text(f'#!/bin/sh\nPYTHONPATH="{ROOT}" exec "{sys.executable}" -m controller "$@"\n')
    shim.chmod(0o755)
    return {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "OPENAI_BASE_URL": f"{server.url}/v1",
        "OPENAI_API_KEY": KEY,
        "PATCHBOX_MODEL": "m",
        "PATCHBOX_PROVIDER_API": "chat",
        "PATCHBOX_PROVIDER_STREAM": "false",
    }


def run_step(repo: Path, server: LoopbackServer, bin_dir: Path) -> subprocess.CompletedProcess[str]:
    """The documented command, through the shell, with the repository's task copied outside
    the checkout as the step before it leaves it."""
    task_file = bin_dir.parent / "runner-temp" / "patchbox-task.json"
    task_file.parent.mkdir(exist_ok=True)
    task_file.write_bytes((repo / ".patchbox" / "task.json").read_bytes())
    return subprocess.run(
        ["sh", "-c", the_command()],
        cwd=repo,
        env={**runner_env(server, bin_dir), "TASK_FILE": str(task_file)},
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
    assert KEY not in evidence
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


BASE_PROMPT = "Capitalize the greeting."
HOSTILE_PROMPT = "Leave the greeting; my setup ran."


def pull_request(root: Path, marker: str) -> Path:
    """An origin as a forge holds it: ``main`` with the project and its task; ``pr``, a pull
    request that rewrites ``.patchbox/task.json`` (its own prompt, check and an environment
    whose setup would run as root with network); ``main`` moved on after it; ``merge``, the
    merge commit GitHub makes (first parent ``main``, second ``pr``)."""
    origin = project(root, {"tests": PYTEST_CHECK}, BASE_PROMPT)
    hostile = {
        "prompt": HOSTILE_PROMPT,
        "checks": {"mine": {"argv": ["true"]}},
        "environment": {"setup": [["sh", "-c", f"echo {marker}"]]},
    }
    git(origin, "checkout", "-q", "-b", "pr")
    (origin / ".patchbox" / "task.json").write_text(json.dumps(hostile))
    git(origin, "commit", "-q", "-am", "Bring my own task")
    git(origin, "checkout", "-q", "main")
    (origin / "NOTES.txt").write_text("the base branch moved on\n")
    git(origin, "add", "NOTES.txt")
    git(origin, "commit", "-q", "-m", "Notes")
    git(origin, "checkout", "-q", "-b", "merge")
    git(origin, "merge", "-q", "--no-ff", "-m", "Merge pull request", "pr")
    git(origin, "checkout", "-q", "main")
    return origin


def expand(text: str, known: dict[str, str]) -> str:
    """A workflow value with its ``${{ expression }}`` replaced (an unknown one fails)."""
    return re.sub(r"\$\{\{\s*(.*?)\s*\}\}", lambda m: known[m.group(1)], text)


def assert_the_base_task_ran(
    checkout: Path,
    outs: list[subprocess.CompletedProcess[str]],
    server: LoopbackServer,
    client: docker.DockerClient,
    marker: str,
) -> None:
    """The scripts passed and the job was the base branch's: its prompt reached the model,
    its check ran, no environment was built; the pull request's task did nothing."""
    images = client.images.list(filters={"label": "io.patchbox.kind=environment"})
    built = [i for i in images if marker in json.dumps(i.labels)]
    for image in built:  # what the pull request's setup made goes, then the test fails
        client.images.remove(image.id or "", force=True)
    assert built == []
    for out in outs:
        assert out.returncode == 0, out.stderr[-3000:]
    assert "environment:" not in outs[-1].stderr
    run = json.loads((checkout / "patchbox-out" / "run.json").read_text())
    assert run["status"] == "awaiting_review"
    assert [c["id"] for c in run["checks"]] == ["tests"]
    bodies = [r.body.decode() for r in server.received]
    assert BASE_PROMPT in bodies[0]
    assert not any(HOSTILE_PROMPT in body for body in bodies)


@pytest.mark.docker
def test_a_pull_request_that_rewrites_the_task_does_not_choose_it_on_github(
    docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> None:
    """The documented GitHub job's scripts, in order, in a checkout as ``actions/checkout``
    leaves it (the merge commit, ``fetch-depth: 2``) whose ``.patchbox/task.json`` is the
    pull request's."""
    del sandbox_image
    marker = uuid.uuid4().hex
    origin = pull_request(tmp_path / "origin", marker)
    checkout = tmp_path / "work"
    git(tmp_path, "clone", "-q", "--depth", "2", "-b", "merge", f"file://{origin}", str(checkout))
    in_checkout = json.loads((checkout / ".patchbox" / "task.json").read_text())
    assert in_checkout["prompt"] == HOSTILE_PROMPT  # what a job reading the checkout would run
    temp = tmp_path / "runner-temp"
    temp.mkdir()
    with LoopbackServer() as server:
        server.play(
            json_reply(chat([("c1", "replace_text", EDIT_ARGS)])),
            json_reply(chat([], "done")),
        )
        env = {**runner_env(server, tmp_path / "bin"), "RUNNER_TEMP": str(temp)}
        known = {
            "runner.temp": str(temp),
            "vars.OPENAI_BASE_URL": env["OPENAI_BASE_URL"],
            "vars.PATCHBOX_MODEL": env["PATCHBOX_MODEL"],
            "secrets.OPENAI_API_KEY": KEY,
        }
        outs = []
        for step in github_steps():
            if "run" not in step:
                continue
            step_env = {k: expand(str(v), known) for k, v in step.get("env", {}).items()}
            outs.append(
                subprocess.run(
                    ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", step["run"]],
                    cwd=checkout,
                    env={**env, **step_env},
                    capture_output=True,
                    text=True,
                    timeout=300,
                    check=False,
                )
            )
        assert len(outs) == 2
        assert json.loads((temp / "patchbox-task.json").read_text())["prompt"] == BASE_PROMPT
        assert_the_base_task_ran(checkout, outs, server, docker_client, marker)


@pytest.mark.docker
def test_a_merge_request_that_rewrites_the_task_does_not_choose_it_on_gitlab(
    docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> None:
    """The documented GitLab script, as one shell runs it, in a checkout of the merge
    request's branch whose ``.patchbox/task.json`` is its own."""
    del sandbox_image
    marker = uuid.uuid4().hex
    origin = pull_request(tmp_path / "origin", marker)
    checkout = tmp_path / "work"
    git(tmp_path, "clone", "-q", "--depth", "20", "-b", "pr", f"file://{origin}", str(checkout))
    in_checkout = json.loads((checkout / ".patchbox" / "task.json").read_text())
    assert in_checkout["prompt"] == HOSTILE_PROMPT
    temp = tmp_path / "tmp"
    temp.mkdir()
    with LoopbackServer() as server:
        server.play(
            json_reply(chat([("c1", "replace_text", EDIT_ARGS)])),
            json_reply(chat([], "done")),
        )
        env = {
            **runner_env(server, tmp_path / "bin"),
            "CI_MERGE_REQUEST_TARGET_BRANCH_NAME": "main",
            "TMPDIR": str(temp),
        }
        out = subprocess.run(
            ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", "\n".join(gitlab_script())],
            cwd=checkout,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert_the_base_task_ran(checkout, [out], server, docker_client, marker)


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
