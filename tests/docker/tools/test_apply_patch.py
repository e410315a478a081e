"""apply_patch on the real agent (over pipes and in a container) and through the executor."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from controller.errors import ErrorCode, ToolError
from controller.tools.executor import ToolExecutor
from tests.support.git import git, init
from tests.support.harness import AgentWorkspace

A_PY = "def f(text):\n    return text.split(',')\n"


@pytest.fixture
def ws(agent: AgentWorkspace) -> AgentWorkspace:
    agent.setup(
        {
            "src/a.py": A_PY,
            "old.txt": "gone\n",
            "run.sh": "#!/bin/sh\n",
            "crlf.txt": b"one\r\ntwo\r\n",
            ".env": "A=1\n",
        },
        modes={"run.sh": 0o755},
        links={"link.txt": "{outside}/t.txt", "linkdir": "{outside}"},
        outside={"t.txt": "secret\n"},
    )
    return agent


MODIFY = """diff --git a/src/a.py b/src/a.py
--- a/src/a.py
+++ b/src/a.py
@@ -1,2 +1,2 @@
 def f(text):
-    return text.split(',')
+    return text.split(',') if text else []
"""

CREATE = """diff --git a/src/new.py b/src/new.py
new file mode 100644
--- /dev/null
+++ b/src/new/../new.py
@@ -0,0 +1 @@
+x = 1
"""


def test_modify_create_delete_rename_in_one_patch(ws: AgentWorkspace) -> None:
    patch = (
        MODIFY
        + "diff --git a/tests/test_a.py b/tests/test_a.py\nnew file mode 100644\n--- /dev/null\n"
        "+++ b/tests/test_a.py\n@@ -0,0 +1 @@\n+assert True\n"
        "diff --git a/old.txt b/old.txt\ndeleted file mode 100644\n--- a/old.txt\n+++ /dev/null\n"
        "@@ -1 +0,0 @@\n-gone\n"
        "diff --git a/run.sh b/bin/run.sh\nsimilarity index 100%\nrename from run.sh\nrename to bin/run.sh\n"
    )
    res = ws.box.apply_patch(patch)
    assert [(f.path, f.kind, f.added, f.removed) for f in res.files] == [
        ("src/a.py", "modify", 1, 1),
        ("tests/test_a.py", "create", 1, 0),
        ("old.txt", "delete", 0, 1),
        ("bin/run.sh", "rename", 0, 0),
    ]
    files = ws.files()
    assert files["src/a.py"][0] == b"def f(text):\n    return text.split(',') if text else []\n"
    assert res.files[0].sha256_before == hashlib.sha256(A_PY.encode()).hexdigest()
    assert files["tests/test_a.py"] == (b"assert True\n", 0o644)
    assert "old.txt" not in files
    assert "run.sh" not in files
    assert files["bin/run.sh"] == (b"#!/bin/sh\n", 0o755)
    assert not [p for p in files if ".patchbox-tmp-" in p]


def _git_diff(tmp_path: Path, files: dict[str, bytes], edit: dict[str, bytes]) -> str:
    """A diff made by real git for the given old and new contents."""
    repo = init(tmp_path / "gitcopy", files, message="base").path
    for name, data in edit.items():
        (repo / name).write_bytes(data)
    return git(repo, "diff")


def test_a_real_git_diff_applies_exactly(ws: AgentWorkspace, tmp_path: Path) -> None:
    new = b"one\r\nTWO\r\nthree\r\n"
    patch = _git_diff(tmp_path, {"crlf.txt": b"one\r\ntwo\r\n"}, {"crlf.txt": new})
    ws.box.apply_patch(patch)
    assert ws.read("crlf.txt") == new


@pytest.mark.parametrize(
    ("patch", "reason"),
    [
        ("```diff\n" + MODIFY + "```\n", "fence"),
        ("Here is the fix:\n" + MODIFY, "garbage"),
        (MODIFY + "Hope this helps!\n", "garbage"),
        ("*** Begin Patch\n" + MODIFY + "*** End Patch\n", "begin_patch"),
        (CREATE, "dotdot|header_mismatch"),
        (MODIFY.replace("+++ b/src/a.py", "+++ b/src/b.py"), "header_mismatch"),
        (MODIFY.replace("@@ -1,2 +1,2 @@", "@@ -1,2 +1,2 @@\r"), "crlf_header"),
        (MODIFY.replace(" def f(text):", " def g(text):"), "context_mismatch"),
        (MODIFY.replace("@@ -1,2 +1,2 @@", "@@ -2,2 +2,2 @@"), "context_mismatch|missing|bad_hunk"),
        (MODIFY + MODIFY, "duplicate_file"),
        (MODIFY.replace("src/a.py", ".git/config"), "git_dir"),
        (MODIFY.replace("src/a.py", "SRC/.GIT/hooks/pre-commit"), "git_dir"),
        (MODIFY.replace("src/a.py", "/etc/passwd"), "absolute_path|header_mismatch|bad_header"),
        (
            "diff --git a/l b/l\nnew file mode 120000\n--- /dev/null\n+++ b/l\n@@ -0,0 +1 @@\n+/etc/passwd\n",
            "symlink_mode",
        ),
        (
            "diff --git a/m b/m\nnew file mode 160000\n--- /dev/null\n+++ b/m\n@@ -0,0 +1 @@\n+Subproject commit 0\n",
            "gitlink",
        ),
        (
            "diff --git a/b.bin b/b.bin\nnew file mode 100644\nGIT binary patch\nliteral 1\nIc${NULL}\n\nliteral 0\n\n",
            "binary",
        ),
        (
            "diff --git a/run.sh b/run.sh\nold mode 100755\nnew mode 100644\n",
            "mode change|mode_change",
        ),
        (
            "diff --git a/x.sh b/x.sh\nnew file mode 100755\n--- /dev/null\n+++ b/x.sh\n@@ -0,0 +1 @@\n+echo\n",
            "100644 only",
        ),
        ("diff --git a/a b/b\ncopy from src/a.py\ncopy to b\n", "copy"),
    ],
)
def test_refused_patches_change_nothing(ws: AgentWorkspace, patch: str, reason: str) -> None:
    before = ws.files()
    with pytest.raises(ToolError, match=reason) as info:
        ws.box.apply_patch(patch)
    assert info.value.code is ErrorCode.PATCH_REJECTED
    assert ws.files() == before


@pytest.mark.parametrize(
    "target",
    ["link.txt", "linkdir/t.txt", ".env"],
)
def test_patches_through_links_or_onto_protected_files_are_refused(
    ws: AgentWorkspace, target: str
) -> None:
    patch = (
        f"diff --git a/{target} b/{target}\n--- a/{target}\n+++ b/{target}\n"
        "@@ -1 +1 @@\n-secret\n+owned\n"
    )
    with pytest.raises(ToolError) as info:
        ws.box.apply_patch(patch)
    assert info.value.code is ErrorCode.PATCH_REJECTED
    assert ws.outside("t.txt") == b"secret\n"
    assert ws.read(".env") == b"A=1\n"


def test_all_or_nothing(ws: AgentWorkspace) -> None:
    """The first file would apply, the second does not: neither changes."""
    bad_second = MODIFY + (
        "diff --git a/crlf.txt b/crlf.txt\n--- a/crlf.txt\n+++ b/crlf.txt\n@@ -1 +1 @@\n-nope\n+x\n"
    )
    before = ws.files()
    with pytest.raises(ToolError, match="context_mismatch"):
        ws.box.apply_patch(bad_second)
    assert ws.files() == before


def test_executor_applies_policy_to_every_path_of_a_patch(ws: AgentWorkspace) -> None:
    ex = ToolExecutor(ws.box, allowed_paths=["src/"])
    ok = ex.execute(1, "p1", "apply_patch", {"patch": MODIFY})
    assert ok.ok
    assert ok.effect == "write"
    outside = MODIFY.replace("src/a.py", "crlf.txt")
    denied = ex.execute(1, "p2", "apply_patch", {"patch": outside})
    assert denied.error is not None
    assert denied.error["code"] == "TOOL_PATH_DENIED"
    assert "allowed_paths" in denied.error["message"]
    garbage = ex.execute(1, "p3", "apply_patch", {"patch": "please apply\n" + MODIFY})
    assert garbage.error is not None
    assert garbage.error["code"] == "PATCH_REJECTED"


TRADITIONAL = (
    "--- a/src/a.py\t2026-01-01 00:00:00.000000000 +0000\n"
    "+++ b/src/a.py\t2026-01-01 00:00:01.000000000 +0000\n"
    "@@ -1,2 +1,2 @@\n def f(text):\n-    return text.split(',')\n"
    "+    return text.split(',') if text else []\n"
    "--- /dev/null\n+++ tests/test_a.py\n@@ -0,0 +1 @@\n+assert True\n"
    "--- old.txt\n+++ /dev/null\n@@ -1 +0,0 @@\n-gone\n"
    "--- a/run.sh\n+++ /dev/null\n@@ -1 +0,0 @@\n-#!/bin/sh\n"
)


def test_a_traditional_diff_applies_as_patch_p1_would(ws: AgentWorkspace) -> None:
    """diff -u's form (prefixes or none, timestamps, /dev/null), an executable file deleted
    under its own mode, through the real agent."""
    done = ws.box.apply_patch(TRADITIONAL)
    assert [(f.path, f.kind) for f in done.files] == [
        ("src/a.py", "modify"),
        ("tests/test_a.py", "create"),
        ("old.txt", "delete"),
        ("run.sh", "delete"),
    ]
    assert (
        ws.read("src/a.py") == A_PY.replace("split(',')\n", "split(',') if text else []\n").encode()
    )
    assert ws.read("tests/test_a.py") == b"assert True\n"
    assert "old.txt" not in ws.files()
    assert "run.sh" not in ws.files()


@pytest.mark.parametrize(
    ("patch", "reason"),
    [
        ("--- a/.env\n+++ b/.env\n@@ -1 +1 @@\n-A=1\n+A=2\n", "may not be written"),
        ("--- link.txt\n+++ link.txt\n@@ -1 +1 @@\n-secret\n+owned\n", "may not be written"),
        (
            "--- linkdir/t.txt\n+++ linkdir/t.txt\n@@ -1 +1 @@\n-secret\n+owned\n",
            "^missing: linkdir/t.txt does not exist$",
        ),
        ("--- a/../x\n+++ b/../x\n@@ -1 +1 @@\n-a\n+b\n", "dotdot"),
        ("--- /etc/hosts\n+++ /etc/hosts\n@@ -1 +1 @@\n-a\n+b\n", "absolute_path"),
        ("--- a/src/a.py\n+++ b/src/b.py\n@@ -1 +1 @@\n-def f(text):\n+x\n", "header_mismatch"),
        ("--- a/.git/config\n+++ b/.git/config\n@@ -1 +1 @@\n-a\n+b\n", "git_dir"),
    ],
)
def test_a_hostile_traditional_diff_changes_nothing(
    ws: AgentWorkspace, patch: str, reason: str
) -> None:
    before = ws.files()
    with pytest.raises(ToolError, match=reason) as info:
        ws.box.apply_patch(patch)
    assert info.value.code is ErrorCode.PATCH_REJECTED
    assert ws.files() == before
    assert ws.outside("t.txt") == b"secret\n"
