"""read_file attacked on the real agent (over pipes and in a container): every denial is the
refusal says why (TOOL_FILE_NOT_FOUND, TOOL_PATH_INVALID, TOOL_PATH_DENIED) and never more
than "not allowed" for a protected name, nothing blocks, nothing outside the workspace is ever returned."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from controller.errors import ErrorCode, ToolError
from controller.sandbox.docker import DockerSandbox
from controller.sandbox.local import LocalSandbox
from controller.tools.executor import ToolExecutor
from tests.support.harness import AgentWorkspace
from tests.support.sandbox import SandboxFactory

MARKER = "TOP-MARKER-OUTSIDE"


@pytest.fixture
def ws(agent: AgentWorkspace) -> AgentWorkspace:
    agent.setup(
        {
            "a.txt": "hello\n",
            "sub/b.txt": "b\n",
            ".git/config": "[core]\n",
            ".GIT/config": "[core]\n",
            "sub/.Git/HEAD": "ref\n",
            ".env": "TOKEN=x\n",
            ".env.local": "TOKEN=y\n",
            "key.pem": "-----BEGIN-----\n",
            "id_rsa": "key\n",
            "bin.dat": b"\xff\xfe\x00\x01",
            "latin1.txt": b"caf\xe9\n",
            "nul.txt": b"text\x00more\n",
        },
        links={
            "link.txt": "a.txt",
            "escape": "{outside}/secret.txt",
            "procroot": "/proc/self/root/etc/passwd",
            "agentsrc": "/opt/patchbox/agent.py",
            "zero": "/dev/zero",
            "linkdir": "{outside}",
        },
        fifos=["fifo"],
        outside={"secret.txt": MARKER + "\n"},
    )
    return agent


D = ErrorCode.TOOL_PATH_DENIED
INV = ErrorCode.TOOL_PATH_INVALID
N = ErrorCode.TOOL_FILE_NOT_FOUND
PROTECTED = [
    ".git/config",
    ".GIT/config",
    "sub/.Git/HEAD",
    ".env",
    ".env.local",
    "key.pem",
    "id_rsa",
]
DENIED: dict[str, ErrorCode] = {
    "../outside/secret.txt": D,
    "../../etc/passwd": D,
    "/etc/passwd": INV,
    "a/../../etc/passwd": D,
    "sub/../a.txt": D,
    "./a.txt": INV,
    "sub//b.txt": INV,
    "sub\\..\\a.txt": INV,
    "%2e%2e/etc/passwd": N,
    "..%2fetc%2fpasswd": N,
    "a.txt\x00": INV,
    "\uff0e\uff0e/etc/passwd": N,  # fullwidth dots: a name like any other, not ".."
    "\u2024\u2024/etc/passwd": N,  # one-dot leaders
    "": INV,
    ".": INV,
    "sub": D,
    "missing.txt": N,
    "link.txt": D,
    "escape": D,
    "procroot": D,
    "agentsrc": D,
    "zero": D,
    "linkdir/secret.txt": D,
    "fifo": D,
    **dict.fromkeys(PROTECTED, D),
    "bin.dat": D,
    "latin1.txt": D,
    "nul.txt": D,
    "a.txt\n": INV,
    "a.txt\r": INV,
    "\x1b[31ma.txt": INV,
    "x" * 5000: INV,
}


@pytest.mark.parametrize("path", list(DENIED), ids=[repr(p)[:40] for p in DENIED])
def test_every_refusal_says_why_and_nothing_more(ws: AgentWorkspace, path: str) -> None:
    """Each refused path gets its reason's code (no such file, not a relative path, not
    allowed); a protected name gets the bare "not allowed", whatever is behind it."""
    started = time.monotonic()
    with pytest.raises(ToolError) as info:
        ws.box.read_file(path)
    assert info.value.code is DENIED[path]
    if path in PROTECTED:
        assert info.value.message == "not allowed"
    assert MARKER not in info.value.message
    assert time.monotonic() - started < 3, "nothing may block the agent"
    assert ws.box.read_file("a.txt").content == "hello\n"


def test_line_ranges(ws: AgentWorkspace) -> None:
    ws.setup({"lines.txt": "".join(f"line {i}\n" for i in range(1, 101))})
    part = ws.box.read_file("lines.txt", start=10, end=12)
    assert part.content == "line 10\nline 11\nline 12\n"
    assert (part.start_line, part.end_line, part.total_lines) == (10, 12, 100)
    assert part.truncated is False
    tail = ws.box.read_file("lines.txt", start=99)
    assert (tail.content, tail.end_line, tail.truncated) == ("line 99\nline 100\n", 100, False)
    past = ws.box.read_file("lines.txt", start=500)
    assert (past.content, past.end_line) == ("", 499)


def test_huge_sparse_file_is_refused_quickly(ws: AgentWorkspace) -> None:
    cmd = "import os; f = open('sparse.bin', 'wb'); f.truncate(2 * 1024**3); f.close()"
    py = "python3" if ws.kind == "docker" else sys.executable
    assert ws.box.run([py, "-c", cmd], timeout=30).exit_code == 0
    started = time.monotonic()
    with pytest.raises(ToolError) as info:
        ws.box.read_file("sparse.bin")
    assert info.value.code is ErrorCode.TOOL_PATH_DENIED
    assert time.monotonic() - started < 2
    assert "sparse.bin" not in ws.box.search_text("x").model_dump_json()


def _read_or_denied(ws: AgentWorkspace, path: str) -> str | None:
    """The content, or None for a refusal of the path (any other error fails the test)."""
    try:
        return ws.box.read_file(path).content
    except ToolError as exc:
        if exc.code not in (ErrorCode.TOOL_PATH_DENIED, ErrorCode.TOOL_FILE_NOT_FOUND):
            raise
        return None


SWAPPER = """
import os, sys, time
end = time.monotonic() + float(sys.argv[2])
os.symlink(sys.argv[1], "link.tmp")
open("file.tmp", "w").write("plain\\n")
while time.monotonic() < end:
    os.symlink(sys.argv[1], "l2.tmp"); os.replace("l2.tmp", "victim")
    open("f2.tmp", "w").write("plain\\n"); os.replace("f2.tmp", "victim")
"""


def test_symlink_swapped_in_during_reads_never_escapes(ws: AgentWorkspace) -> None:
    """A process flips ``victim`` between a file and a link to a secret as fast as it can
    while the agent reads it: every answer is the file's content or a denial."""
    py = "python3" if ws.kind == "docker" else sys.executable
    target = f"{ws.outside_dir}/secret.txt"
    # The session serialises calls, so the swapper runs detached (its own session).
    detach = 'setsid "$0" -c "$1" "$2" 4 >/dev/null 2>&1 & sleep 0.5'  # until setsid ran
    res = ws.box.run(["sh", "-c", detach, py, SWAPPER, target], timeout=30)
    assert res.exit_code == 0
    time.sleep(0.3)
    seen = {"plain": 0, "denied": 0}
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        content = _read_or_denied(ws, "victim")
        if content is None:
            seen["denied"] += 1
            continue
        assert MARKER not in content
        assert content == "plain\n"
        seen["plain"] += 1
    assert seen["plain"] > 10, seen
    assert seen["denied"] > 10, seen  # the link was really there during reads


@pytest.mark.parametrize("kind", ["local", "docker"])
def test_operator_protected_paths_are_invisible(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    protected = ("secrets/**", "*.secret")
    files: dict[str, bytes | str] = {
        "a.txt": "needle\n",
        "secrets/db.yaml": "needle\n",
        "conf/prod.SECRET": "needle\n",
    }
    if kind == "local":
        root = tmp_path / "ws"
        for name, text in files.items():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_text(str(text))
        box: LocalSandbox | DockerSandbox = LocalSandbox(root, protected=protected)
        request.addfinalizer(box.close)
    else:
        make: SandboxFactory = request.getfixturevalue("make_sandbox")
        box = make(protected=protected)
        AgentWorkspace("docker", box, Path("/workspace"), "/tmp/outside").setup(files)
    assert box.list_files().files == ["a.txt"]
    assert [h.path for h in box.search_text("needle").hits] == ["a.txt"]
    for path in ("secrets/db.yaml", "conf/prod.SECRET"):
        with pytest.raises(ToolError) as info:
            box.read_file(path)
        assert info.value.code is ErrorCode.TOOL_PATH_DENIED
    with pytest.raises(ToolError) as info:
        box.read_file("conf")  # a folder no glob covers whole: what it is, as before
    assert info.value.code is ErrorCode.TOOL_PATH_DENIED
    assert "a folder" in info.value.message
    ex = ToolExecutor(box, extra_protected=protected)
    out = ex.execute(
        1, "w", "replace_text", {"path": "secrets/db.yaml", "oldText": "needle", "newText": "x"}
    )
    assert out.error is not None
    assert out.error["code"] == "TOOL_PATH_DENIED"


@pytest.mark.parametrize("kind", ["local", "docker"])
def test_a_folder_a_glob_protects_whole_is_refused_by_name_whether_or_not_it_exists(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Under ``secrets/**`` the name ``secrets`` itself gets the bare "not allowed", as
    ``vault`` (absent) does under ``vault/**``: no answer tells which exists."""
    protected = ("secrets/**", "vault/**")
    files: dict[str, bytes | str] = {"a.txt": "a\n", "secrets/db.yaml": "k\n"}
    if kind == "local":
        root = tmp_path / "ws"
        for name, text in files.items():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_text(str(text))
        box: LocalSandbox | DockerSandbox = LocalSandbox(root, protected=protected)
        request.addfinalizer(box.close)
    else:
        make: SandboxFactory = request.getfixturevalue("make_sandbox")
        box = make(protected=protected)
        AgentWorkspace("docker", box, Path("/workspace"), "/tmp/outside").setup(files)
    answers = []
    for folder in ("secrets", "vault", "SECRETS"):
        with pytest.raises(ToolError) as info:
            box.read_file(folder)
        answers.append((info.value.code, info.value.message))
    assert answers == [(ErrorCode.TOOL_PATH_DENIED, "not allowed")] * 3
    with pytest.raises(ToolError) as info:
        box.read_file("nothing")
    assert info.value.code is ErrorCode.TOOL_FILE_NOT_FOUND  # an unguarded name: as before


def test_a_file_without_read_permission_says_so(make_sandbox: SandboxFactory) -> None:
    """A hostile repository's mode-000 file: refused as not readable, not as a race (in
    the sandbox, whose agent is not root)."""
    box = make_sandbox()
    AgentWorkspace("docker", box, Path("/workspace"), "/tmp/outside").setup({"locked.txt": "s\n"})
    assert box.run(["chmod", "000", "locked.txt"], timeout=30).exit_code == 0
    with pytest.raises(ToolError) as info:
        box.read_file("locked.txt")
    assert info.value.code is ErrorCode.TOOL_PATH_DENIED
    assert info.value.message == "not allowed: it cannot be opened (no permission)"
