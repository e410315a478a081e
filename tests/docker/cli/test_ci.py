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
import subprocess
import tarfile
import uuid
from pathlib import Path
from typing import Any

import docker
import pytest

from tests.support.ci import (
    KEY,
    PYTEST_CHECK,
    github_steps,
    gitlab_script,
    junit_root,
    project,
    run_step,
    runner_env,
)
from tests.support.git import git
from tests.support.jobs import APP_AFTER
from tests.support.loopback import LoopbackServer, json_reply

SUMMARY = "**Capitalized the greeting in greet().**\n\nNothing else changed."
EDIT_ARGS = json.dumps({"path": "app.py", "oldText": '"hello "', "newText": '"Hello "'})


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
            json_reply(chat([], SUMMARY)),
        )
        done = run_step(repo, server, tmp_path / "bin")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "review: patchbox show" in done.stdout
    out = repo / "patchbox-out"
    names = sorted(p.name for p in out.iterdir())
    assert names == [
        ".gitignore",
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
    assert json.loads(evidence)["transcript"][-1]["text"] == SUMMARY
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
    assert subject == "Capitalized the greeting in greet()."  # the model's summary
    assert "    Task:" in body
    assert "    Capitalize the greeting." in body
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


def test_an_output_folder_in_the_checkout_is_kept_and_never_makes_it_dirty(
    docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> None:
    """The documented step twice in one checkout: the second job is not refused for the
    first one's output folder (it is no local change), and when it fails its folder keeps
    what was put in it."""
    del docker_client, sandbox_image
    repo = project(tmp_path / "repo", {"tests": PYTEST_CHECK}, "Capitalize the greeting.")
    out = repo / "patchbox-out"
    with LoopbackServer() as server:
        server.play(
            json_reply(chat([("c1", "replace_text", EDIT_ARGS)])),
            json_reply(chat([], SUMMARY)),
        )
        first = run_step(repo, server, tmp_path / "bin")
    assert first.returncode == 0, first.stderr[-3000:]
    assert (out / "diff.patch").is_file()
    assert git(repo, "status", "--porcelain", "--untracked-files=all") == ""
    (out / "keep.txt").write_text("the CI's own notes\n")
    wrong = json.dumps({"path": "app.py", "oldText": '"hello "', "newText": '"HELLO "'})
    with LoopbackServer() as server:
        server.play(
            json_reply(chat([("c1", "replace_text", wrong)])),
            json_reply(chat([], "done")),
        )
        second = run_step(repo, server, tmp_path / "bin")
    assert second.returncode == 1, second.stderr[-3000:]
    run = json.loads((out / "run.json").read_text())
    assert run["status"] == "failed"
    assert run["error"]["code"] != "CONSENT_REQUIRED"
    assert [c["id"] for c in run["checks"]] == ["tests"]  # the job ran to its checks
    assert (out / "keep.txt").read_text() == "the CI's own notes\n"
    assert (out / ".gitignore").is_file()
    assert {"junit.xml", "evidence.json", "diff.patch"} <= {p.name for p in out.iterdir()}


def images_step(checkout: Path, temp: Path, output: Path) -> tuple[str, str]:
    """docs/ci.md's "Build the images" step, as the runner runs it; its ``GITHUB_OUTPUT``."""
    step = next(s for s in github_steps() if s.get("name") == "Build the images")
    assert step["shell"] == "bash"
    output.write_text("")
    done = subprocess.run(
        ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", step["run"]],
        cwd=checkout,
        env={
            **runner_env_without_provider(),
            "RUNNER_TEMP": str(temp),
            "RUNNER_OS": "Linux",
            "GITHUB_OUTPUT": str(output),
            "TASK_FILE": str(temp / "patchbox-task.json"),
        },
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return output.read_text(), done.stdout + done.stderr


def runner_env_without_provider() -> dict[str, str]:
    with LoopbackServer() as server:
        env = runner_env(server, Path(os.environ.get("TMPDIR", "/tmp")) / f"bin-{uuid.uuid4().hex}")
    return {k: v for k, v in env.items() if not k.startswith(("OPENAI_", "PATCHBOX_"))}


@pytest.mark.docker
def test_the_image_cache_step_saves_once_and_loads_what_it_saved(
    docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> None:
    """The images step on a runner, for a task with an environment: the first run builds
    the environment and saves it with the sandbox image under a key of their ids; the next,
    with the cache restored, loads them and saves nothing (same key); a cache of other
    images (another digest) is saved again."""
    marker = uuid.uuid4().hex
    repo = project(tmp_path / "repo", {"tests": PYTEST_CHECK}, "p")
    temp = tmp_path / "runner-temp"
    temp.mkdir()
    task = json.loads((repo / ".patchbox" / "task.json").read_text())
    task["environment"] = {"setup": [["sh", "-c", f"echo {marker} > /opt/m"]]}
    (temp / "patchbox-task.json").write_text(json.dumps(task))
    try:
        output, log = images_step(repo, temp, tmp_path / "out1")
        [env_image] = [
            i
            for i in docker_client.images.list(filters={"label": "io.patchbox.kind=environment"})
            if marker in json.dumps(i.labels)
        ]
        digest = (temp / "patchbox-images" / "digest").read_text().strip()
        assert output == f"key=patchbox-images-Linux-{digest}\n", log[-3000:]
        assert len(digest) == 32
        tar = temp / "patchbox-images" / "images.tar"
        with tarfile.open(tar) as archive:
            names = "\n".join(archive.getnames())
        for image in (docker_client.images.get(sandbox_image), env_image):
            assert (image.id or "").removeprefix("sha256:") in names
        again, log = images_step(repo, temp, tmp_path / "out2")
        assert again == ""  # nothing new: the restored cache stays
        assert "Loaded image" in log
        assert docker_client.images.get(env_image.tags[0]).id == env_image.id  # not rebuilt
        (temp / "patchbox-images" / "digest").write_text("older\n")
        third, _ = images_step(repo, temp, tmp_path / "out3")
        assert third == output
    finally:
        for image in docker_client.images.list(filters={"label": "io.patchbox.kind=environment"}):
            if marker in json.dumps(image.labels):
                docker_client.images.remove(image.id or "", force=True)


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
        env = {
            **runner_env(server, tmp_path / "bin"),
            "RUNNER_TEMP": str(temp),
            "RUNNER_OS": "Linux",
            "GITHUB_OUTPUT": str(tmp_path / "github-output"),
        }
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
        assert len(outs) == 3  # the task, the images, the job
        assert (temp / "patchbox-images" / "images.tar").is_file()
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
