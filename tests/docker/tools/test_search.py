"""list_files / search_text on the real agent (over pipes and in a container)."""

from __future__ import annotations

import sys
import time

import pytest

from controller.errors import ErrorCode, ToolError
from tests.support.harness import AgentWorkspace


@pytest.fixture
def ws(agent: AgentWorkspace) -> AgentWorkspace:
    agent.setup(
        {
            "src/a.py": "import os\n\ndef needle():\n    return 'needle'\n",
            "src/pkg/b.py": "x = 1\ny = 'needle'\n",
            "src/crlf.txt": b"one\r\nneedle here\r\n",
            "README.md": "no match\n",
            "bin.dat": b"\x00needle\x00",
            "latin1.txt": b"caf\xe9 needle\n",
            ".env": "needle=secret\n",
            "build/out.py": "needle\n",
            "debug.log": "needle\n",
            ".gitignore": "build/\n*.log\n",
        },
        links={"link.txt": "{outside}/outside.txt", "linkdir": "{outside}"},
        outside={"outside.txt": "needle\n"},
    )
    return agent


def _write(ws: AgentWorkspace, path: str, text: str) -> None:
    """Writes a file the way repo code would: through a process in the sandbox."""
    code = f"open({path!r}, 'w').write({text!r})"
    res = ws.box.run(
        ["python3", "-c", code] if ws.kind == "docker" else [sys.executable, "-c", code], timeout=30
    )
    assert res.exit_code == 0, res.output


def test_listing_hides_ignored_protected_and_linked(ws: AgentWorkspace) -> None:
    box = ws.box
    assert box.list_files().files == [
        ".gitignore",
        "README.md",
        "bin.dat",
        "latin1.txt",
        "src/a.py",
        "src/crlf.txt",
        "src/pkg/b.py",
    ]
    assert box.list_files(glob="*.py").files == ["src/a.py", "src/pkg/b.py"]
    assert box.list_files(glob="src/*.py").files == ["src/a.py"]
    assert box.list_files(glob="src/**").files == ["src/a.py", "src/crlf.txt", "src/pkg/b.py"]


def test_literal_search_hits_text_only(ws: AgentWorkspace) -> None:
    res = ws.box.search_text("needle")
    found = [(h.path, h.line, h.text) for h in res.hits]
    assert found == [
        ("src/a.py", 3, "def needle():"),
        ("src/a.py", 4, "    return 'needle'"),
        ("src/crlf.txt", 2, "needle here"),
        ("src/pkg/b.py", 2, "y = 'needle'"),
    ]
    assert res.truncated is False


def test_search_bounds_and_glob(ws: AgentWorkspace) -> None:
    res = ws.box.search_text("needle", max_results=2)
    assert len(res.hits) == 2
    assert res.truncated is True
    only = ws.box.search_text("needle", glob="src/pkg/*")
    assert [h.path for h in only.hits] == ["src/pkg/b.py"]


def test_long_lines_are_cut(ws: AgentWorkspace) -> None:
    _write(ws, "long.txt", "x" * 5000 + "needle" + "y" * 5000 + "\n")
    hit = next(h for h in ws.box.search_text("needle").hits if h.path == "long.txt")
    assert len(hit.text) == 500


def test_cache_is_per_workspace_version(ws: AgentWorkspace) -> None:
    first = ws.box.search_text("needle")
    again = ws.box.search_text("needle")
    assert (first.cached, again.cached) == (False, True)
    assert again.version == first.version
    assert again.hits == first.hits
    _write(ws, "src/new.py", "needle\n")
    after = ws.box.search_text("needle")
    assert after.cached is False
    assert after.version > first.version
    assert "src/new.py" in [h.path for h in after.hits]


def test_regex_search_and_its_time_bound(ws: AgentWorkspace) -> None:
    res = ws.box.search_text(r"def \w+\(", regex=True)
    assert [(h.path, h.line) for h in res.hits] == [("src/a.py", 3)]
    with pytest.raises(ToolError) as info:
        ws.box.search_text("(unclosed", regex=True)
    assert info.value.code is ErrorCode.TOOL_ARGUMENTS_INVALID
    _write(ws, "evil.txt", "a" * 40 + "!\n")
    bound = 2 if ws.kind == "local" else 10
    started = time.monotonic()
    with pytest.raises(ToolError, match="ran out of time") as info:
        ws.box.search_text("(a+)+$", regex=True)
    assert info.value.code is ErrorCode.TOOL_ARGUMENTS_INVALID
    assert bound - 0.5 < time.monotonic() - started < bound + 4
    assert ws.box.search_text("needle").hits  # the agent is still fine


INDEX_CHANGES = """
import os, shutil
os.makedirs("new/deep", exist_ok=True)
open("new/deep/n.py", "w").write("x\\n")
open("src/pkg/skip.log", "w").write("x\\n")
shutil.rmtree("src/pkg")
os.makedirs("gone", exist_ok=True)
open("gone/g.py", "w").write("x\\n")
"""

INDEX_LINK_SWAP = """
import os, shutil
shutil.rmtree("gone")
os.symlink("/", "gone")
open(".gitignore", "a").write("new/\\n")
"""


def test_index_follows_every_change_of_the_tree(ws: AgentWorkspace) -> None:
    py = "python3" if ws.kind == "docker" else sys.executable
    before = ws.box.list_files()
    assert "src/pkg/b.py" in before.files
    assert ws.box.run([py, "-c", INDEX_CHANGES], timeout=30).exit_code == 0
    after = ws.box.list_files()
    assert after.version > before.version
    assert "new/deep/n.py" in after.files
    assert "gone/g.py" in after.files
    assert not [p for p in after.files if p.startswith("src/pkg/")]
    assert "src/pkg/skip.log" not in after.files
    assert ws.box.run([py, "-c", INDEX_LINK_SWAP], timeout=30).exit_code == 0
    last = ws.box.list_files()
    assert not [p for p in last.files if p.startswith(("gone", "new/"))]
    assert ".gitignore" in last.files
    assert ws.box.run(["true"], timeout=30).exit_code == 0
    assert ws.box.list_files().files == last.files
