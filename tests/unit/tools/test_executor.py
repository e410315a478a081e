"""The tool executor on the real agent (over pipes): policy, idempotency, checks."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError

from controller.config.task import CheckSpec, TaskSpec
from controller.errors import ArgumentsNotAnObjectError, CheckChangedFilesError, ErrorCode
from controller.sandbox.local import LocalSandbox
from controller.text import strip_control
from controller.tools.executor import ToolExecutor
from controller.tools.policy import write_denial

PY = sys.executable


@pytest.fixture
def box(tmp_path: Path) -> Iterator[LocalSandbox]:
    ws = tmp_path / "ws"
    (ws / "src").mkdir(parents=True)
    (ws / "src" / "a.py").write_text("def f():\n    return 1\n")
    (ws / "package.json").write_text("{}\n")
    with LocalSandbox(ws) as sandbox:
        yield sandbox


def _executor(box: LocalSandbox, **kw: object) -> ToolExecutor:
    checks = {
        "ok": CheckSpec(
            argv=[PY, "-c", "print('\\x1b[31mgreen\\x1b[0m \\x1b]8;;http://x\\x07link')"]
        ),
        "fail": CheckSpec(argv=[PY, "-c", "import sys; sys.exit(2)"]),
        "slow": CheckSpec(argv=["sleep", "30"], timeout_seconds=1),
        "sneaky": CheckSpec(argv=[PY, "-c", "open('src/a.py', 'a').write('# x\\n')"]),
        "fmt": CheckSpec(argv=[PY, "-c", "open('src/a.py', 'a').write('# fmt\\n')"], mutates=True),
        "env": CheckSpec(argv=[PY, "-c", "import os; print(sorted(os.environ))"]),
    }
    return ToolExecutor(box, checks=checks, **kw)  # type: ignore[arg-type]


def test_reads_and_an_edit(box: LocalSandbox) -> None:
    ex = _executor(box)
    listing = ex.execute(1, "c1", "list_files", "{}")
    assert listing.ok
    assert listing.result is not None
    assert listing.result["files"] == ["package.json", "src/a.py"]
    edit = ex.execute(
        1, "c2", "replace_text", {"path": "src/a.py", "oldText": "return 1", "newText": "return 2"}
    )
    assert edit.ok
    assert edit.effect == "write"
    assert (box.workspace / "src" / "a.py").read_text() == "def f():\n    return 2\n"


def test_replay_in_the_same_turn_has_no_second_effect(box: LocalSandbox) -> None:
    ex = _executor(box)
    args = {"path": "src/a.py", "oldText": "return 1", "newText": "return 1 + 1"}
    first = ex.execute(3, "dup", "replace_text", args)
    again = ex.execute(3, "dup", "replace_text", json.dumps(args))
    assert first.ok
    assert again is first
    assert (box.workspace / "src" / "a.py").read_text().count("1 + 1") == 1
    conflicting = ex.execute(3, "dup", "replace_text", {**args, "newText": "return 3"})
    assert not conflicting.ok
    assert conflicting.error is not None
    assert conflicting.error["code"] == "TOOL_ARGUMENTS_INVALID"
    assert "already used in this turn" in conflicting.error["message"]
    later = ex.execute(
        4, "dup", "replace_text", {"path": "src/a.py", "oldText": "1 + 1", "newText": "2"}
    )
    assert later.ok, "a later turn may reuse an id"


@pytest.mark.parametrize(
    ("path", "allowed", "code", "reason"),
    [
        ("package.json", None, "TOOL_PATH_DENIED", "configuration path"),
        (".env", ["."], "TOOL_PATH_DENIED", ".env: not allowed"),
        (".github/workflows/ci.yml", None, "TOOL_PATH_DENIED", "configuration path"),
        ("src/a.py", ["tests/"], "TOOL_PATH_DENIED", "outside the task's allowed_paths"),
        # not a repository path at all: said as the sandbox says it, allowed_paths or not
        ("/work/src/a.py", ["src/"], "TOOL_PATH_INVALID", "use a path relative to the"),
        ("src//a.py", ["src/"], "TOOL_PATH_INVALID", "not a valid path"),
        ("src\\a.py", None, "TOOL_PATH_INVALID", "backslashes"),
    ],
)
def test_write_policy_is_enforced_before_the_sandbox(
    box: LocalSandbox, path: str, allowed: list[str] | None, code: str, reason: str
) -> None:
    ex = _executor(box, allowed_paths=allowed)
    before = (box.workspace / "package.json").read_text()
    out = ex.execute(1, "w", "replace_text", {"path": path, "oldText": "{}", "newText": "[]"})
    assert not out.ok
    assert out.error is not None
    assert out.error["code"] == code
    assert reason in out.error["message"]
    assert (box.workspace / "package.json").read_text() == before


@pytest.mark.parametrize(
    ("patch", "reason"),
    [
        ("--- a/package.json\n+++ b/package.json\n@@ -1 +1 @@\n-{}\n+[]\n", "configuration"),
        ("--- /dev/null\n+++ .github/workflows/x.yml\n@@ -0,0 +1 @@\n+on: push\n", "config"),
        ("--- src/a.py\n+++ /dev/null\n@@ -1,2 +0,0 @@\n-def f():\n-    return 1\n", "allowed"),
    ],
)
def test_a_traditional_diff_is_held_to_the_write_policy_on_the_host(
    box: LocalSandbox, patch: str, reason: str
) -> None:
    """The host reads a traditional diff's paths as the agent does, before the sandbox."""
    ex = _executor(box, allowed_paths=["tests/"] if reason == "allowed" else None)
    before = sorted(p.read_bytes() for p in box.workspace.rglob("*") if p.is_file())
    out = ex.execute(1, "p", "apply_patch", {"patch": patch})
    assert out.error is not None
    assert out.error["code"] == "TOOL_PATH_DENIED"
    assert reason in out.error["message"]
    assert sorted(p.read_bytes() for p in box.workspace.rglob("*") if p.is_file()) == before


def test_a_traditional_diff_is_applied(box: LocalSandbox) -> None:
    ex = _executor(box)
    patch = (
        "--- a/src/a.py\n+++ b/src/a.py\n@@ -1,2 +1,2 @@\n def f():\n-    return 1\n+    return 2\n"
    )
    out = ex.execute(1, "p", "apply_patch", {"patch": patch})
    assert out.ok, out.error
    assert (box.workspace / "src" / "a.py").read_text() == "def f():\n    return 2\n"


def test_config_path_named_in_allowed_paths_may_be_written(box: LocalSandbox) -> None:
    ex = _executor(box, allowed_paths=["package.json"])
    out = ex.execute(
        1, "w", "replace_text", {"path": "package.json", "oldText": "{}", "newText": "[]"}
    )
    assert out.ok


def test_bad_arguments_are_retryable_and_non_objects_end_the_job(box: LocalSandbox) -> None:
    ex = _executor(box)
    out = ex.execute(1, "a", "read_file", {"path": "src/a.py", "bogus": 1})
    assert not out.ok
    assert out.error == {
        "code": "TOOL_ARGUMENTS_INVALID",
        "message": out.error["message"] if out.error else "",
        "retryable": True,
    }
    with pytest.raises(ArgumentsNotAnObjectError):
        ex.execute(1, "b", "read_file", "[1, 2]")


def test_checks_report_status_and_clean_output(box: LocalSandbox) -> None:
    ex = _executor(box)
    ok = ex.execute(1, "k1", "run_check", {"checkId": "ok"})
    assert ok.result is not None
    assert (ok.result["status"], ok.result["exitCode"]) == ("passed", 0)
    assert ok.result["output"] == "green link\n"
    fail = ex.execute(1, "k2", "run_check", {"checkId": "fail"})
    assert fail.result is not None
    assert (fail.result["status"], fail.result["exitCode"]) == ("failed", 2)
    slow = ex.execute(1, "k3", "run_check", {"checkId": "slow"})
    assert slow.result is not None
    assert (slow.result["status"], slow.result["signal"]) == ("timed_out", 9)
    unknown = ex.execute(1, "k4", "run_check", {"checkId": "rm"})
    assert unknown.error is not None
    assert unknown.error["code"] == "TOOL_ARGUMENTS_INVALID"
    assert "configured: env, fail, fmt, ok, slow, sneaky" in unknown.error["message"]
    # not an id at all: the form is named, and the ids that exist with it
    malformed = ex.execute(1, "k5", "run_check", {"checkId": "rm -rf /"})
    assert malformed.error is not None
    assert malformed.error["code"] == "TOOL_ARGUMENTS_INVALID"
    assert malformed.error["message"].startswith("run_check: checkId: ")
    assert malformed.error["message"].endswith("; configured: env, fail, fmt, ok, slow, sneaky")


def test_check_environment_is_the_allowlist(
    box: LocalSandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-planted")
    out = _executor(box).execute(1, "e", "run_check", {"checkId": "env"})
    assert out.result is not None
    names = json.loads(out.result["output"].replace("'", '"'))
    assert set(names) <= {
        "PATH",
        "HOME",
        "LANG",
        "TMPDIR",
        "PYTHONDONTWRITEBYTECODE",
        "CI",
        "LC_CTYPE",
    }


def test_check_result_is_reused_only_at_the_same_version(box: LocalSandbox) -> None:
    ex = _executor(box)
    first = ex.execute(1, "a", "run_check", {"checkId": "ok"})
    second = ex.execute(2, "a", "run_check", {"checkId": "ok"})
    assert first.result is not None
    assert second.result is not None
    assert (first.result["reused"], second.result["reused"]) == (False, True)
    ex.execute(
        2, "b", "replace_text", {"path": "src/a.py", "oldText": "return 1", "newText": "return 5"}
    )
    third = ex.execute(2, "c", "run_check", {"checkId": "ok"})
    assert third.result is not None
    assert third.result["reused"] is False


def test_undeclared_changes_by_a_check_end_the_job(box: LocalSandbox) -> None:
    ex = _executor(box)
    declared = ex.execute(1, "f", "run_check", {"checkId": "fmt"})
    assert declared.effect == "write"
    assert declared.result is not None
    assert declared.result["changes"]["modified"] == ["src/a.py"]
    with pytest.raises(CheckChangedFilesError, match=r"src/a\.py") as info:
        ex.execute(1, "s", "run_check", {"checkId": "sneaky"})
    assert info.value.code is ErrorCode.CHECK_FAILED


@pytest.mark.parametrize(
    ("path", "allowed", "denied"),
    [
        ("src/a.py", None, False),
        ("src/.ENV.local", None, True),
        ("deep/.Git/config", None, True),
        ("certs/server.PEM", None, True),
        ("yarn.lock", None, True),
        ("yarn.lock", ["yarn.lock"], False),
        (".husky/pre-commit", [".husky/"], False),
        ("src/a.py", ["src"], False),
        ("srcx/a.py", ["src"], True),
        ("vendor/lib.py", ["vendor/lib.py"], False),
        ("node_modules/x/index.js", None, True),
    ],
)
def test_write_denial_table(path: str, allowed: list[str] | None, denied: bool) -> None:
    assert (write_denial(path, allowed) is not None) is denied


def test_strip_control() -> None:
    raw = "\x1b[1;31mred\x1b[0m \x1b]0;title\x07ok\x1b]8;;u\x1b\\ \x07bell\r\nnext\x00\x9b2J"
    assert strip_control(raw) == "red ok bell\nnext"


@pytest.mark.parametrize("code", range(128))
def test_strip_control_of_ascii_text_removes_each_control_but_newline_and_tab(code: int) -> None:
    """Plain ASCII text is returned as it is after one scan; one control character in it
    (ESC and carriage return among them) still goes."""
    ch = chr(code)
    text = "x = 1\n\tplain" * 100
    kept = ch in "\t\n" or 0x20 <= code < 0x7F
    assert strip_control(text + ch) == (text + ch if kept else text)
    assert strip_control(text + "\r\n") == text + "\n"


@pytest.mark.parametrize(
    "env",
    [{"OPENAI_API_KEY": "x"}, {"HTTPS_PROXY": "x"}, {"lower": "x"}, {"GITHUB_TOKEN": "x"}],
)
def test_checks_refuse_secret_or_proxy_variables(env: dict[str, str]) -> None:
    with pytest.raises(ValidationError):
        CheckSpec(argv=["true"], env=env)


def test_task_file_is_strict() -> None:
    task = TaskSpec.model_validate({"prompt": "fix it", "checks": {"tests": {"argv": ["pytest"]}}})
    assert task.mode == "review"
    assert task.checks["tests"].required is True
    with pytest.raises(ValidationError):
        TaskSpec.model_validate({"prompt": "x", "surprise": 1})
    with pytest.raises(ValidationError):
        TaskSpec.model_validate({"prompt": "x", "checks": {"bad id!": {"argv": ["true"]}}})
    with pytest.raises(ValidationError):
        TaskSpec.model_validate({"prompt": "x", "checks": {"t": {"argv": "pytest -q"}}})


def test_results_leave_bookkeeping_out_unless_asked(box: LocalSandbox) -> None:
    """Hashes, versions and scan counts reach the model only with details; the ledger reads
    them from the whole result either way."""
    ex = _executor(box)
    listing = ex.execute(1, "l1", "list_files", {})
    assert listing.for_model() == {
        "result": {"files": ["package.json", "src/a.py"], "truncated": False}
    }
    detailed = ex.execute(1, "l2", "list_files", {"details": True})
    shown_list = detailed.for_model()["result"]
    assert isinstance(shown_list, dict)
    assert set(shown_list) == {"files", "truncated", "version"}
    found = ex.execute(1, "s1", "search_text", {"query": "return"})
    assert found.for_model() == {
        "result": {
            "hits": [{"path": "src/a.py", "line": 2, "text": "    return 1"}],
            "truncated": False,
        }
    }
    edit = ex.execute(
        1, "e1", "replace_text", {"path": "src/a.py", "oldText": "return 1", "newText": "return 2"}
    )
    assert edit.for_model() == {
        "result": {"path": "src/a.py", "line": 2, "removedLines": 1, "addedLines": 1}
    }
    assert len(edit.fields.get("sha256After", "")) == 64  # what the ledger reads
    patch = "--- a/src/a.py\n+++ b/src/a.py\n@@ -2 +2 @@\n-    return 2\n+    return 3\n"
    done = ex.execute(1, "p1", "apply_patch", {"patch": patch})
    assert done.for_model() == {
        "result": {
            "files": [
                {"path": "src/a.py", "oldPath": None, "kind": "modify", "added": 1, "removed": 1}
            ]
        }
    }
    files = done.fields.get("files", [])
    assert files
    assert len(files[0].get("sha256After") or "") == 64
    patch2 = "--- a/src/a.py\n+++ b/src/a.py\n@@ -2 +2 @@\n-    return 3\n+    return 4\n"
    full = ex.execute(1, "p2", "apply_patch", {"patch": patch2, "details": True})
    shown = full.for_model()["result"]
    assert isinstance(shown, dict)
    assert "version" in shown
    assert "sha256Before" in shown["files"][0]


def test_read_file_can_number_its_lines(box: LocalSandbox) -> None:
    ex = _executor(box)
    plain = ex.execute(1, "r1", "read_file", {"path": "src/a.py"})
    assert plain.fields.get("path") == "src/a.py"
    assert (plain.result or {})["content"] == "def f():\n    return 1\n"
    numbered = ex.execute(
        1, "r2", "read_file", {"path": "src/a.py", "startLine": 2, "lineNumbers": True}
    )
    assert (numbered.result or {})["content"] == "2\t    return 1\n"


def test_path_refusals_name_the_path_and_say_why(box: LocalSandbox) -> None:
    ex = _executor(box)
    cases = {
        "nope.py": ("TOOL_FILE_NOT_FOUND", "nope.py: no such file"),
        "/etc/passwd": (
            "TOOL_PATH_INVALID",
            (
                "/etc/passwd: use a path relative to the repository top (like src/app.py),"
                " not an absolute path"
            ),
        ),
        ".env": ("TOOL_PATH_DENIED", ".env: not allowed"),
        "src": ("TOOL_PATH_DENIED", "src: a folder, not a file (list_files lists what it holds)"),
    }
    for n, (path, expected) in enumerate(cases.items()):
        out = ex.execute(1, f"r{n}", "read_file", {"path": path})
        assert out.for_model() == {
            "error": {"code": expected[0], "message": expected[1], "retryable": True}
        }


def test_a_failed_check_reads_as_its_own_verdict(box: LocalSandbox) -> None:
    ex = _executor(box)
    fail = ex.execute(1, "k1", "run_check", {"checkId": "fail"})
    assert fail.ok  # the call ran
    assert fail.verdict == "fail: failed, exit 2"
    shown = fail.for_model()
    assert "ok" not in shown
    result = shown["result"]
    assert isinstance(result, dict)
    assert list(result)[:4] == ["verdict", "checkId", "status", "exitCode"]
    assert (result["verdict"], result["status"], result["exitCode"]) == (
        "fail: failed, exit 2",
        "failed",
        2,
    )
    assert "signal" not in result
    assert "reused" not in result
    again = ex.execute(1, "k2", "run_check", {"checkId": "fail"})
    assert again.verdict == "fail: failed, exit 2 (reused: nothing changed since it ran)"
    slow = ex.execute(1, "k3", "run_check", {"checkId": "slow"})
    assert slow.verdict == "slow: timed out"
    ok = ex.execute(1, "k4", "run_check", {"checkId": "ok"})
    assert ok.verdict == "ok: passed"
    listing = ex.execute(1, "l", "list_files", {})
    assert listing.verdict is None


def test_text_that_is_not_a_diff_is_told_what_a_diff_is(box: LocalSandbox) -> None:
    ex = _executor(box)
    patch = "Here it is:\n--- a/src/a.py\n+++ b/src/a.py\n@@ -1 +1 @@\n-def f():\n+def g():\n"
    out = ex.execute(1, "p", "apply_patch", {"patch": patch})
    assert out.error is not None
    assert out.error["code"] == "PATCH_REJECTED"
    assert out.error["message"].startswith("garbage: text before the first 'diff --git' line")
    assert "send only the diff: each file as a '--- a/PATH' line" in out.error["message"]
