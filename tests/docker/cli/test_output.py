"""What a command writes on stderr and into the log file: progress lines with the time since
the start (none with ``--quiet``), one per tool call (``turn 2 run_check fail: failed (exit
3)``), log lines as console text or JSON (``--log-format``), a provider's requests only with
``--verbose`` or ``--log-format json``, every event in ``$PATCHBOX_HOME/logs/patchbox.log``,
whole lines that never interleave, and a heartbeat while one step lasts."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.support.cli import job_files, patchbox
from tests.support.jobs import EDIT, GREET, call, make_repo
from tests.support.loopback import LoopbackServer, json_reply
from tests.support.openai import chat_json

PROGRESS = re.compile(r"^patchbox: \[ *\d+\.\d+s\] \S")


def test_a_job_shows_timed_progress_and_quiet_shows_none(
    docker_client: object, sandbox_image: str, tmp_path: Path
) -> None:
    del docker_client, sandbox_image
    repo = make_repo(tmp_path / "repo")
    task = {
        "prompt": "Capitalize the greeting.",
        "checks": {"greet": GREET},
        "limits": {"memory_mb": 512, "workspace_mb": 64, "tmp_mb": 32},
    }
    args = job_files(tmp_path / "job", task, {"turns": [[call("c1", EDIT)]], "final": "done"})
    loud = patchbox("run", "--repo", str(repo), *args, "--json")
    assert loud.returncode == 0, loud.stderr
    lines = loud.stderr.splitlines()
    assert lines
    assert all(PROGRESS.match(line) for line in lines), lines
    assert [line.split("] ", 1)[1] for line in lines][:3] == [
        "preparing",
        "checks before the change",  # the required check runs once on the baseline
        "running",
    ]
    args = job_files(tmp_path / "job2", task, {"turns": [[call("c1", EDIT)]], "final": "done"})
    quiet = patchbox("run", "--repo", str(repo), *args, "--json", "--quiet")
    assert quiet.returncode == 0
    assert quiet.stderr == ""
    assert json.loads(quiet.stdout)["status"] == "awaiting_review"


def _tail(line: str) -> str:
    return line.split("] ", 1)[1]


def test_a_line_per_tool_call_with_the_checks_own_verdict(
    docker_client: object, sandbox_image: str, tmp_path: Path
) -> None:
    del docker_client, sandbox_image
    repo = make_repo(tmp_path / "repo")
    task = {
        "prompt": "Capitalize the greeting.",
        "checks": {"greet": GREET, "fail": {"argv": ["sh", "-c", "exit 3"], "required": False}},
        "limits": {"memory_mb": 512, "workspace_mb": 64, "tmp_mb": 32},
    }
    turns = [
        [call("c1", {"name": "read_file", "arguments": {"path": "app.py"}})],
        [call("c2", {"name": "run_check", "arguments": {"checkId": "fail"}})],
        [call("c3", {"name": "search_text", "arguments": {"query": "hello"}})],
        [call("c4", {"name": "read_file", "arguments": {"path": "no/such.py"}})],
        [call("c5", EDIT)],
        [call("c6", {"name": "run_check", "arguments": {"checkId": "greet"}})],
    ]
    args = job_files(tmp_path / "job", task, {"turns": turns, "final": "done"})
    proc = patchbox("run", "--repo", str(repo), *args)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    assert all(PROGRESS.match(line) for line in lines), lines
    calls = [_tail(line) for line in lines if _tail(line).startswith("turn ")]
    assert calls == [
        "turn 1 read_file app.py",
        "turn 2 run_check fail: failed (exit 3)",
        'turn 3 search_text "hello"',
        "turn 4 read_file no/such.py: error TOOL_FILE_NOT_FOUND",
        "turn 5 replace_text app.py",
        "turn 6 run_check greet: passed (exit 0)",
    ]
    tails = [_tail(line) for line in lines]
    assert tails.index("running") < tails.index(calls[0]) < tails.index("validating")


def test_a_providers_requests_are_logged_only_when_asked(
    docker_client: object, sandbox_image: str, tmp_path: Path
) -> None:
    del docker_client, sandbox_image
    repo = make_repo(tmp_path / "repo")
    task = {"prompt": "Read the app.", "limits": {"memory_mb": 512, "workspace_mb": 64}}
    (tmp_path / "task.json").write_text(json.dumps(task))
    (tmp_path / "config.toml").write_text("spare_sandboxes = 0\n")
    read = ("c1", "read_file", json.dumps({"path": "app.py"}))
    edit = ("c2", "replace_text", json.dumps(EDIT["arguments"]))
    env = {
        "OPENAI_API_KEY": "sk-test-not-a-real-key",
        "PATCHBOX_MODEL": "m",
    }
    base = ["run", "--repo", str(repo), "--task", str(tmp_path / "task.json")]
    base += ["--config", str(tmp_path / "config.toml"), "--json"]
    outputs = {}
    for extra in ([], ["--verbose"], ["--log-format", "json"]):
        with LoopbackServer() as server:
            server.play(
                json_reply(chat_json([read])),
                json_reply(chat_json([edit])),
                json_reply(chat_json([], "done")),
            )
            proc = patchbox(*base, *extra, env=env | {"OPENAI_BASE_URL": server.url})
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["status"] == "awaiting_review"
        outputs[" ".join(extra)] = proc.stderr
    plain = outputs[""].splitlines()
    assert all(PROGRESS.match(line) for line in plain), plain  # progress only
    assert [_tail(line) for line in plain if _tail(line).startswith("turn ")] == [
        "turn 1 read_file app.py",
        "turn 2 replace_text app.py",
    ]
    assert "provider_request" not in outputs[""]
    assert "provider_request" in outputs["--verbose"]
    logged = [
        json.loads(line)
        for line in outputs["--log-format json"].splitlines()
        if not PROGRESS.match(line)
    ]
    assert [e["event"] for e in logged if e["event"].startswith("provider_")] == [
        "provider_request",
        "provider_turn",
    ] * 3
    assert all(e["level"] != "debug" for e in logged)
    for text in outputs.values():
        assert "sk-test-not-a-real-key" not in text
