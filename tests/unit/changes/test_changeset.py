"""changeset: validation of a job's one diff.

Every refusal is a table case with its exact reason code, run twice: against the in-memory
baseline tree (pure, milliseconds) and against a real baseline in the controller's private
git dir (``git cat-file`` reads and the ``git apply --check --cached`` patch check). Both must
give the same codes, and the same summary for accepted diffs.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from controller.changes.changeset import ChangesetLimits, Prepared
from controller.changes.gittree import git_patch_check
from controller.changes.rules import check_diff, policy_reason
from controller.changes.tree import CheckOutcome, IndexEntry, MemoryTree
from controller.changes.validate import prepare_changeset, validate_changeset
from controller.errors import ChangesetInvalidError, ErrorCode
from controller.reasons import REASONS, ChangesetReason
from controller.repo.baseline import Baseline, build_baseline
from patchbox_agent import diffs
from tests.support.git import Content, git, init, make_diff, write_files

BASE: dict[str, Content] = {
    "f.txt": b"a\nb\nc\n",
    "run.sh": (0o755, b"#!/bin/sh\necho hi\n"),
    "src/m.py": b"x = 1\ny = 2\n",
    ".env": b"SECRET=1\n",
    "dir/x.txt": b"x\n",
    "bin.dat": b"ok\n\xff\n",
    "crlf.txt": b"one\r\ntwo\r\n",
    "noeol.txt": b"last",
    "\u00e9t\u00e9/caf\u00e9.txt": "caf\u00e9\n".encode(),
}
LINKS = {"link": "/etc"}
GITLINKS = ("sub",)


def memory_tree() -> MemoryTree:
    files: dict[str, bytes | tuple[str, bytes]] = {}
    for name, value in BASE.items():
        mode, data = value if isinstance(value, tuple) else (0o644, value)
        files[name] = ("100755" if mode & 0o111 else "100644", data)
    files["link"] = ("120000", b"/etc")
    files["sub"] = ("160000", b"")
    return MemoryTree(files)


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> Baseline:
    repo = init(
        tmp_path_factory.mktemp("changeset") / "repo",
        BASE,
        symlinks=LINKS,
        gitlinks=GITLINKS,
        message="init",
    ).path
    return build_baseline(repo)[0]


Check = Callable[..., Prepared]


@pytest.fixture(params=["memory", "git"])
def check(request: pytest.FixtureRequest) -> Check:
    """The validator against one of the two trees (same content)."""
    if request.param == "memory":
        tree = memory_tree()
        return lambda diff, **kw: check_diff(diff, tree, **kw)
    base: Baseline = request.getfixturevalue("baseline")
    return lambda diff, **kw: prepare_changeset(base, diff, **kw)


def d(*lines: str) -> str:
    return "".join(line + "\n" for line in lines)


HUNK = ("@@ -1,3 +1,3 @@", " a", "-b", "+B", " c")


def modify(path: str, *header: str, body: tuple[str, ...] = HUNK) -> tuple[str, ...]:
    return (f"diff --git a/{path} b/{path}", *header, f"--- a/{path}", f"+++ b/{path}", *body)


def quoted_create(inner: str) -> tuple[str, ...]:
    return (
        f'diff --git "a/{inner}" "b/{inner}"',
        "new file mode 100644",
        "--- /dev/null",
        f'+++ "b/{inner}"',
        "@@ -0,0 +1 @@",
        "+x",
    )


def create(path: str, *lines: str, mode: str = "100644", label: str = "") -> tuple[str, ...]:
    return (
        f"diff --git a/{path} b/{path}",
        f"new file mode {mode}",
        "--- /dev/null",
        f"+++ b/{path}{label}",
        f"@@ -0,0 +1,{len(lines)} @@",
        *(f"+{line}" for line in lines),
    )


def delete(path: str, *lines: str, mode: str = "100644") -> tuple[str, ...]:
    return (
        f"diff --git a/{path} b/{path}",
        f"deleted file mode {mode}",
        f"--- a/{path}",
        "+++ /dev/null",
        f"@@ -1,{len(lines)} +0,0 @@",
        *(f"-{line}" for line in lines),
    )


def rename(old: str, new: str, *header: str) -> tuple[str, ...]:
    return (
        f"diff --git a/{old} b/{new}",
        *header,
        "similarity index 100%",
        f"rename from {old}",
        f"rename to {new}",
    )


def codes(check: Check, diff: str | bytes, **kwargs: Any) -> list[str]:
    with pytest.raises(ChangesetInvalidError) as info:
        check(diff, **kwargs)
    assert info.value.code == ErrorCode.CHANGESET_INVALID
    found = [r.code for r in info.value.reasons]
    assert set(found) <= REASONS
    return sorted(found)


BINARY = (
    "diff --git a/f.bin b/f.bin",
    "new file mode 100644",
    "index 0000000..1111111",
    "GIT binary patch",
    "literal 3",
    "KcmZQzWB>pF00031",
    "",
    "literal 0",
    "HcmV?d00001",
    "",
)

REFUSED = [
    # escaping the root, in every spelling
    pytest.param(d(*create("../x", "a")), ["dotdot"], {}, id="dotdot"),
    pytest.param(d(*create("src/../../x", "a")), ["dotdot"], {}, id="dotdot-inner"),
    pytest.param(
        d(
            "diff --git a//etc/passwd b//etc/passwd",
            "new file mode 100644",
            "--- /dev/null",
            "+++ b//etc/passwd",
            "@@ -0,0 +1 @@",
            "+x",
        ),
        ["absolute_path"],
        {},
        id="absolute",
    ),
    pytest.param(d(*create("a\\..\\..\\x", "a")), ["backslash"], {}, id="backslash"),
    pytest.param(d(*quoted_create("x\\000y")), ["nul"], {}, id="quoted-nul"),
    pytest.param(d(*create("x", "a")).replace("+a", "+a\x00"), ["nul"], {}, id="raw-nul"),
    pytest.param(d(*quoted_create("x\\033[1m")), ["control_char"], {}, id="escape-char"),
    pytest.param(d(*quoted_create("x\\r")), ["control_char"], {}, id="cr-in-name"),
    pytest.param(d(*create("x\u2028y", "a")), ["control_char"], {}, id="line-separator"),
    pytest.param(d(*create("x\u202ey", "a")), ["control_char"], {}, id="bidi-override"),
    pytest.param(d(*create("%2e%2e/x", "a")), ["percent_escape"], {}, id="percent"),
    pytest.param(d(*create("\uff0e\uff0e/x", "a")), ["lookalike"], {}, id="fullwidth-dots"),
    pytest.param(d(*create("a\uff0fb", "a")), ["lookalike"], {}, id="fullwidth-slash"),
    pytest.param(d(*create("\u2024\u2024/x", "a")), ["lookalike"], {}, id="one-dot-leader"),
    pytest.param(d(*create("a\u2215x", "a")), ["lookalike"], {}, id="division-slash"),
    pytest.param(d(*create("a\uff3cx", "a")), ["lookalike"], {}, id="fullwidth-backslash"),
    pytest.param(d(*create("x\u3002py", "a")), ["lookalike"], {}, id="ideographic-stop"),
    pytest.param(d(*create("foo./x", "a")), ["trailing_dot_space"], {}, id="trailing-dot"),
    pytest.param(
        d(*create("foo /x", "a", label="\t")), ["trailing_dot_space"], {}, id="trailing-space"
    ),
    # .git in any case and component
    pytest.param(d(*create(".git/config", "a")), ["git_dir"], {}, id="git-config"),
    pytest.param(d(*create(".GIT/hooks/pre-commit", "a")), ["git_dir"], {}, id="git-upper"),
    pytest.param(d(*create("src/.git/x", "a")), ["git_dir"], {}, id="git-inner"),
    pytest.param(d(*create(".git./x", "a")), ["git_dir"], {}, id="git-dot"),
    pytest.param(d(*create("git~1/x", "a")), ["git_dir"], {}, id="git-short-name"),
    # content kinds
    pytest.param(d(*BINARY), ["binary"], {}, id="git-binary-patch"),
    pytest.param(
        d("diff --git a/f.bin b/f.bin", "Binary files a/f.bin and b/f.bin differ"),
        ["binary"],
        {},
        id="binary-files-differ",
    ),
    pytest.param(d(*create("l", "/etc", mode="120000")), ["symlink_mode"], {}, id="new-symlink"),
    pytest.param(d(*create("m", "x", mode="160000")), ["gitlink"], {}, id="new-gitlink"),
    pytest.param(d(*modify("bin.dat", body=("@@ -1 +1 @@", "-ok", "+OK"))), ["not_text"], {}),
    pytest.param(
        d(*create("l", "/etc", mode="120000"), *create("l/passwd", "x")),
        ["symlink_mode"],
        {},
        id="symlink-then-write-through",
    ),
    # submodules
    pytest.param(d(*create(".gitmodules", "[submodule]")), ["submodule"], {}, id="gitmodules"),
    pytest.param(
        d(*create("x/.GitModules", "[submodule]")),
        ["submodule"],
        {"allowed_paths": ["x/.GitModules"]},
        id="gitmodules-even-allowed",
    ),
    pytest.param(d(*create("sub/x", "a")), ["submodule"], {}, id="into-submodule"),
    pytest.param(d(*modify("sub", body=("@@ -1 +1 @@", "-a", "+b"))), ["submodule"], {}),
    # the baseline's symlinks
    pytest.param(d(*create("link/passwd", "x")), ["symlink_path"], {}, id="through-symlink"),
    pytest.param(d(*modify("link", body=("@@ -1 +1 @@", "-/etc", "+/"))), ["symlink_path"], {}),
    pytest.param(d(*delete("link", "/etc")), ["symlink_path"], {}, id="delete-symlink"),
    # header and section shape
    pytest.param(
        d("diff --git a/f.txt b/f.txt", "--- a/f.txt", "+++ b/g.txt", *HUNK),
        ["header_mismatch"],
        {},
        id="header-path-mismatch",
    ),
    pytest.param(
        d("diff --git a/f.txt b/g.txt", "--- a/f.txt", "+++ b/f.txt", *HUNK),
        ["header_mismatch"],
        {},
        id="diff-git-line-mismatch",
    ),
    pytest.param(
        d(*modify("f.txt")).replace("--- a/f.txt\n", "--- a/f.txt\r\n"), ["crlf_header"], {}
    ),
    pytest.param(
        d(*modify("f.txt")).replace("b/f.txt\n", "b/f.txt\r\n", 1),
        ["crlf_header"],
        {},
        id="crlf-diff-git-line",
    ),
    pytest.param(d(*modify("f.txt"), *modify("f.txt")), ["duplicate_file"], {}, id="duplicate"),
    pytest.param(
        d(*modify("f.txt"), *rename("src/m.py", "f.txt")), ["duplicate_file"], {}, id="dup-rename"
    ),
    pytest.param(d(*create("A.txt", "a"), *create("a.txt", "a")), ["case_collision"], {}),
    pytest.param(
        d(
            "diff --git a/f.txt b/g.txt",
            "similarity index 100%",
            "copy from f.txt",
            "copy to g.txt",
        ),
        ["copy"],
        {},
        id="copy",
    ),
    pytest.param("Here is the patch:\n" + d(*modify("f.txt")), ["garbage"], {}, id="prose"),
    pytest.param("```diff\n" + d(*modify("f.txt")) + "```\n", ["fence"], {}, id="fence"),
    pytest.param("*** Begin Patch\n" + d(*modify("f.txt")), ["begin_patch"], {}, id="begin"),
    # protected, configuration and allowed paths
    pytest.param(
        d(*modify(".env", body=("@@ -1 +1 @@", "-SECRET=1", "+S=2"))), ["protected_path"], {}
    ),
    pytest.param(d(*create("keys/id_rsa", "k")), ["protected_path"], {}, id="key-file"),
    pytest.param(d(*create("conf/server.PEM", "k")), ["protected_path"], {}, id="pem-upper"),
    pytest.param(
        d(*create("secrets/token.txt", "t")),
        ["protected_path"],
        {"extra_protected": ["secrets/**"]},
        id="operator-protected",
    ),
    pytest.param(d(*create(".github/workflows/ci.yml", "on: push")), ["config_path"], {}),
    pytest.param(d(*create("Makefile", "all:")), ["config_path"], {}, id="makefile"),
    pytest.param(d(*modify("f.txt")), ["not_allowed"], {"allowed_paths": ["src/"]}, id="outside"),
    # renames onto (or off) protected paths
    pytest.param(d(*rename("f.txt", ".env.local")), ["protected_path"], {}, id="rename-to-env"),
    pytest.param(d(*rename("f.txt", ".GIT/x")), ["git_dir"], {}, id="rename-into-git"),
    pytest.param(
        d(*rename("f.txt", ".github/workflows/x.yml")), ["config_path"], {}, id="rename-to-ci"
    ),
    pytest.param(d(*rename("f.txt", "link/x")), ["symlink_path"], {}, id="rename-through-link"),
    pytest.param(d(*rename("f.txt", "sub/x")), ["submodule"], {}, id="rename-into-submodule"),
    pytest.param(d(*rename(".env", "env.txt")), ["protected_path"], {}, id="rename-from-env"),
    pytest.param(d(*rename("f.txt", "dir/x.txt")), ["exists"], {}, id="rename-onto-file"),
    # modes
    pytest.param(
        d(*modify("f.txt", "old mode 100644", "new mode 100755")),
        ["mode_escalation"],
        {},
        id="chmod-x",
    ),
    pytest.param(d(*create("new.sh", "x", mode="100755")), ["mode_escalation"], {}, id="new-exec"),
    pytest.param(
        d(*rename("f.txt", "g.txt", "old mode 100644", "new mode 100755")),
        ["mode_escalation"],
        {},
        id="rename-chmod-x",
    ),
    pytest.param(
        d(*modify("f.txt", "old mode 100755", "new mode 100644")),
        ["mode_mismatch"],
        {},
        id="old-mode-lies",
    ),
    pytest.param(
        d(*modify("f.txt", "index 9a5e7a3..ee1e0b0 100755")),
        ["mode_mismatch"],
        {},
        id="index-mode-lies",
    ),
    pytest.param(
        d(*delete("f.txt", "a", "b", "c", mode="100755")), ["mode_mismatch"], {}, id="delete-mode"
    ),
    # the content of the baseline
    pytest.param(
        d(*modify("f.txt", body=("@@ -1,3 +1,3 @@", " a", "-x", "+B", " c"))),
        ["context_mismatch"],
        {},
        id="context",
    ),
    pytest.param(
        d(*modify("f.txt", body=("@@ -2,2 +2,2 @@", " a", "-b", "+B"))),
        ["context_mismatch"],
        {},
        id="offset-not-searched",
    ),
    pytest.param(d(*modify("nope.txt")), ["missing"], {}, id="missing"),
    pytest.param(d(*rename("nope.txt", "x.txt")), ["missing"], {}, id="rename-missing"),
    pytest.param(d(*create("f.txt", "a")), ["exists"], {}, id="exists"),
    pytest.param(
        d(*modify("f.txt", "index 1234567..89abcde 100644")), ["index_mismatch"], {}, id="index"
    ),
    pytest.param(d(*create("f.txt/x", "a")), ["path_conflict"], {}, id="file-as-folder"),
    pytest.param(d(*create("dir", "a")), ["path_conflict"], {}, id="folder-as-file"),
    pytest.param(d(*modify("dir")), ["path_conflict"], {}, id="modify-folder"),
    pytest.param(d(*create("F.TXT", "a")), ["case_collision"], {}, id="case-file"),
    pytest.param(d(*create("DIR/y.txt", "a")), ["case_collision"], {}, id="case-folder"),
    pytest.param(d(*create("e\u0301te\u0301/x", "a")), ["case_collision"], {}, id="nfd-folder"),
    # limits
    pytest.param(
        d(*modify("f.txt"), *create("g.txt", "a")),
        ["too_many_files"],
        {"limits": ChangesetLimits(max_files=1)},
        id="too-many-files",
    ),
    pytest.param(
        d(*modify("f.txt")), ["too_large"], {"limits": ChangesetLimits(max_diff_bytes=40)}
    ),
    pytest.param(
        d(*modify("f.txt"), *create("big.txt", *["x" * 50] * 4)),
        ["file_too_large"],
        {"limits": ChangesetLimits(max_file_diff_bytes=150)},
        id="file-section-too-large",
    ),
    pytest.param(
        d(*create("big.txt", *["x" * 50] * 4)),
        ["file_too_large"],
        {"limits": ChangesetLimits(max_file_bytes=100)},
        id="file-content-too-large",
    ),
    pytest.param(
        d(*modify("run.sh", body=("@@ -1,2 +1,2 @@", " #!/bin/sh", "-echo hi", "+echo ho"))),
        ["file_too_large"],
        {"limits": ChangesetLimits(max_file_bytes=10)},
        id="baseline-content-too-large",
    ),
]


@pytest.mark.parametrize(("diff", "expected", "kwargs"), REFUSED)
def test_refused_with_its_reason(
    check: Check, diff: str, expected: list[str], kwargs: dict[str, Any]
) -> None:
    assert codes(check, diff, **kwargs) == expected


def test_every_bad_file_is_named(check: Check) -> None:
    diff = d(*create(".env.x", "a"), *modify("f.txt"), *create("src/ok.py", "a"))
    with pytest.raises(ChangesetInvalidError) as info:
        check(diff, allowed_paths=["src/"])
    assert [(r.code, r.path) for r in info.value.reasons] == [
        ("protected_path", ".env.x"),
        ("not_allowed", "f.txt"),
    ]
    assert ".env.x" in info.value.message


def test_bytes_that_are_not_utf8_are_refused(check: Check) -> None:
    assert codes(check, d(*modify("f.txt")).encode() + b"\xff\n") == ["not_text"]


# --------------------------------------------------------------------------------------
# Accepted diffs: the summary


AFTER: dict[str, Content] = {
    "f.txt": b"a\nB\nc\n",
    "run.sh": (0o644, b"#!/bin/sh\necho hi\n"),
    "src/moved.py": b"x = 1\ny = 2\n",
    "dir/x.txt": b"x\n",
    "dir/new/n.py": b"print('n')\n",
    "crlf.txt": b"one\r\nTWO\r\n",
    "noeol.txt": b"last line",
    "\u00e9t\u00e9/caf\u00e9.txt": "caf\u00e9 cr\u00e8me\n".encode(),
}
TOUCHED = {k: v for k, v in BASE.items() if k not in ("bin.dat", ".env")}


def _sha(value: Content) -> str:
    return hashlib.sha256(value[1] if isinstance(value, tuple) else value).hexdigest()


def test_summary_of_every_kind_of_change(
    check: Check, tmp_path_factory: pytest.TempPathFactory
) -> None:
    diff = make_diff(tmp_path_factory.getbasetemp(), TOUCHED, AFTER)
    prepared = check(diff)
    summary = prepared.changeset
    files = {f.path: f for f in summary.files}
    assert set(files) == {
        "f.txt",
        "run.sh",
        "src/moved.py",
        "dir/new/n.py",
        "crlf.txt",
        "noeol.txt",
        "\u00e9t\u00e9/caf\u00e9.txt",
    }
    assert files["src/moved.py"].kind == "rename"
    assert files["src/moved.py"].old_path == "src/m.py"
    assert files["dir/new/n.py"].kind == "create"
    assert (files["run.sh"].mode_before, files["run.sh"].mode_after) == ("100755", "100644")
    assert (files["crlf.txt"].added, files["crlf.txt"].removed) == (1, 1)
    assert summary.added == sum(f.added for f in summary.files) == 5
    assert summary.removed == sum(f.removed for f in summary.files) == 4
    for f in summary.files:
        assert f.sha256_after == _sha(AFTER[f.path])
        assert f.sha256_before == _sha(BASE[f.old_path or f.path]) if f.kind != "create" else True
    assert summary.diff_sha256 == hashlib.sha256(diff.encode()).hexdigest()
    after = {c.path: c.after for c in prepared.changes}
    assert after["src/m.py"] is None
    assert after["crlf.txt"] == b"one\r\nTWO\r\n"
    assert after["noeol.txt"] == b"last line"


def test_a_deleted_file_and_a_kept_exec_bit(check: Check) -> None:
    diff = d(
        *delete("src/m.py", "x = 1", "y = 2"),
        *modify("run.sh", body=("@@ -1,2 +1,2 @@", " #!/bin/sh", "-echo hi", "+echo ho")),
    )
    files = {f.path: f for f in check(diff).changeset.files}
    assert files["src/m.py"].kind == "delete"
    assert files["src/m.py"].sha256_after is None
    assert files["src/m.py"].mode_after is None
    assert files["run.sh"].mode_after == "100755"


def test_both_trees_give_the_same_summary(
    baseline: Baseline, tmp_path_factory: pytest.TempPathFactory
) -> None:
    diff = make_diff(tmp_path_factory.getbasetemp(), TOUCHED, AFTER)
    in_memory = check_diff(diff, memory_tree()).changeset
    on_git = validate_changeset(baseline, diff)
    assert on_git.baseline_tree == baseline.tree
    assert in_memory.model_copy(update={"baseline_tree": baseline.tree}) == on_git


def test_configuration_paths_pass_when_the_task_names_them(check: Check) -> None:
    diff = d(*create(".github/workflows/ci.yml", "on: push"))
    summary = check(diff, allowed_paths=[".github/"]).changeset
    assert [f.path for f in summary.files] == [".github/workflows/ci.yml"]


# --------------------------------------------------------------------------------------
# The patch check


def _fake_check(outcome: CheckOutcome, seen: list[Sequence[IndexEntry]]) -> Any:
    def start(diff: bytes, entries: Sequence[IndexEntry]) -> Callable[[], CheckOutcome]:
        seen.append(entries)
        return lambda: outcome

    return start


def test_a_refused_patch_check_refuses_the_change_set() -> None:
    seen: list[Sequence[IndexEntry]] = []
    with pytest.raises(ChangesetInvalidError) as info:
        check_diff(
            d(*modify("f.txt")),
            memory_tree(),
            patch_check=_fake_check(CheckOutcome(ok=False, message="no", numstat=[]), seen),
        )
    assert [r.code for r in info.value.reasons] == ["patch_check"]
    assert [e.path for e in seen[0]] == ["f.txt"]


def test_git_reading_other_stats_refuses_the_change_set() -> None:
    wrong = CheckOutcome(ok=True, message="", numstat=[("f.txt", 2, 1)])
    with pytest.raises(ChangesetInvalidError) as info:
        check_diff(d(*modify("f.txt")), memory_tree(), patch_check=_fake_check(wrong, []))
    assert [(r.code, r.path) for r in info.value.reasons] == [("stats_mismatch", "f.txt")]
    right = CheckOutcome(ok=True, message="", numstat=[("f.txt", 1, 1)])
    check_diff(d(*modify("f.txt")), memory_tree(), patch_check=_fake_check(right, []))


def test_git_patch_check_on_the_private_baseline(baseline: Baseline) -> None:
    tree = memory_tree()
    entry = tree.lookup("f.txt").entry
    assert entry is not None
    start = git_patch_check(Path(baseline.private_git_dir))
    entries = [IndexEntry(entry.mode, entry.oid, "f.txt")]
    good = start(d(*modify("f.txt")).encode(), entries)()
    assert good == CheckOutcome(ok=True, message="", numstat=[("f.txt", 1, 1)])
    renamed = d(*rename("f.txt", "g h.txt"))
    assert start(renamed.encode(), entries)().numstat == [("g h.txt", 0, 0)]
    # git searches for moved context; the strict parser does not: each must refuse alone
    bad = d(*modify("f.txt", body=("@@ -1,3 +1,3 @@", " a", "-x", "+B", " c")))
    refused = start(bad.encode(), entries)()
    assert not refused.ok
    assert "patch failed" in refused.message or "does not apply" in refused.message
    assert not start(d(*modify("f.txt")).encode(), [])().ok


def test_sha256_repositories(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "--object-format=sha256")
    write_files(repo, {"f.txt": b"a\nb\nc\n"})
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "init")
    base = build_baseline(repo)[0]
    assert len(base.tree) == 64
    (repo / "f.txt").write_bytes(b"a\nB\nc\n")
    diff = git(repo, "diff")
    (repo / "f.txt").write_bytes(b"a\nb\nc\n")
    summary = validate_changeset(base, diff)
    assert [f.path for f in summary.files] == ["f.txt"]
    sha1_diff = make_diff(tmp_path, {"f.txt": b"a\nb\nc\n"}, {"f.txt": b"a\nB\nc\n"})
    with pytest.raises(ChangesetInvalidError) as info:
        validate_changeset(base, sha1_diff)
    assert [r.code for r in info.value.reasons] == ["index_mismatch"]


# --------------------------------------------------------------------------------------
# The rules as pure functions


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("src/a.py", []),
        ("caf\u00e9/cr\u00e8me.txt", []),
        ("\u65e5\u672c/\u30d5\u30a1\u30a4\u30eb.txt", []),
        ("a\uff0eb", ["lookalike"]),
        ("a\ufe52b", ["lookalike"]),
        ("a\u2044b", ["lookalike"]),
        ("a\ufe68b", ["lookalike"]),
        ("x.", ["trailing_dot_space"]),
        ("x /y", ["trailing_dot_space"]),
        ("x\uff0e/y.", ["lookalike"]),  # the first rule that fails names the reason
    ],
)
def test_name_rules(path: str, expected: list[str]) -> None:
    """The name rules are the agent's (``patchbox_agent.diffs.check_path``)."""
    if not expected:
        diffs.check_path(path)
        return
    with pytest.raises(diffs.DiffError) as info:
        diffs.check_path(path)
    assert [info.value.reason] == expected


@pytest.mark.parametrize(
    ("path", "allowed", "extra", "expected"),
    [
        ("src/a.py", None, (), None),
        (".env.prod", None, (), "protected_path"),
        (".env.prod", [".env.prod"], (), "protected_path"),
        ("a/.NPMRC", None, (), "protected_path"),
        ("vendor/x.py", None, (), "config_path"),
        ("vendor/x.py", ["vendor/"], (), None),
        ("pyproject.toml", ["src/"], (), "not_allowed"),
        ("src/a.py", ["SRC"], (), None),
        ("docs/x.md", None, ("docs/**",), "protected_path"),
        ("a/.gitmodules", ["a/"], (), "submodule"),
    ],
)
def test_policy_reasons(
    path: str, allowed: list[str] | None, extra: tuple[str, ...], expected: str | None
) -> None:
    found = policy_reason(path, allowed, extra)
    assert (found.code if found else None) == expected


def test_reason_codes_are_a_closed_set() -> None:
    with pytest.raises(ValueError, match="unknown reason code"):
        ChangesetReason(code="made_up", message="x")
