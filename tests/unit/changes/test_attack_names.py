"""Hostile file names and line endings: the agent and the host give the same answer.

- A file name that is not UTF-8, made by a check, ends the job ``CHANGESET_INVALID`` naming
  the name's bytes escaped (never an agent crash, ``SANDBOX_FAILED``).
- A diff whose lines end in CR LF is refused at the call, unless the CRs are the file's own
  (a canonical git diff of a CRLF file), which applies byte for byte on both sides.
- One set of name rules (``patchbox_agent.diffs``): every hostile name is refused by the
  agent's ``apply_patch`` and by the host's change-set validation, for the same reason.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from controller.changes.rules import check_diff
from controller.changes.tree import MemoryTree
from controller.errors import ChangesetInvalidError, ErrorCode, ToolError
from controller.sandbox.local import LocalSandbox
from controller.tools.executor import ToolExecutor
from patchbox_agent import jail
from tests.support.git import git, init, write_files
from tests.support.names import BAD_NAME


def test_the_agent_answers_about_a_name_that_is_not_utf8(tmp_path: Path) -> None:
    """Change reports name such a file escaped (``bad\\xff``, which no name rule accepts)
    instead of crashing the agent; listings and searches leave it out (the model could not
    name it back)."""
    root = tmp_path / "ws"
    root.mkdir()
    (root / "a.txt").write_text("x\n")
    with LocalSandbox(root) as box:
        box.list_files()
        res = box.run(
            ["python3", "-c", BAD_NAME], timeout=30, track_changes=True
        )  # after the first write op: the baseline is marked
        assert res.changes is not None
        assert res.changes.added == ["bad\\xff"]
        assert box.list_files().files == ["a.txt"]
        assert [h.path for h in box.search_text("x").hits] == ["a.txt"]
        assert [h.path for h in box.search_text("x", regex=True).hits] == ["a.txt"]
        assert box.changes().added == ["bad\\xff"]


def test_the_host_names_the_bytes_of_a_name_that_is_not_utf8() -> None:
    diff = (
        'diff --git "a/bad\\377" "b/bad\\377"\nnew file mode 100644\n--- /dev/null\n'
        '+++ "b/bad\\377"\n@@ -0,0 +1 @@\n+x\n'
    )
    with pytest.raises(ChangesetInvalidError) as info:
        check_diff(diff, MemoryTree({}))
    assert [(r.code, r.message) for r in info.value.reasons] == [
        ("not_text", "a quoted name is not UTF-8: b/bad\\xff")
    ]
    assert jail.escape_name("bad\udcff") == "bad\\xff"


# -- 9c: CR LF -------------------------------------------------------------------------------


def _git_diff(tmp_path: Path, old: dict[str, bytes], new: dict[str, bytes]) -> str:
    """The diff real git makes between two versions of some files."""
    repo = init(tmp_path / "gitdiff", old, message="b").path
    write_files(repo, new)
    git(repo, "add", "-A")
    return git(repo, "diff", "--cached")


LF = b"one\ntwo\n"
CRLF = b"one\r\ntwo\r\n"


def _unindexed(patch: str) -> str:
    """The patch without its ``index`` lines (whose blob ids an edited patch breaks)."""
    return "".join(
        line for line in patch.splitlines(keepends=True) if not line.startswith("index ")
    )


def _crlf_cases(tmp_path: Path) -> dict[str, tuple[str, dict[str, bytes] | str]]:
    """name -> (patch, the files afterwards or the reason it is refused)."""
    lf_edit = _git_diff(tmp_path / "1", {"lf.txt": LF}, {"lf.txt": b"one\nTWO\nthree\n"})
    crlf_edit = _git_diff(
        tmp_path / "2", {"crlf.txt": CRLF}, {"crlf.txt": b"one\r\nTWO\r\nthree\r\n"}
    )
    crlf_new = _git_diff(tmp_path / "3", {}, {"new.bat": b"@echo off\r\nrem x\r\n"})
    return {
        "lf edit": (lf_edit, {"lf.txt": b"one\nTWO\nthree\n", "crlf.txt": CRLF}),
        "crlf file, canonical git diff": (
            crlf_edit,
            {"lf.txt": LF, "crlf.txt": b"one\r\nTWO\r\nthree\r\n"},
        ),
        "new crlf file, canonical git diff": (
            crlf_new,
            {"lf.txt": LF, "crlf.txt": CRLF, "new.bat": b"@echo off\r\nrem x\r\n"},
        ),
        "lf edit wrapped in crlf": (lf_edit.replace("\n", "\r\n"), "crlf_header"),
        "lf edit, crlf hunk lines": (
            lf_edit.replace(" one\n", " one\r\n").replace("+three\n", "+three\r\n"),
            "context_mismatch",
        ),
        "lf edit, crlf added line": (
            _unindexed(lf_edit).replace("+three\n", "+three\r\n"),
            "line_ending",
        ),
        "crlf file, lf added line": (
            _unindexed(crlf_edit).replace("+three\r\n", "+three\n"),
            "line_ending",
        ),
        "new file, mixed endings": (
            _unindexed(crlf_new).replace("+rem x\r\n", "+rem x\n"),
            "line_ending",
        ),
    }


def test_crlf_patches_agent_and_host_agree(tmp_path: Path) -> None:
    """Each case as the model's call goes (the executor's parse on the host, then the local
    agent) and through the host's change-set validation: the same bytes or the same reason.

    ``line_ending`` is a rule for a patch a model sends (mixed endings there are a mangled
    diff, refused at the call); the change set, made by git from the files themselves, is
    taken byte for byte (a check may rewrite line endings), so the host applies those
    patches exactly as written, CRs and all."""
    for name, (patch, expected) in _crlf_cases(tmp_path).items():
        root = tmp_path / name.replace(" ", "_").replace(",", "")
        root.mkdir()
        (root / "lf.txt").write_bytes(LF)
        (root / "crlf.txt").write_bytes(CRLF)
        with LocalSandbox(root) as box:
            result = ToolExecutor(box).execute(1, "p", "apply_patch", {"patch": patch})
            after = {p.name: p.read_bytes() for p in sorted(root.iterdir())}
        host: Any
        try:
            prepared = check_diff(patch, MemoryTree({"lf.txt": LF, "crlf.txt": CRLF}))
            host = {c.path: c.after for c in prepared.changes}
        except ChangesetInvalidError as exc:
            host = [r.code for r in exc.reasons]
        if isinstance(expected, str):
            assert result.error is not None, name
            assert result.error["code"] == ErrorCode.PATCH_REJECTED.value, name
            assert result.error["message"].split(":")[0] == expected, name
            assert after == {"crlf.txt": CRLF, "lf.txt": LF}, name
            if expected != "line_ending":
                assert host == [expected], name
            else:
                assert isinstance(host, dict), (name, host)
                assert all(b"\r\n" in d and b"\n" in d.replace(b"\r\n", b"") for d in host.values())
        else:
            assert result.ok, (name, result.error)
            assert after == expected, name
            assert host == {p: expected[p] for p in host}, name


# -- 9d: one set of name rules ----------------------------------------------------------------

HOSTILE = {
    "\uff0egit/config": "git_dir",  # fullwidth full stop
    "\ufe52git/config": "git_dir",  # small full stop
    "\uff0e\uff27\uff29\uff34/config": "git_dir",  # all fullwidth
    ".GIT/config": "git_dir",
    ".Git/hooks/pre-commit": "git_dir",
    "sub/.git/x": "git_dir",
    ".git./config": "git_dir",
    ".git /config": "git_dir",
    ".git\u3002/config": "lookalike",  # ideographic full stop: NFKC keeps it
    "git~1/config": "git_dir",
    ".\u200bgit/config": "control_char",  # zero-width space
    ".git\u200d/config": "control_char",  # zero-width joiner
    "\ufeff.git/config": "control_char",  # byte order mark
    ".g\u00adit/config": "control_char",  # soft hyphen
    "\u2024git/config": "git_dir",  # one dot leader
    "\uff0e\uff0e/x": "lookalike",
    "a\uff0fb": "lookalike",
    "a\u2215b": "lookalike",
    "a\uff3cb": "lookalike",
    "x\u3002py": "lookalike",
    "foo./x": "trailing_dot_space",
    "foo /x": "trailing_dot_space",
    "a\\b": "backslash",
    "a/../b": "dotdot",
    "%2e%2e/x": "percent_escape",
    "x\u202ey": "control_char",
    "x\u2028y": "control_char",
    "/".join(["d"] * 129): "bad_path",
}


def _create(path: str) -> str:
    label = "\t" if " " in path else ""
    return (
        f"diff --git a/{path} b/{path}\nnew file mode 100644\n--- /dev/null\n"
        f"+++ b/{path}{label}\n@@ -0,0 +1 @@\n+x\n"
    )


def _agent_reason(box: LocalSandbox, patch: str) -> str:
    """The reason code the agent gives (the part of its PATCH_REJECTED message before ':'),
    asked directly, without the host's own parse in between."""
    with pytest.raises(ToolError) as info:
        box.apply_patch(patch)
    assert info.value.code is ErrorCode.PATCH_REJECTED
    return info.value.message.split(":")[0]


def _host_reasons(patch: str) -> list[str]:
    with pytest.raises(ChangesetInvalidError) as info:
        check_diff(patch, MemoryTree({"a.txt": b"a\n"}))
    return [r.code for r in info.value.reasons]


@pytest.mark.parametrize("name", list(HOSTILE), ids=[ascii(n)[:40] for n in HOSTILE])
def test_hostile_names_agent_and_host_agree(name: str, tmp_path: Path) -> None:
    patch = _create(name)
    expected = HOSTILE[name]
    with LocalSandbox(tmp_path) as box:
        assert _agent_reason(box, patch) == expected
        executor = ToolExecutor(box).execute(1, "p", "apply_patch", {"patch": patch})
        assert executor.error is not None
        assert executor.error["code"] == ErrorCode.PATCH_REJECTED.value
        assert executor.error["message"].split(":")[0] == expected
    assert _host_reasons(patch) == [expected]
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "name",
    [
        "caf\u00e9/cr\u00e8me.txt",
        "\u65e5\u672c/x.txt",
        "docs/x.gitignore",
        "git/x",
        ".g\u0131t/x",  # dotless i: no folding makes it .git, on any system
    ],
)
def test_plain_names_pass_on_both_sides(name: str, tmp_path: Path) -> None:
    patch = _create(name)
    check_diff(patch, MemoryTree({"a.txt": b"a\n"}))
    with LocalSandbox(tmp_path) as box:
        box.apply_patch(patch)
    assert (tmp_path / name).read_bytes() == b"x\n"
