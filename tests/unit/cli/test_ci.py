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
from pathlib import Path
from typing import Any

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


def test_the_github_workflow_is_bounded_and_keeps_one_run_per_pull_request() -> None:
    flow = workflow("GitHub Actions")
    assert flow["concurrency"] == {
        "group": "patchbox-${{ github.event.pull_request.number }}",
        "cancel-in-progress": True,
    }
    for job in flow["jobs"].values():
        assert 0 < job["timeout-minutes"] <= 120


def test_writing_is_the_report_job_s_alone_and_it_runs_no_code() -> None:
    """Only ``report`` may write (checks, the pull request's comments); it needs the job,
    runs whether it passed or failed (not when cancelled), skips pull requests from forks (their token cannot write), and
    has no ``run`` step: only actions that read the artifacts as data."""
    jobs = workflow("GitHub Actions")["jobs"]
    report = jobs["report"]
    assert report["permissions"] == {
        "contents": "read",
        "checks": "write",
        "pull-requests": "write",
    }
    assert report["needs"] == "patchbox"
    assert report["if"].startswith("${{ !cancelled() && ")
    assert "head.repo.full_name == github.repository" in report["if"]
    assert all("run" not in step for step in report["steps"])
    uses = [str(step["uses"]).split("@", 1)[0] for step in report["steps"]]
    assert uses == [
        "actions/checkout",
        "actions/download-artifact",
        "dorny/test-reporter",
        "actions/github-script",
    ]
    assert report["steps"][0]["with"] == {"persist-credentials": False}
    upload = next(s for s in jobs["patchbox"]["steps"] if s.get("name") == "Publish the artifacts")
    assert upload["if"] == "always()"
    download = report["steps"][1]["with"]
    assert download == {"name": upload["with"]["name"], "path": "patchbox-out"}
    junit = report["steps"][2]["with"]
    assert (junit["path"], junit["reporter"]) == ("patchbox-out/junit.xml", "java-junit")


def test_the_image_cache_is_restored_built_and_saved_in_one_folder() -> None:
    steps = {s.get("name"): s for s in github_steps()}
    folder = "${{ runner.temp }}/patchbox-images"
    restore, build, save = (
        steps["Restore the images"],
        steps["Build the images"],
        steps["Save the images"],
    )
    assert restore["uses"] == "actions/cache/restore@v4"
    assert restore["with"]["path"] == save["with"]["path"] == folder
    assert restore["with"]["restore-keys"] == "patchbox-images-${{ runner.os }}-"
    assert save["uses"] == "actions/cache/save@v4"
    assert save["if"] == "steps.images.outputs.key != ''"
    assert save["with"]["key"] == "${{ steps.images.outputs.key }}"
    script = build["run"]
    assert 'images="$RUNNER_TEMP/patchbox-images"' in script
    assert "patchbox image build --json" in script
    assert 'patchbox env build --repo "$PWD" --task "$TASK_FILE" --json' in script
    assert "${{" not in script  # the script takes the runner's values from its environment
    names = list(steps)
    assert names.index("Build the images") < names.index("Run patchbox")


REVIEW_JS = """
const fs = require('fs');
const calls = [];
const record = (name) => async (args) => { calls.push([name, args]); return { data: [] }; };
const github = {
  rest: {
    checks: { create: record('checks.create') },
    issues: {
      listComments: 'listComments',
      createComment: record('issues.createComment'),
      updateComment: record('issues.updateComment'),
    },
  },
  paginate: async () => JSON.parse(process.env.COMMENTS),
};
const context = {
  serverUrl: 'https://github.example', runId: 7, repo: { owner: 'o', repo: 'r' },
  payload: { pull_request: { number: 5, head: { sha: 'abc' } } },
};
(async () => {
SCRIPT
})().then(() => console.log(JSON.stringify(calls)), (e) => { console.error(e); process.exit(1); });
"""


def run_review(tmp_path: Path, files: dict[str, str], comments: list[object]) -> list[Any]:
    """The workflow's ``github-script`` run by node against recording fakes of ``github``
    and ``context``, in a folder holding ``patchbox-out/`` with ``files``."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed: the workflow's github-script is not run")
    step = next(
        s
        for s in workflow("GitHub Actions")["jobs"]["report"]["steps"]
        if "with" in s and "script" in s["with"]
    )
    out = tmp_path / "patchbox-out"
    out.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (out / name).write_text(text)
    program = tmp_path / "review.js"
    program.write_text(REVIEW_JS.replace("SCRIPT", step["with"]["script"]))
    done = subprocess.run(
        [node, str(program)],
        cwd=tmp_path,
        env={**os.environ, "COMMENTS": json.dumps(comments)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    calls: list[Any] = json.loads(done.stdout)
    return calls


PATCH = "Subject: [PATCH] x\n---\n```py\n+a\n````\n"


def test_a_waiting_patch_is_posted_once_and_its_check_says_so(tmp_path: Path) -> None:
    run = {
        "job_id": "j1",
        "status": "awaiting_review",
        "error": None,
        "checks": [{"id": "tests", "status": "passed"}],
    }
    files = {"run.json": json.dumps(run), "diff.patch": PATCH}
    calls = run_review(tmp_path / "a", files, [])
    assert [name for name, _ in calls] == ["checks.create", "issues.createComment"]
    check, comment = calls[0][1], calls[1][1]
    assert check["conclusion"] == "neutral"
    assert check["output"]["title"] == "a patch awaits review"
    assert check["head_sha"] == "abc"
    assert "tests passed" in check["output"]["summary"]
    body = comment["body"]
    assert comment["issue_number"] == 5
    assert body.startswith("<!-- patchbox -->\n")
    assert "`````diff\n" + PATCH + "\n`````" in body  # a fence longer than any in the patch
    mine = {"id": 9, "user": {"type": "Bot"}, "body": "<!-- patchbox -->\nold"}
    theirs = {"id": 8, "user": {"type": "User"}, "body": "<!-- patchbox -->\nspoof"}
    calls = run_review(tmp_path / "b", files, [theirs, mine])
    assert [name for name, _ in calls] == ["checks.create", "issues.updateComment"]
    assert calls[1][1]["comment_id"] == 9


def test_no_patch_no_comment_and_a_failure_is_red(tmp_path: Path) -> None:
    quiet: dict[str, object] = {
        "job_id": "j",
        "status": "awaiting_review",
        "error": None,
        "checks": [],
    }
    calls = run_review(tmp_path / "a", {"run.json": json.dumps(quiet)}, [])
    assert [name for name, _ in calls] == ["checks.create"]
    assert calls[0][1]["conclusion"] == "success"
    assert calls[0][1]["output"]["title"] == "no change proposed"
    failed = {
        "job_id": "j",
        "status": "failed",
        "error": {"code": "CHECK_FAILED", "message": "m"},
        "checks": [{"id": "tests", "status": "failed"}],
    }
    files = {"run.json": json.dumps(failed), "diff.patch": PATCH}
    calls = run_review(tmp_path / "b", files, [])
    assert [name for name, _ in calls] == ["checks.create"]
    assert calls[0][1]["conclusion"] == "failure"
    assert calls[0][1]["output"]["title"] == "job failed: CHECK_FAILED"
    error = {"error": {"code": "USAGE_ERROR", "message": "bad task"}}
    calls = run_review(tmp_path / "c", {"error.json": json.dumps(error)}, [])
    assert calls[0][1]["conclusion"] == "failure"
    assert calls[0][1]["output"]["title"] == "job not started: USAGE_ERROR"
