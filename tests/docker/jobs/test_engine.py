"""Whole jobs on the real daemon: the scripted and an OpenAI-compatible provider
drive the same loop; the diff, ledger, checks, decisions, limits, cancellation and cleanup are
asserted exactly, and the user's repository is compared byte for byte."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import docker
import pytest

from controller.changes.apply import revert_changeset
from controller.changes.collect import ChangedFile, Collected
from controller.config.host import HostConfig
from controller.config.task import TaskSpec
from controller.errors import ErrorCode, InternalError, PatchboxError
from controller.jobs.decision import GATE_HINTS
from controller.jobs.engine import Job
from controller.jobs.reconcile import reconcile
from controller.jobs.records import JobRecord, LedgerEntry
from controller.jobs.request import JobRequest
from controller.jobs.store import JobStore
from controller.jobs.summary import transcript_text
from controller.providers import (
    ModelTurn,
    ProviderConfig,
    ScriptedProvider,
    ToolResult,
    open_provider,
)
from controller.providers.base import Provider
from controller.sandbox.base import Runtime
from controller.sandbox.docker import DockerSandbox
from tests.support.git import git
from tests.support.jobs import (
    APP,
    APP_AFTER,
    EDIT,
    GREET,
    README,
    blob,
    call,
    check_call,
    code_of,
    containers_of,
    evidence_of,
    make_repo,
    make_task,
    new_job,
    patch_call,
    scripted,
    search_call,
    sha256,
    snapshot,
    states,
    stored,
)
from tests.support.loopback import LoopbackServer, hang, json_reply, serve
from tests.support.paths import REPO_ROOT

pytestmark = pytest.mark.docker

README_AFTER = "# demo\n\nGreets people.\n"
README_PATCH = (
    "diff --git a/README.md b/README.md\n--- a/README.md\n+++ b/README.md\n"
    "@@ -1 +1,3 @@\n # demo\n+\n+Greets people.\n"
)
DELETE_NOTES = (
    "diff --git a/notes.txt b/notes.txt\ndeleted file mode 100644\n"
    "--- a/notes.txt\n+++ /dev/null\n@@ -1 +0,0 @@\n-old notes\n"
)
KEY = "sk-planted-7d1c0e5b9a2f4e83"


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "greet")


# -- 1. a full job -------------------------------------------------------------------------


def expected_diff() -> str:
    return (
        "diff --git a/README.md b/README.md\n"
        f"index {blob(README)}..{blob(README_AFTER)} 100644\n"
        "--- a/README.md\n+++ b/README.md\n"
        "@@ -1 +1,3 @@\n # demo\n+\n+Greets people.\n"
        "diff --git a/app.py b/app.py\n"
        f"index {blob(APP)}..{blob(APP_AFTER)} 100644\n"
        "--- a/app.py\n+++ b/app.py\n"
        "@@ -1,2 +1,2 @@\n def greet(name):\n"
        '-    return "hello " + name\n+    return "Hello " + name\n'
    )


def test_full_job_reaches_review_with_exact_diff_ledger_and_checks(
    client: docker.DockerClient, repo: Path, runtime: Runtime
) -> None:
    before = snapshot(repo)
    provider = scripted(
        [search_call("c1")],
        [{"id": "c2", "name": "read_file", "arguments": {"path": "app.py"}}],
        [call("c3", EDIT)],
        [check_call("c4", "greet")],
        [patch_call("c5", README_PATCH)],
        final="greeting capitalized",
    )
    job = new_job(client, repo, make_task(), provider, runtime=runtime)
    record = job.run()
    assert (record.state, record.error) == ("awaiting_review", None), record.error
    assert states(record) == [
        "preparing",
        "running",
        "validating",
        "checking",
        "awaiting_review",
    ]
    diff = expected_diff()
    assert job.diff == diff
    assert record.diff_sha256 == sha256(diff)
    assert record.runtime == runtime
    assert record.final_message == "greeting capitalized"
    data = stored(record)
    assert data["tool_calls"] == [
        {"turn": 1, "id": "c1", "name": "search_text", "ok": True, "error_code": None},
        {"turn": 2, "id": "c2", "name": "read_file", "ok": True, "error_code": None},
        {"turn": 3, "id": "c3", "name": "replace_text", "ok": True, "error_code": None},
        {
            "turn": 4,
            "id": "c4",
            "name": "run_check",
            "ok": True,
            "error_code": None,
            "verdict": "greet: passed",
        },
        {"turn": 5, "id": "c5", "name": "apply_patch", "ok": True, "error_code": None},
    ]
    assert [(b["id"], b["status"], b["exit_code"]) for b in data["baseline_checks"]] == [
        ("greet", "failed", 1)
    ]
    assert data["decision"]["check_changes"] == [
        {"id": "greet", "before": "failed", "after": "passed", "change": "fixed"}
    ]
    assert data["ledger"] == [
        {
            "turn": 3,
            "id": "c3",
            "tool": "replace_text",
            "intent": "edit",
            "version_before": 1,  # the check run before the change made version 1
            "files": [{"path": "app.py", "sha256": sha256(APP_AFTER)}],
            "outcome": "done",
        },
        {
            "turn": 4,
            "id": "c4",
            "tool": "run_check",
            "intent": "check",
            "version_before": 2,
            "files": [],
            "outcome": "done",
        },
        {
            "turn": 5,
            "id": "c5",
            "tool": "apply_patch",
            "intent": "patch",
            "version_before": 3,
            "files": [{"path": "README.md", "sha256": sha256(README_AFTER)}],
            "outcome": "done",
        },
    ]
    assert data["files"] == [
        {
            "path": "README.md",
            "old_path": None,
            "kind": "modify",
            "added": 2,
            "removed": 0,
            "sha256_before": sha256(README),
            "sha256_after": sha256(README_AFTER),
            "calls": ["c5"],
        },
        {
            "path": "app.py",
            "old_path": None,
            "kind": "modify",
            "added": 1,
            "removed": 1,
            "sha256_before": sha256(APP),
            "sha256_after": sha256(APP_AFTER),
            "calls": ["c3"],
        },
    ]
    [check] = data["checks"]
    assert isinstance(check["duration_ms"], int)
    assert check["duration_ms"] >= 0
    assert check == {
        "id": "greet",
        "status": "passed",
        "exit_code": 0,
        "duration_ms": check["duration_ms"],
        "output_tail": "",
        "diff_sha256": sha256(diff),
        "required": True,
        "source": "docker-exec",
    }
    assert data["decision"] == {
        "mode": "review",
        "applied": False,
        "gates": {},
        "reason": "review: a person applies or discards",
        "check_changes": [
            {"id": "greet", "before": "failed", "after": "passed", "change": "fixed"}
        ],
    }
    assert snapshot(repo) == before
    assert containers_of(client, record.job_id) == []
    folder = JobStore().folder(record.job_id)
    assert (folder / "diff.patch").read_text() == diff
    assert JobStore().load(record.job_id).state == "awaiting_review"


# -- 2. first turn without a tool call ----------------------------------------------------


def test_first_turn_without_tool_call_fails_and_leaves_nothing(
    client: docker.DockerClient, repo: Path
) -> None:
    before = snapshot(repo)
    job = new_job(client, repo, make_task(), scripted(final="I would rather chat."))
    record = job.run()
    assert record.state == "failed"
    assert code_of(record) == "MODEL_TOOL_CALL_UNSUPPORTED"
    assert states(record) == ["preparing", "running", "failed"]
    data = stored(record)
    assert (data["tool_calls"], data["ledger"], data["files"], data["checks"]) == ([], [], [], [])
    assert job.diff is None
    assert containers_of(client, record.job_id) == []
    assert snapshot(repo) == before
    assert not (JobStore().folder(record.job_id) / "diff.patch").exists()


# -- 3. limits --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("limit", "turns", "message", "kept"),
    [
        (
            {"max_turns": 1},
            [[search_call("c1")], [search_call("c2")]],
            "more than 1 turns",
            ["c1"],
        ),
        (
            {"max_tool_calls": 2},
            [[search_call("c1"), search_call("c2")], [search_call("c3"), call("c4", EDIT)]],
            "more than 2 tool calls",
            ["c1", "c2"],
        ),
    ],
    ids=["max_turns", "max_tool_calls"],
)
def test_limits_end_the_job_with_diagnostics_kept(
    client: docker.DockerClient,
    repo: Path,
    limit: dict[str, int],
    turns: list[list[dict[str, Any]]],
    message: str,
    kept: list[str],
) -> None:
    job = new_job(client, repo, make_task(limits=limit), scripted(*turns))
    record = job.run()
    assert record.state == "failed"
    assert record.error is not None
    assert record.error.model_dump() == {"code": "LIMIT_EXCEEDED", "message": message}
    data = stored(record)
    assert [c["id"] for c in data["tool_calls"]] == kept
    assert all(c["ok"] for c in data["tool_calls"])
    assert [c["id"] for c in evidence_of(record.job_id)["tool_calls"]] == kept
    assert evidence_of(record.job_id)["status"] == "failed"
    assert containers_of(client, record.job_id) == []
    assert git(repo, "status", "--porcelain") == ""


# -- 4. one write job per repository ------------------------------------------------------

HOLD = """
import sys
from controller.jobs.store import write_lock
with write_lock(sys.argv[1]):
    print("locked", flush=True)
    sys.stdin.read()
"""


def test_second_job_on_a_locked_repository_is_refused(
    client: docker.DockerClient, repo: Path
) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(repo.resolve())],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO_ROOT,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == "locked\n"
        provider = scripted([call("c1", EDIT)])
        record = new_job(client, repo, make_task(), provider).run()
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(30)
    assert record.state == "failed"
    assert code_of(record) == "JOB_ALREADY_RUNNING"
    assert states(record) == ["failed"]
    assert provider.received == []
    assert containers_of(client, record.job_id) == []
    # released with the holder: the next job runs
    again = new_job(client, repo, make_task(checks={}), scripted([call("c1", EDIT)])).run()
    assert again.state == "awaiting_review", again.error


# -- 5. failing and overrunning checks ----------------------------------------------------

NOISY = (
    "import sys\n"
    "sys.stdout.write('\\x1b[31mFAIL\\x1b[0m: \\x1b]0;title\\x07boom\\x08\\r\\n')\n"
    "sys.stdout.write('\\x1b[2K\\x1b[1;32mline two\\x1b[m\\x00\\x7f\\n')\n"
    "sys.exit(3)\n"
)


def test_failing_check_fails_the_job_with_a_clean_tail_and_dockers_exit_code(
    client: docker.DockerClient, repo: Path
) -> None:
    task = make_task(
        checks={"greet": GREET, "noisy": {"argv": ["python3", "-c", NOISY]}},
        mode="auto",
        baseline_checks=False,  # noisy fails before too: the after alone fails the job
    )
    before = snapshot(repo)
    config = HostConfig(spare_sandboxes=0, allow_auto=True)
    record = new_job(client, repo, task, scripted([call("c1", EDIT)]), config=config).run()
    assert record.state == "failed"
    assert record.error is not None
    assert record.error.model_dump() == {
        "code": "CHECK_FAILED",
        "message": "required check(s) did not pass: noisy",
    }
    data = stored(record)
    by_id = {c["id"]: c for c in data["checks"]}
    assert by_id["greet"]["status"] == "passed"
    noisy = by_id["noisy"]
    assert (noisy["status"], noisy["exit_code"], noisy["source"]) == ("failed", 3, "docker-exec")
    assert noisy["output_tail"] == "FAIL: boom\nline two\n"
    assert noisy["diff_sha256"] == record.diff_sha256
    assert data["decision"]["gates"]["checks_passed"] is False
    assert data["decision"]["applied"] is False
    assert data["decision"]["failed_checks"] == ["noisy"]
    assert snapshot(repo) == before
    assert containers_of(client, record.job_id) == []


def test_overrunning_check_is_timed_out(client: docker.DockerClient, repo: Path) -> None:
    task = make_task(
        checks={"slow": {"argv": ["sleep", "30"], "timeout_seconds": 1}}, baseline_checks=False
    )
    started = time.monotonic()
    record = new_job(client, repo, task, scripted([call("c1", EDIT)])).run()
    assert time.monotonic() - started < 25
    assert record.state == "failed"
    assert code_of(record) == "CHECK_FAILED"
    data = stored(record)
    [check] = data["checks"]
    assert (check["status"], check["exit_code"]) == ("timed_out", 137)
    assert 1000 <= check["duration_ms"] < 10000
    assert containers_of(client, record.job_id) == []


# -- 6. decisions ------------------------------------------------------------------------


def test_auto_without_operator_enablement_falls_back_to_review(
    client: docker.DockerClient, repo: Path
) -> None:
    before = snapshot(repo)
    record = new_job(client, repo, make_task(mode="auto"), scripted([call("c1", EDIT)])).run()
    assert record.state == "awaiting_review", record.error
    data = stored(record)
    assert data["decision"]["gates"] == {
        "operator_enabled": False,
        "apply_permitted": True,
        "checks_passed": True,
        "no_deleted_file": True,
        "no_dependency_or_config_path": True,
        "no_control_characters": True,
        "baseline_unchanged": True,
    }
    assert data["decision"]["applied"] is False
    assert data["decision"]["reason"] == (
        "auto fell back to review: operator_enabled (allow_auto = false in the host configuration)"
    )
    assert snapshot(repo) == before


def test_auto_applies_when_every_gate_holds_and_reverts(
    client: docker.DockerClient, repo: Path
) -> None:
    before = snapshot(repo)
    config = HostConfig(spare_sandboxes=0, allow_auto=True)
    job = new_job(client, repo, make_task(mode="auto"), scripted([call("c1", EDIT)]), config=config)
    record = job.run()
    assert record.state == "applied", record.error
    assert states(record)[-2:] == ["checking", "applied"]
    data = stored(record)
    assert all(data["decision"]["gates"].values())
    assert data["decision"]["applied"] is True
    assert (repo / "app.py").read_text() == APP_AFTER
    assert git(repo, "status", "--porcelain") == " M app.py\n"
    assert git(repo, "diff", "--full-index") == job.diff
    reverted = revert_changeset(record.job_id)
    assert [f.path for f in reverted.files] == ["app.py"]
    assert snapshot(repo) == before


@pytest.mark.parametrize(
    ("calls", "allowed", "gate"),
    [
        ([patch_call("c1", DELETE_NOTES)], None, "no_deleted_file"),
        (
            [
                {
                    "id": "c1",
                    "name": "replace_text",
                    "arguments": {
                        "path": "requirements.txt",
                        "oldText": "2.31.0",
                        "newText": "2.32.3",
                    },
                }
            ],
            ["requirements.txt"],
            "no_dependency_or_config_path",
        ),
        (
            [
                {
                    "id": "c1",
                    "name": "replace_text",
                    "arguments": {
                        "path": "app.py",
                        "oldText": '"hello "',
                        "newText": '"Hello \x1b[1A\x1b[2K\u202e"',
                    },
                }
            ],
            None,
            "no_control_characters",
        ),
    ],
    ids=["deleted_file", "dependency_file", "control_characters"],
)
def test_auto_falls_back_when_a_gate_fails(
    client: docker.DockerClient,
    repo: Path,
    calls: list[dict[str, Any]],
    allowed: list[str] | None,
    gate: str,
) -> None:
    before = snapshot(repo)
    config = HostConfig(spare_sandboxes=0, allow_auto=True)
    task = make_task(
        mode="auto",
        allowed_paths=allowed,
        checks={"ok": {"argv": ["true"]}},
    )
    record = new_job(client, repo, task, scripted(calls), config=config).run()
    assert record.state == "awaiting_review", record.error
    data = stored(record)
    gates = data["decision"]["gates"]
    assert {name for name, ok in gates.items() if not ok} == {gate}
    assert data["decision"]["reason"] == f"auto fell back to review: {gate} ({GATE_HINTS[gate]})"
    assert snapshot(repo) == before


def test_auto_falls_back_when_the_users_file_changed_during_the_job(
    client: docker.DockerClient, repo: Path
) -> None:
    def edit_during_checks(message: str) -> None:
        if message == "checking":
            (repo / "app.py").write_text(APP + "# mine\n")

    config = HostConfig(spare_sandboxes=0, allow_auto=True)
    job = new_job(
        client,
        repo,
        make_task(mode="auto"),
        scripted([call("c1", EDIT)]),
        config=config,
        progress=edit_during_checks,
    )
    record = job.run()
    assert record.state == "awaiting_review", record.error
    data = stored(record)
    assert data["decision"]["gates"]["baseline_unchanged"] is False
    assert (repo / "app.py").read_text() == APP + "# mine\n"


def test_auto_applies_after_an_unrelated_commit_during_the_job(
    client: docker.DockerClient, repo: Path
) -> None:
    """HEAD moving (a commit of another file) does not block auto: the touched paths are as
    in the baseline, which is what apply needs."""

    def commit_during_checks(message: str) -> None:
        if message == "checking":
            (repo / "README.md").write_text("# changed meanwhile\n")
            git(repo, "commit", "-qam", "meanwhile")

    config = HostConfig(spare_sandboxes=0, allow_auto=True)
    task = make_task(mode="auto", checks={"ok": {"argv": ["true"]}})
    job = new_job(
        client,
        repo,
        task,
        scripted([call("c1", EDIT)]),
        config=config,
        progress=commit_during_checks,
    )
    record = job.run()
    assert record.state == "applied", (record.error, record.decision)
    assert (repo / "app.py").read_text() == APP_AFTER
    assert (repo / "README.md").read_text() == "# changed meanwhile\n"


def test_auto_apply_conflict_is_reported_in_the_decision(
    client: docker.DockerClient, repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gate passed, then the file changed before the write: apply refuses, the job
    falls back to review and says why."""
    monkeypatch.setattr("controller.jobs.engine.baseline_unchanged", lambda *_a: True)

    def edit_during_checks(message: str) -> None:
        if message == "checking":
            (repo / "app.py").write_text(APP + "# mine\n")

    config = HostConfig(spare_sandboxes=0, allow_auto=True)
    job = new_job(
        client,
        repo,
        make_task(mode="auto"),
        scripted([call("c1", EDIT)]),
        config=config,
        progress=edit_during_checks,
    )
    record = job.run()
    assert record.state == "awaiting_review", record.error
    data = stored(record)
    assert data["decision"]["applied"] is False
    assert "app.py" in data["decision"]["apply_conflict"]
    assert (repo / "app.py").read_text() == APP + "# mine\n"


@pytest.mark.parametrize(
    ("allow", "consent", "reason"),
    [
        (
            True,
            False,
            "trusted-auto fell back to review: no consent to it (consent_trusted_auto is not set)",
        ),
        (
            False,
            True,
            (
                "trusted-auto fell back to review: not enabled by the operator "
                "(allow_trusted_auto = false in the host configuration)"
            ),
        ),
    ],
    ids=["no_consent", "not_enabled"],
)
def test_trusted_auto_needs_enablement_and_consent(
    client: docker.DockerClient, repo: Path, allow: bool, consent: bool, reason: str
) -> None:
    before = snapshot(repo)
    config = HostConfig(spare_sandboxes=0, allow_trusted_auto=allow)
    record = new_job(
        client,
        repo,
        make_task(mode="trusted-auto"),
        scripted([call("c1", EDIT)]),
        config=config,
        consent_trusted_auto=consent,
    ).run()
    assert record.state == "awaiting_review", record.error
    data = stored(record)
    assert data["decision"]["reason"] == reason
    assert data["decision"]["applied"] is False
    assert [(c["status"], c["source"]) for c in data["checks"]] == [("passed", "docker-exec")]
    assert snapshot(repo) == before


def test_trusted_auto_fallback_with_a_failing_check_fails(
    client: docker.DockerClient, repo: Path
) -> None:
    task = make_task(
        mode="trusted-auto", checks={"bad": {"argv": ["false"]}}, baseline_checks=False
    )
    record = new_job(
        client,
        repo,
        task,
        scripted([call("c1", EDIT)]),
        config=HostConfig(spare_sandboxes=0, allow_trusted_auto=True),
    ).run()
    assert record.state == "failed"
    assert code_of(record) == "CHECK_FAILED"
    data = stored(record)
    assert data["checks"][0]["status"] == "failed"


def test_trusted_auto_applies_and_never_claims_checks_passed(
    client: docker.DockerClient, repo: Path
) -> None:
    before = snapshot(repo)
    config = HostConfig(spare_sandboxes=0, allow_trusted_auto=True)
    task = make_task(mode="trusted-auto", checks={"greet": GREET, "bad": {"argv": ["false"]}})
    record = new_job(
        client, repo, task, scripted([call("c1", EDIT)]), config=config, consent_trusted_auto=True
    ).run()
    assert record.state == "applied", record.error
    assert (repo / "app.py").read_text() == APP_AFTER
    data = stored(record)
    assert [(c["id"], c["status"], c["exit_code"], c["source"]) for c in data["checks"]] == [
        ("greet", "skipped", None, "none"),
        ("bad", "skipped", None, "none"),
    ]
    assert data["decision"]["checks"] == "skipped (trusted-auto): no claim that checks passed"
    assert "passed" not in json.dumps(data["decision"]).replace("no claim that checks passed", "")
    assert "checks" not in record.timings_ms
    evidence = evidence_of(record.job_id)
    assert all(c["status"] == "skipped" for c in evidence["checks"])
    revert_changeset(record.job_id)
    assert snapshot(repo) == before


# -- 8. cancellation ------------------------------------------------------------------------


def run_in_thread(job: Job) -> tuple[threading.Thread, list[JobRecord]]:
    out: list[JobRecord] = []
    thread = threading.Thread(target=lambda: out.append(job.run()), daemon=True)
    thread.start()
    return thread, out


def cancel_when(
    client: docker.DockerClient,
    repo: Path,
    task: TaskSpec,
    provider: Provider,
    stage: str,
    delay: float,
) -> tuple[JobRecord, float]:
    """Runs a job, cancels it ``delay`` s after it reached ``stage``; returns the record and
    how long the job took to end after the cancel."""
    reached = threading.Event()

    def progress(message: str) -> None:
        if message == stage:
            reached.set()

    job = new_job(client, repo, task, provider, progress=progress)
    thread, out = run_in_thread(job)
    assert reached.wait(240), f"the job never reached {stage}"
    time.sleep(delay)
    cancelled_at = time.monotonic()
    job.cancel()
    thread.join(60)
    assert not thread.is_alive()
    return out[0], time.monotonic() - cancelled_at


def test_cancel_kills_a_check_running_in_the_loop(client: docker.DockerClient, repo: Path) -> None:
    task = make_task(
        checks={"slow": {"argv": ["sleep", "60"], "timeout_seconds": 120}}, baseline_checks=False
    )
    record, took = cancel_when(
        client, repo, task, scripted([check_call("c1", "slow")]), "running", 2.0
    )
    assert took < 5
    assert record.state == "cancelled"
    assert code_of(record) == "CANCELLED"
    assert record.error is not None  # the cancel's words, not the killed check's channel's
    assert record.error.message == "the job was cancelled"
    data = stored(record)
    assert data["tool_calls"] == [
        {
            "turn": 1,
            "id": "c1",
            "name": "run_check",
            "ok": False,
            "error_code": "CANCELLED",
            "error_message": "the job was cancelled while the call ran",
        }
    ]
    assert [(e["id"], e["outcome"]) for e in data["ledger"]] == [("c1", "unknown")]
    assert containers_of(client, record.job_id) == []
    assert git(repo, "status", "--porcelain") == ""


def test_cancel_kills_a_required_check(client: docker.DockerClient, repo: Path) -> None:
    task = make_task(
        checks={"slow": {"argv": ["sleep", "60"], "timeout_seconds": 120}}, baseline_checks=False
    )
    record, took = cancel_when(client, repo, task, scripted([call("c1", EDIT)]), "checking", 2.0)
    assert took < 5
    assert record.state == "cancelled"
    assert code_of(record) == "CANCELLED"
    data = stored(record)
    assert data["checks"] == []
    assert containers_of(client, record.job_id) == []


def chat_reply(calls: list[tuple[str, str, dict[str, Any]]], text: str | None = None) -> Any:
    """A Chat Completions answer shaped like the real API's."""
    message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
    if calls:
        message["tool_calls"] = [
            {"id": i, "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
            for i, n, a in calls
        ]
    return json_reply(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 1700000000,
            "model": "test-model",
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": "tool_calls" if calls else "stop",
                }
            ],
            "usage": {"prompt_tokens": 120, "completion_tokens": 30, "total_tokens": 150},
        }
    )


@pytest.fixture
def server() -> Iterator[LoopbackServer]:
    yield from serve()


def openai(server: LoopbackServer, **fields: Any) -> Provider:
    config = ProviderConfig.model_validate(
        {
            "api": "chat",
            "base_url": f"{server.url}/v1",
            "api_key": KEY,
            "model": "test-model",
            "stream": False,
            "trust_env": False,
            "connect_timeout_seconds": 2.0,
            "read_timeout_seconds": 30.0,
            "request_deadline_seconds": 60.0,
            "max_attempts": 1,
        }
        | fields
    )
    return open_provider(config, "Capitalize the greeting.")


def test_cancel_reaches_a_hanging_provider_request(
    client: docker.DockerClient, repo: Path, server: LoopbackServer
) -> None:
    server.play(hang())
    provider = openai(server)
    try:
        record, took = cancel_when(client, repo, make_task(), provider, "running", 1.0)
    finally:
        provider.close()
    assert took < 3
    assert record.state == "cancelled"
    assert code_of(record) == "CANCELLED"
    assert len(server.received) == 1
    assert containers_of(client, record.job_id) == []


# -- 10. an OpenAI-compatible endpoint drives the same loop -----------------------------


def test_openai_compatible_endpoint_drives_the_job(
    client: docker.DockerClient, repo: Path, server: LoopbackServer
) -> None:
    server.play(
        chat_reply([("call_1", "search_text", {"query": "def greet"})]),
        chat_reply([("call_2", "read_file", {"path": "app.py"})]),
        chat_reply([("call_3", "replace_text", EDIT["arguments"])]),
        chat_reply([], "Capitalized."),
    )
    provider = openai(server)
    try:
        job = new_job(client, repo, make_task(), provider, secrets=(KEY,))
        record = job.run()
    finally:
        provider.close()
    assert record.state == "awaiting_review", record.error
    assert record.final_message == "Capitalized."
    assert job.diff == (
        "diff --git a/app.py b/app.py\n"
        f"index {blob(APP)}..{blob(APP_AFTER)} 100644\n"
        "--- a/app.py\n+++ b/app.py\n"
        "@@ -1,2 +1,2 @@\n def greet(name):\n"
        '-    return "hello " + name\n+    return "Hello " + name\n'
    )
    data = stored(record)
    assert [(c["id"], c["name"], c["ok"]) for c in data["tool_calls"]] == [
        ("call_1", "search_text", True),
        ("call_2", "read_file", True),
        ("call_3", "replace_text", True),
    ]
    assert data["files"][0]["calls"] == ["call_3"]
    received = server.received
    assert len(received) == 4
    assert {r.headers["authorization"] for r in received} == {f"Bearer {KEY}"}
    results = []
    for number, request in enumerate(received[1:], start=1):
        last = request.json()["messages"][-1]
        assert (last["role"], last["tool_call_id"]) == ("tool", f"call_{number}")
        results.append(json.loads(last["content"]))
    assert all(set(r) == {"result"} for r in results)
    assert [h["path"] for h in results[0]["result"]["hits"]] == ["app.py"]
    assert results[1]["result"]["content"] == APP
    assert results[2]["result"]["path"] == "app.py"
    evidence = (JobStore().folder(record.job_id) / "evidence.json").read_text()
    assert KEY not in evidence


def test_a_model_sees_the_checks_runs_them_and_sends_a_traditional_diff(
    client: docker.DockerClient, repo: Path, server: LoopbackServer
) -> None:
    """Through a real sandbox, as a model drives it: run_check's enum names the job's check,
    the failed check reads as its verdict, a ---/+++ diff is applied, the check passes."""
    patch = (
        "--- a/app.py\t2026-01-01 00:00:00\n+++ b/app.py\t2026-01-01 00:00:01\n"
        '@@ -1,2 +1,2 @@\n def greet(name):\n-    return "hello " + name\n'
        '+    return "Hello " + name\n'
    )
    server.play(
        chat_reply([("call_1", "run_check", {"checkId": "greet"})]),
        chat_reply([("call_2", "apply_patch", {"patch": patch})]),
        chat_reply([("call_3", "run_check", {"checkId": "greet"})]),
        chat_reply([], "Capitalized."),
    )
    provider = openai(server)
    try:
        job = new_job(client, repo, make_task(), provider, secrets=(KEY,))
        record = job.run()
    finally:
        provider.close()
    assert record.state == "awaiting_review", record.error
    first = server.received[0].json()
    (run_check,) = [t["function"] for t in first["tools"] if t["function"]["name"] == "run_check"]
    assert run_check["parameters"]["properties"]["checkId"]["enum"] == ["greet"]
    listed = "- greet: python3 check.py (the change must pass it; at most 60 s)"
    assert run_check["description"].endswith(listed)
    assert first["messages"][0]["content"].endswith(listed)
    results = [json.loads(r.json()["messages"][-1]["content"]) for r in server.received[1:]]
    assert results[0]["result"]["verdict"] == "greet: failed, exit 1"
    assert (results[0]["result"]["status"], results[0]["result"]["exitCode"]) == ("failed", 1)
    assert results[1] == {
        "result": {
            "files": [
                {"path": "app.py", "oldPath": None, "kind": "modify", "added": 1, "removed": 1}
            ]
        }
    }
    assert results[2]["result"]["verdict"] == "greet: passed"
    assert [(c.id, c.ok, c.verdict) for c in record.tool_calls] == [
        ("call_1", True, "greet: failed, exit 1"),
        ("call_2", True, None),
        ("call_3", True, "greet: passed"),
    ]
    text = transcript_text(record)
    assert "-> greet: failed, exit 1 (" in text
    assert "-> greet: passed (" in text
    assert job.diff is not None
    assert '+    return "Hello " + name\n' in job.diff


# -- 11. reconciliation -----------------------------------------------------------------


def bare_job() -> Job:
    return Job(
        cast("docker.DockerClient", None),
        JobRequest(repo=Path("/nonexistent"), task=make_task(), provider=scripted()),
    )


def ledger_entry(call_id: str, path: str, digest: str | None, outcome: str = "done") -> LedgerEntry:
    return LedgerEntry.model_validate(
        {
            "turn": 1,
            "id": call_id,
            "tool": "replace_text",
            "intent": "edit",
            "version_before": 0,
            "files": [{"path": path, "sha256": digest}],
            "outcome": outcome,
        }
    )


def collected(*files: ChangedFile) -> Collected:
    return Collected(diff="", tree="", files=list(files))


def test_reconcile_accepts_only_changes_a_completed_call_accounts_for() -> None:
    job = bare_job()
    job.record.ledger = [
        ledger_entry("c1", "a.txt", "1" * 64),
        ledger_entry("c2", "a.txt", "2" * 64),
        ledger_entry("c3", "gen.txt", None),
    ]
    reconcile(
        collected(
            ChangedFile("a.txt", "modified", "100644", "2" * 64),
            ChangedFile("gen.txt", "added", "100644", "3" * 64),
        ),
        job.record,
        None,
    )
    assert "unaccounted" not in job.record.diagnostics


@pytest.mark.parametrize(
    ("ledger", "key", "paths"),
    [
        ([ledger_entry("c1", "a.txt", "1" * 64)], "unaccounted", ["b.txt"]),
        ([ledger_entry("c1", "b.txt", "2" * 64, "rejected")], "unaccounted", ["b.txt"]),
        ([ledger_entry("c1", "b.txt", "1" * 64)], "mismatched", ["b.txt"]),
    ],
    ids=["no_call", "rejected_call", "other_content"],
)
def test_reconcile_refuses_an_unaccounted_change(
    ledger: list[LedgerEntry], key: str, paths: list[str]
) -> None:
    job = bare_job()
    job.record.ledger = ledger
    with pytest.raises(PatchboxError) as info:
        reconcile(collected(ChangedFile("b.txt", "added", "100644", "2" * 64)), job.record, None)
    assert info.value.code is ErrorCode.CHANGESET_INVALID
    assert "b.txt" in info.value.message
    assert job.record.diagnostics[key] == paths


def test_mutating_check_is_accounted_for_in_the_ledger(
    client: docker.DockerClient, repo: Path
) -> None:
    gen = {
        "argv": ["python3", "-c", "open('generated.txt', 'w').write('made by a check\\n')"],
        "mutates": True,
        "required": False,
    }
    task = make_task(checks={"greet": GREET, "gen": gen})
    provider = scripted([check_call("c1", "gen")], [call("c2", EDIT)])
    record = new_job(client, repo, task, provider).run()
    assert record.state == "awaiting_review", record.error
    data = stored(record)
    assert [(e["id"], e["files"], e["version_before"]) for e in data["ledger"]] == [
        ("c1", [{"path": "generated.txt", "sha256": None}], 0),
        ("c2", [{"path": "app.py", "sha256": sha256(APP_AFTER)}], 1),
    ]
    assert [(f["path"], f["kind"], f["calls"]) for f in data["files"]] == [
        ("app.py", "modify", ["c2"]),
        ("generated.txt", "create", ["c1"]),
    ]
    assert [(c["id"], c["status"]) for c in data["checks"]] == [
        ("greet", "passed"),
        ("gen", "passed"),
    ]


SNEAK = """
import os, time
ready, tell = os.pipe()
if os.fork() == 0:
    os.setsid()
    fd = os.open("/dev/null", os.O_RDWR)
    for n in (0, 1, 2):
        os.dup2(fd, n)
    os.write(tell, b"x")
    time.sleep(1)
    with open("notes.txt", "a") as out:
        out.write("not from a tool call\\n")
    os._exit(0)
os.read(ready, 1)
"""


class SlowFinal:
    """A scripted conversation whose last answer takes ``delay`` seconds."""

    def __init__(self, inner: ScriptedProvider, turns: int, delay: float) -> None:
        self.inner, self.turns, self.delay, self.calls = inner, turns, delay, 0

    def next_turn(self, results: list[ToolResult]) -> ModelTurn:
        self.calls += 1
        if self.calls > self.turns:
            time.sleep(self.delay)
        return self.inner.next_turn(results)

    def cancel(self) -> None:
        self.inner.cancel()

    def close(self) -> None:
        self.inner.close()


def test_change_no_call_accounts_for_fails_the_job(client: docker.DockerClient, repo: Path) -> None:
    """A check leaves a process behind that edits a file after the check ended: no tool
    call made that change, so the change set is refused."""
    task = make_task(checks={"sneak": {"argv": ["python3", "-c", SNEAK]}})
    provider = SlowFinal(scripted([check_call("c1", "sneak")], [call("c2", EDIT)]), 2, 2.5)
    record = new_job(client, repo, task, provider).run()
    assert record.state == "failed"
    assert code_of(record) == "CHANGESET_INVALID"
    assert record.error is not None
    assert record.error.model_dump() == {
        "code": "CHANGESET_INVALID",
        "message": "the change set is invalid: changed by no tool call: notes.txt",
    }
    assert record.diagnostics["unaccounted"] == ["notes.txt"]
    data = stored(record)
    assert data["checks"] == []
    assert containers_of(client, record.job_id) == []


def test_unexpected_error_still_ends_the_record_failed(
    client: docker.DockerClient, repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*_args: object) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr("controller.jobs.engine.collect", broken)
    job = new_job(client, repo, make_task(), scripted([call("c1", EDIT)]))
    with pytest.raises(InternalError, match=r"unexpected error \(RuntimeError\)") as info:
        job.run()
    assert isinstance(info.value.__cause__, RuntimeError)
    stored = JobStore().load(job.record.job_id)
    assert stored.state == "failed"
    assert stored.error is not None
    assert stored.error.code == "INTERNAL_ERROR"
    assert info.value.report is not None
    assert info.value.report in stored.error.message
    assert evidence_of(stored.job_id)["status"] == "failed"
    assert containers_of(client, stored.job_id) == []


def test_a_bug_in_the_sandbox_removal_is_raised_and_the_decision_kept(
    client: docker.DockerClient, repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job's sandbox is removed on a thread of its own while the job goes on; a bug
    there (not an engine error, which is logged) is raised as any other bug is, with its
    crash report, once the job has waited for the removal; the job, decided by then, keeps
    its decision and its evidence."""
    original = DockerSandbox.close
    closes: list[str] = []

    def broken(self: DockerSandbox) -> None:
        original(self)  # removed all the same, then the bug
        closes.append(threading.current_thread().name)
        if len(closes) == 1:  # the job's sandbox; the check's fresh one closes as usual
            raise RuntimeError("a bug in the removal")

    monkeypatch.setattr(DockerSandbox, "close", broken)
    job = new_job(client, repo, make_task(), scripted([call("c1", EDIT)]))
    with pytest.raises(InternalError, match=r"unexpected error \(RuntimeError\)") as info:
        job.run()
    assert closes[0] == "sandbox-close"
    assert isinstance(info.value.__cause__, RuntimeError)
    assert info.value.report is not None
    assert info.value.report in str(info.value)
    stored = JobStore().load(job.record.job_id)
    assert stored.state == "awaiting_review"
    assert stored.error is None
    assert evidence_of(stored.job_id)["status"] == "awaiting_review"
    assert containers_of(client, stored.job_id) == []


def test_wall_clock_limit_ends_a_running_check(client: docker.DockerClient, repo: Path) -> None:
    slow = {"argv": ["sleep", "60"], "timeout_seconds": 120}
    task = make_task(checks={"slow": slow}, limits={"wall_seconds": 5}, baseline_checks=False)
    job = new_job(client, repo, task, scripted([check_call("c1", "slow")]))
    started = time.monotonic()
    record = job.run()
    assert time.monotonic() - started < 30
    assert record.state == "failed"
    assert code_of(record) == "LIMIT_EXCEEDED"
    assert record.error is not None
    assert "wall-clock limit of 5 s" in record.error.message
    assert containers_of(client, record.job_id) == []
    assert git(repo, "status", "--porcelain") == ""


def test_result_bytes_limit_ends_the_job(
    client: docker.DockerClient, repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("controller.jobs.loop.MAX_RESULT_BYTES", 150)
    job = new_job(client, repo, make_task(), scripted([search_call("c1")], [search_call("c2")]))
    record = job.run()
    assert record.state == "failed"
    assert record.error is not None
    assert record.error.model_dump() == {
        "code": "LIMIT_EXCEEDED",
        "message": "tool results exceed the job's byte limit",
    }
    data = stored(record)
    assert [c["id"] for c in data["tool_calls"]] == ["c1", "c2"]
    assert containers_of(client, record.job_id) == []
