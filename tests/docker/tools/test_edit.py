"""replace_text on the real agent (over pipes and in a container): exactly one match,
atomic, restorable."""

from __future__ import annotations

import hashlib

import pytest

from controller.errors import ErrorCode, ToolError
from tests.support.harness import AgentWorkspace

A_PY = "def f(text):\n    return text.split(',')\n\nx = 'aaa'\n"


@pytest.fixture
def ws(agent: AgentWorkspace) -> AgentWorkspace:
    agent.setup(
        {
            "src/a.py": A_PY,
            "run.sh": "#!/bin/sh\necho hi\n",
            "crlf.txt": b"one\r\ntwo\r\n",
            "latin1.txt": b"caf\xe9\n",
            ".env": "A=1\n",
        },
        modes={"run.sh": 0o755},
        links={"link.txt": "{outside}/outside.txt", "linkdir": "{outside}"},
        fifos=["fifo"],
        outside={"outside.txt": "secret\n"},
    )
    return agent


def test_exact_replacement_is_atomic_and_keeps_the_mode(ws: AgentWorkspace) -> None:
    res = ws.box.replace_text(
        "src/a.py", "    return text.split(',')", "    return text.split(',') if text else []"
    )
    after = ws.read("src/a.py")
    assert after == A_PY.replace("split(',')\n", "split(',') if text else []\n").encode()
    assert (res.line, res.removed_lines, res.added_lines) == (2, 1, 1)
    assert res.sha256_before == hashlib.sha256(A_PY.encode()).hexdigest()
    assert res.sha256_after == hashlib.sha256(after).hexdigest()
    ws.box.replace_text("run.sh", "echo hi", "echo hello")
    files = ws.files()
    assert files["run.sh"] == (b"#!/bin/sh\necho hello\n", 0o755)
    assert not [p for p in files if ".patchbox-tmp-" in p]


@pytest.mark.parametrize(
    ("path", "old", "new", "message"),
    [
        ("src/a.py", "not there", "x", "not found"),
        ("src/a.py", "text", "txt", "more than once"),
        ("src/a.py", "aa", "b", "more than once"),  # overlapping occurrences in 'aaa'
        ("src/a.py", "x = 'aaa'", "x = 'aaa'   ", "trailing whitespace"),
        ("src/a.py", "    return", " \treturn", "space before tab"),
    ],
)
def test_rejections_leave_the_workspace_unchanged(
    ws: AgentWorkspace, path: str, old: str, new: str, message: str
) -> None:
    before = ws.files()
    with pytest.raises(ToolError, match=message) as info:
        ws.box.replace_text(path, old, new)
    assert info.value.code is ErrorCode.PATCH_REJECTED
    assert ws.files() == before


@pytest.mark.parametrize(
    ("path", "code"),
    [
        ("link.txt", ErrorCode.TOOL_PATH_DENIED),
        ("linkdir/outside.txt", ErrorCode.TOOL_PATH_DENIED),
        (".env", ErrorCode.TOOL_PATH_DENIED),
        ("fifo", ErrorCode.TOOL_PATH_DENIED),
        ("latin1.txt", ErrorCode.TOOL_PATH_DENIED),
        ("src", ErrorCode.TOOL_PATH_DENIED),
        ("missing.py", ErrorCode.TOOL_FILE_NOT_FOUND),
        ("../outside.txt", ErrorCode.TOOL_PATH_DENIED),
        ("/etc/hosts", ErrorCode.TOOL_PATH_INVALID),
    ],
)
def test_denied_paths(ws: AgentWorkspace, path: str, code: ErrorCode) -> None:
    before = ws.files()
    with pytest.raises(ToolError) as info:
        ws.box.replace_text(path, "secret", "public")
    assert info.value.code is code
    assert ws.files() == before
    assert ws.outside("outside.txt") == b"secret\n"


def test_crlf_is_preserved(ws: AgentWorkspace) -> None:
    ws.box.replace_text("crlf.txt", "two\r\n", "2\r\n")
    assert ws.read("crlf.txt") == b"one\r\n2\r\n"


def test_identical_texts_are_invalid_arguments(ws: AgentWorkspace) -> None:
    with pytest.raises(ToolError) as info:
        ws.box.session.call(
            "replace_text", {"path": "src/a.py", "oldText": "x", "newText": "x"}, 10
        )
    assert info.value.code is ErrorCode.TOOL_ARGUMENTS_INVALID


def test_an_edit_makes_a_new_version(ws: AgentWorkspace) -> None:
    first = ws.box.search_text("split")
    res = ws.box.replace_text("src/a.py", "split(',')", "split(';')")
    assert res.version > first.version
    after = ws.box.search_text("split")
    assert after.cached is False
    assert after.hits[0].text == "    return text.split(';')"
