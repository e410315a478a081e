"""diffs: strict parsing and exact application of canonical git diffs.

Every refusal asserts its exact reason code. Happy paths are cross-checked against the real
``git apply``, and diffs made by the real ``git diff`` must parse and apply to git's result.
"""

from __future__ import annotations

import random
import subprocess
import unicodedata
from pathlib import Path

import pytest

from patchbox_agent import diffs
from patchbox_agent.diffs import DiffError
from tests.support.git import init

Files = dict[str, bytes]
Spec = dict[str, "bytes | tuple[bytes, bool]"]  # path -> content or (content, executable)

HUNK = ("@@ -1,3 +1,3 @@", " a", "-b", "+B", " c")
ABC = {"f.txt": b"a\nb\nc\n"}
NO_EOL = "\\ No newline at end of file"


def d(*lines: str) -> str:
    return "".join(line + "\n" for line in lines)


def section(a: str, b: str, *header: str, body: tuple[str, ...] = HUNK) -> tuple[str, ...]:
    """A section whose names are given as they appear in the diff (with a/ b/, quoted)."""
    return (f"diff --git {a} {b}", *header, f"--- {a}", f"+++ {b}", *body)


def modify(path: str, *header: str, body: tuple[str, ...] = HUNK) -> tuple[str, ...]:
    return section(f"a/{path}", f"b/{path}", *header, body=body)


def create(path: str, *lines: str, mode: str = "100644") -> tuple[str, ...]:
    return (
        f"diff --git a/{path} b/{path}",
        f"new file mode {mode}",
        "--- /dev/null",
        f"+++ b/{path}",
        f"@@ -0,0 +1,{len(lines)} @@",
        *(f"+{line}" for line in lines),
    )


def delete(path: str, *lines: str) -> tuple[str, ...]:
    return (
        f"diff --git a/{path} b/{path}",
        "deleted file mode 100644",
        f"--- a/{path}",
        "+++ /dev/null",
        f"@@ -1,{len(lines)} +0,0 @@",
        *(f"-{line}" for line in lines),
    )


MODIFY = d(*modify("f.txt"))


def reason_of(text: str, **kwargs: int) -> str:
    with pytest.raises(DiffError) as info:
        diffs.parse(text, **kwargs)
    assert info.value.reason in diffs.REASONS
    return info.value.reason


# --------------------------------------------------------------------------------------
# Refused by parse, each with its reason.

REFUSED = [
    # text as a whole
    pytest.param("", "empty", id="empty"),
    pytest.param("\n\n", "empty", id="blank"),
    pytest.param(MODIFY[:-1], "truncated", id="no-final-newline"),
    pytest.param(MODIFY.replace("+B", "+B\x00"), "nul", id="raw-nul"),
    pytest.param(MODIFY.replace("+B", "+\udcff"), "not_text", id="surrogate"),
    # wrappers and garbage around the diff (git apply ignores them)
    pytest.param("Here is the fix:\n" + MODIFY, "garbage", id="leading-prose"),
    pytest.param(MODIFY + "Hope this helps!\n", "garbage", id="trailing-prose"),
    pytest.param(MODIFY + "\n", "garbage", id="trailing-blank-line"),
    pytest.param("```diff\n" + MODIFY + "```\n", "fence", id="fenced"),
    pytest.param(MODIFY + "```\n", "fence", id="trailing-fence"),
    pytest.param("~~~\n" + MODIFY, "fence", id="tilde-fence"),
    pytest.param(
        d("*** Begin Patch", "*** Update File: f.txt", "@@", "-b", "+B", "*** End Patch"),
        "begin_patch",
        id="begin-patch",
    ),
    pytest.param(MODIFY + "*** End Patch\n", "begin_patch", id="trailing-end-patch"),
    pytest.param(d(*modify("f.txt")[1:]), "garbage", id="plain-unified-diff"),
    pytest.param("From 1234 Mon Sep 17 00:00:00 2001\n" + MODIFY, "garbage", id="mbox"),
    pytest.param(
        d("diff --git a/f.txt b/f.txt", "frobnicate 1", *modify("f.txt")[1:]),
        "garbage",
        id="unknown-header",
    ),
    # names that disagree (git apply takes the +++ target)
    pytest.param(
        d("diff --git a/f.txt b/f.txt", "--- a/f.txt", "+++ b/g.txt", *HUNK),
        "header_mismatch",
        id="plus-differs",
    ),
    pytest.param(
        d("diff --git a/f.txt b/f.txt", "--- a/g.txt", "+++ b/g.txt", *HUNK),
        "header_mismatch",
        id="labels-differ-from-git-line",
    ),
    pytest.param(
        d("diff --git a/f.txt b/g.txt", "old mode 100644", "new mode 100755"),
        "header_mismatch",
        id="git-line-names-differ",
    ),
    pytest.param(
        d("diff --git a/f.txt b/f.txt", "--- f.txt", "+++ f.txt", *HUNK),
        "header_mismatch",
        id="labels-without-prefix",
    ),
    pytest.param(
        d("diff --git f.txt f.txt", "--- a/f.txt", "+++ b/f.txt", *HUNK),
        "header_mismatch",
        id="git-line-without-prefix",
    ),
    pytest.param(
        d("diff --git a/f.txt b/f.txt", "--- /dev/null", "+++ b/f.txt", *HUNK),
        "header_mismatch",
        id="dev-null-without-new-file-mode",
    ),
    pytest.param(
        d("diff --git a/f.txt b/f.txt", "new file mode 100644", "--- a/f.txt", "+++ b/f.txt"),
        "bad_hunk",
        id="labels-without-hunks",
    ),
    pytest.param(
        d(
            "diff --git a/f.txt b/f.txt",
            "new file mode 100644",
            "--- a/f.txt",
            "+++ b/f.txt",
            "@@ -0,0 +1 @@",
            "+x",
        ),
        "header_mismatch",
        id="create-not-from-dev-null",
    ),
    pytest.param(
        d(
            "diff --git a/x b/y",
            "similarity index 90%",
            "rename from x",
            "rename to z",
            "--- a/x",
            "+++ b/z",
            *HUNK,
        ),
        "header_mismatch",
        id="rename-disagrees-with-git-line",
    ),
    pytest.param(
        d(
            "diff --git a/x b/y",
            "similarity index 90%",
            "rename from x",
            "rename to y",
            "--- a/x",
            "+++ b/z",
            *HUNK,
        ),
        "header_mismatch",
        id="rename-disagrees-with-labels",
    ),
    pytest.param(
        d("diff --git a/x b/y", "rename from x"), "bad_header", id="rename-from-without-to"
    ),
    pytest.param(
        d("diff --git a/x b/x", "similarity index 100%", "rename from x", "rename to x"),
        "bad_header",
        id="rename-to-itself",
    ),
    pytest.param(
        d("diff --git a/x b/y", "similarity index 101%", "rename from x", "rename to y"),
        "bad_header",
        id="similarity-over-100",
    ),
    pytest.param(
        d(*modify("f.txt", "similarity index 90%")), "bad_header", id="similarity-no-rename"
    ),
    pytest.param(
        d(*modify("f.txt", "index 1234567..89abcde", "index 1234567..89abcde")),
        "bad_header",
        id="repeated-header",
    ),
    pytest.param(d(*modify("f.txt", "index xyz..abc")), "bad_header", id="bad-index"),
    pytest.param(
        d(*modify("f.txt", "index 0000000..89abcde")), "header_mismatch", id="index-zero-old"
    ),
    pytest.param(
        d(*modify("f.txt"), "--- a/f.txt"),
        "hunk_count_mismatch",
        id="second-label-pair",
    ),
    pytest.param(
        d("diff --git a/f.txt b/f.txt", "--- a/f.txt", "@@ -1 +1 @@", "-a", "+b"),
        "bad_header",
        id="minus-without-plus",
    ),
    pytest.param(
        d("diff --git a/f.txt b/f.txt", "--- a/f.txt\t", "+++ b/f.txt\t", *HUNK),
        "bad_header",
        id="tab-after-name-without-space",
    ),
    # C-quoted names: unquoted per git's rules, then checked
    pytest.param(
        d(*section('"a/x\\000y"', '"b/x\\000y"')), "nul", id="quoted-nul"
    ),  # git truncates at \000
    pytest.param(d(*section('"a/x\\033[2Jy"', '"b/x\\033[2Jy"')), "control_char", id="esc"),
    pytest.param(d(*section('"a/x\\ry"', '"b/x\\ry"')), "control_char", id="quoted-cr"),
    pytest.param(d(*section('"a/x\\ty"', '"b/x\\ty"')), "control_char", id="quoted-tab"),
    pytest.param(d(*section('"a/x\\177"', '"b/x\\177"')), "control_char", id="quoted-del"),
    pytest.param(d(*section('"a/x\\302\\205"', '"b/x\\302\\205"')), "control_char", id="c1"),
    pytest.param(d(*modify("x\x1by")), "control_char", id="raw-esc"),
    pytest.param(d(*modify("x\u202ey")), "control_char", id="bidi-override"),
    pytest.param(d(*modify("x\u2028y")), "control_char", id="line-separator"),
    pytest.param(d(*section('"a/x\\qy"', '"b/x\\qy"')), "bad_quote", id="bad-escape"),
    pytest.param(d(*section('"a/x\\400"', '"b/x\\400"')), "bad_quote", id="octal-over-377"),
    pytest.param(d(*section('"a/xy', '"b/xy')), "bad_quote", id="unterminated"),
    pytest.param(d(*section('"a/x"y"', '"b/x"y"')), "bad_quote", id="inner-quote"),
    pytest.param(d(*section('"a/\\377"', '"b/\\377"')), "not_text", id="quoted-not-utf8"),
    pytest.param(d(*section('"a/x\\\\y"', '"b/x\\\\y"')), "backslash", id="quoted-backslash"),
    # paths
    pytest.param(d(*modify("x\\y")), "backslash", id="raw-backslash"),
    pytest.param(d(*modify("../x")), "dotdot", id="dotdot"),
    pytest.param(d(*modify("sub/../../x")), "dotdot", id="inner-dotdot"),
    pytest.param(d(*modify("./x")), "bad_path", id="dot"),
    pytest.param(d(*modify("x//y")), "bad_path", id="empty-component"),
    pytest.param(d(*modify("x/")), "bad_path", id="trailing-slash"),
    pytest.param(d(*modify("/etc/passwd")), "absolute_path", id="absolute"),
    pytest.param(
        d("diff --git a/f.txt b/f.txt", "--- a/f.txt", "+++ /etc/passwd", *HUNK),
        "absolute_path",
        id="absolute-plus",
    ),
    pytest.param(
        d("diff --git /etc/passwd /etc/passwd", "old mode 100644", "new mode 100755"),
        "absolute_path",
        id="absolute-git-line",
    ),
    pytest.param(d(*modify("%2e%2e/x")), "percent_escape", id="percent-dotdot"),
    pytest.param(d(*modify("x%2Fy")), "percent_escape", id="percent-slash"),
    pytest.param(d(*modify("x" * 5000)), "bad_path", id="too-long"),
    pytest.param(d(*modify(".git/config")), "git_dir", id="git-config"),
    pytest.param(d(*modify(".GIT/config")), "git_dir", id="git-upper"),
    pytest.param(d(*modify("sub/.Git/hooks/x")), "git_dir", id="nested-git"),
    pytest.param(d(*modify(".git")), "git_dir", id="git-file"),
    pytest.param(d(*modify(".git./config")), "git_dir", id="git-trailing-dot"),
    pytest.param(d(*modify("GIT~1/config")), "git_dir", id="git-short-name"),
    pytest.param(d(*modify(".g\u200cit/config")), "control_char", id="git-hfs-ignorable"),
    pytest.param(
        d("diff --git a/x b/.git/x", "similarity index 100%", "rename from x", "rename to .git/x"),
        "git_dir",
        id="rename-into-git",
    ),
    # content kinds
    pytest.param(
        d("diff --git a/x.bin b/x.bin", "index 1234567..89abcde 100644", "GIT binary patch"),
        "binary",
        id="git-binary-patch",
    ),
    pytest.param(
        d(
            "diff --git a/x.bin b/x.bin",
            "index 1234567..89abcde 100644",
            "Binary files a/x.bin and b/x.bin differ",
        ),
        "binary",
        id="binary-files-differ",
    ),
    pytest.param(
        d(*create("link", "/etc/passwd", mode="120000"), NO_EOL),
        "symlink_mode",
        id="symlink-create",
    ),
    pytest.param(
        d(*modify("f.txt", "old mode 100644", "new mode 120000")),
        "symlink_mode",
        id="mode-to-symlink",
    ),
    pytest.param(
        d(
            "diff --git a/sub b/sub",
            "new file mode 160000",
            "index 0000000..1234567",
            "--- /dev/null",
            "+++ b/sub",
            "@@ -0,0 +1 @@",
            "+Subproject commit 1234567890123456789012345678901234567890",
        ),
        "gitlink",
        id="gitlink",
    ),
    pytest.param(
        d(*modify("f.txt", "index 1234567..89abcde 160000")), "gitlink", id="index-gitlink"
    ),
    pytest.param(d(*create("x", "a", mode="100664")), "bad_mode", id="mode-664"),
    pytest.param(d(*create("x", "a", mode="040000")), "bad_mode", id="mode-dir"),
    pytest.param(
        d("diff --git a/f.txt b/f.txt", "old mode 100644", "new mode 100644"),
        "mode_change",
        id="mode-no-toggle",
    ),
    pytest.param(
        d("diff --git a/f.txt b/f.txt", "old mode 100644"), "bad_header", id="old-mode-only"
    ),
    pytest.param(
        d(
            "diff --git a/x b/x",
            "new file mode 100644",
            "old mode 100644",
            "new mode 100755",
        ),
        "bad_header",
        id="mode-change-on-create",
    ),
    pytest.param(
        d("diff --git a/x b/y", "similarity index 100%", "copy from x", "copy to y"),
        "copy",
        id="copy",
    ),
    pytest.param(
        d(
            "diff --git a/../../etc/passwd b/stolen",
            "similarity index 100%",
            "copy from ../../etc/passwd",
            "copy to stolen",
        ),
        "copy",
        id="copy-from-outside",
    ),
    pytest.param(
        d(*modify("f.txt", "dissimilarity index 80%")), "dissimilarity", id="dissimilarity"
    ),
    pytest.param(
        d("diff --git a/x b/x", "new file mode 100644", "deleted file mode 100644"),
        "bad_header",
        id="create-and-delete",
    ),
    pytest.param(d("diff --git a/f.txt b/f.txt"), "empty", id="empty-section"),
    pytest.param(d("diff --git a/f.txt b/f.txt", *HUNK), "bad_header", id="hunks-without-labels"),
    pytest.param("Sure, here it is", "garbage", id="prose-only"),
    # several sections
    pytest.param(MODIFY + MODIFY, "duplicate_file", id="duplicate"),
    pytest.param(
        d(*create("readme.md", "x"), *modify("README.md")), "case_collision", id="case-collision"
    ),
    pytest.param(d(*modify("caf\u00e9"), *modify("cafe\u0301")), "case_collision", id="nfc-vs-nfd"),
    pytest.param(
        d(
            "diff --git a/README.md b/readme.md",
            "similarity index 100%",
            "rename from README.md",
            "rename to readme.md",
        ),
        "case_collision",
        id="case-only-rename",
    ),
    pytest.param(
        d(
            "diff --git a/x b/y",
            "similarity index 100%",
            "rename from x",
            "rename to y",
            *create("y", "new"),
        ),
        "duplicate_file",
        id="rename-onto-created",
    ),
    # hunks
    pytest.param(
        d(*modify("f.txt", body=("@@ -1,3 +1,3 @@", " a", "-b", "+B"))),
        "hunk_count_mismatch",
        id="short-hunk-at-eof",
    ),
    pytest.param(
        d(*modify("f.txt", body=("@@ -1,3 +1,3 @@", " a", "-b", "+B")), *modify("g.txt")),
        "hunk_count_mismatch",
        id="short-hunk-before-next-file",
    ),
    pytest.param(d(*modify("f.txt", body=(*HUNK, " d"))), "hunk_count_mismatch", id="long-hunk"),
    pytest.param(
        d(*modify("f.txt", body=("@@ -1,2 +1,2 @@", "-a", "-b", "+A"))),
        "hunk_count_mismatch",
        id="too-many-removed",
    ),
    pytest.param(
        d(*modify("f.txt", body=("@@ -1,3 +1,3 @@", " a", "", "-b", "+B"))),
        "bad_hunk",
        id="empty-line-in-hunk",
    ),
    pytest.param(
        d(*modify("f.txt", body=("@@ -1,3 +1,3 @@", " a", "*b", "+B", " c"))),
        "bad_hunk",
        id="unknown-op",
    ),
    pytest.param(
        d(*modify("f.txt", body=("@@ -1,3 +1,3 @@", " a", "```", "+B", " c"))),
        "fence",
        id="fence-in-hunk",
    ),
    pytest.param(d(*modify("f.txt", body=("@@ -1,3 +1,3", *HUNK[1:]))), "bad_hunk", id="bad-@@"),
    pytest.param(d(*modify("f.txt", body=("@@ -1,3 +1,3 @@x", *HUNK[1:]))), "bad_hunk", id="@@x"),
    pytest.param(d(*modify("f.txt", body=("@@ -a,3 +1,3 @@", *HUNK[1:]))), "bad_hunk", id="@@-a"),
    pytest.param(d(*modify("f.txt", body=("@@ -0,1 +0,1 @@", "-a", "+b"))), "bad_hunk", id="@@-0"),
    pytest.param(d(*modify("f.txt", body=("@@ -1,2 +1,2 @@", " a", " b"))), "bad_hunk", id="no-op"),
    pytest.param(
        d(*modify("f.txt", body=("@@ -1,3 +2,3 @@", *HUNK[1:]))), "bad_hunk", id="new-start-off"
    ),
    pytest.param(
        d(*modify("f.txt", body=("@@ -5,3 +5,3 @@", " a", "-b", "+B", " c", *HUNK))),
        "bad_hunk",
        id="out-of-order",
    ),
    pytest.param(
        d(*modify("f.txt", body=(*HUNK, "@@ -3,2 +3,2 @@", " c", "-d", "+D"))),
        "bad_hunk",
        id="overlapping",
    ),
    pytest.param(
        d(*modify("f.txt", body=(*HUNK, "@@ -4 +4 @@", "-d", "+D"))), "bad_hunk", id="adjacent"
    ),
    pytest.param(
        d(*modify("f.txt", body=(*HUNK, NO_EOL, "@@ -9 +9 @@", "-x", "+y"))),
        "bad_hunk",
        id="hunk-after-eof-marker",
    ),
    pytest.param(
        d(*modify("f.txt", body=("@@ -1,3 +1,3 @@", " a", NO_EOL, "-b", "+B", " c"))),
        "bad_hunk",
        id="marker-mid-hunk",
    ),
    pytest.param(d(*modify("f.txt", body=(*HUNK, NO_EOL, NO_EOL))), "bad_hunk", id="double-marker"),
    pytest.param(
        d(*modify("f.txt", body=(*HUNK, "\\ Pas de fin de ligne"))), "bad_hunk", id="odd-marker"
    ),
    pytest.param(
        d(*create("x", "a"), "@@ -1 +2 @@", "-a", "+b"), "bad_hunk", id="create-two-hunks"
    ),
    pytest.param(
        d(*delete("x", "a", "b")[:-3], "@@ -2,2 +0,0 @@", "-a", "-b"),
        "bad_hunk",
        id="delete-not-from-line-1",
    ),
    # CRLF smuggling: CR ends header lines (content keeps its CR)
    pytest.param(MODIFY.replace("\n", "\r\n"), "crlf_header", id="crlf-diff"),
    pytest.param(
        d(*modify("f.txt", body=("@@ -1,3 +1,3 @@\r", *HUNK[1:]))), "crlf_header", id="crlf-@@"
    ),
    pytest.param(d(*modify("f.txt", body=(*HUNK, NO_EOL + "\r"))), "crlf_header", id="crlf-eol"),
    pytest.param(
        d("diff --git a/f.txt b/f.txt", "--- a/f.txt", "+++ b/f.txt\r", *HUNK),
        "crlf_header",
        id="crlf-plus",
    ),
    pytest.param(
        d(*modify("f.txt", "index 1234567..89abcde 100644\r")), "crlf_header", id="crlf-index"
    ),
]


@pytest.mark.parametrize(("text", "reason"), REFUSED)
def test_parse_refuses(text: str, reason: str) -> None:
    assert reason_of(text) == reason


def test_limits() -> None:
    assert reason_of(MODIFY, max_bytes=len(MODIFY) - 1) == "too_large"
    assert reason_of(MODIFY.replace("+B", "+\u00e9"), max_bytes=len(MODIFY)) == "too_large"
    assert diffs.parse(MODIFY, max_bytes=len(MODIFY))
    two = d(*modify("f.txt"), *modify("g.txt"))
    assert reason_of(two, max_files=1) == "too_many_files"
    assert len(diffs.parse(two, max_files=2)) == 2


def test_error_carries_reason_and_message() -> None:
    with pytest.raises(DiffError) as info:
        diffs.parse(d(*modify("x\x1b[31m")))
    assert info.value.reason == "control_char"
    assert "\x1b" not in str(info.value)  # unvalidated names never reach messages
    assert str(info.value).startswith("control_char: ")


# --------------------------------------------------------------------------------------
# Accepted by parse.


def test_parse_modify_records_everything() -> None:
    text = d(
        "diff --git a/f.txt b/f.txt",
        "index 1234567..89abcde 100755",
        "--- a/f.txt",
        "+++ b/f.txt",
        "@@ -1,3 +1,3 @@ def section():",
        *HUNK[1:],
    )
    (p,) = diffs.parse(text)
    assert (p.kind, p.old_path, p.new_path, p.path) == ("modify", "f.txt", "f.txt", "f.txt")
    assert (p.old_mode, p.new_mode, p.index_old, p.index_new) == (
        "100755",
        "100755",
        "1234567",
        "89abcde",
    )
    (h,) = p.hunks
    assert (h.old_start, h.old_len, h.new_start, h.new_len, h.section) == (
        1,
        3,
        1,
        3,
        "def section():",
    )
    assert h.lines == ((" ", "a"), ("-", "b"), ("+", "B"), (" ", "c"))
    assert (h.old_no_eol, h.new_no_eol, p.added, p.removed) == (False, False, 1, 1)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            d("diff --git a/run.sh b/run.sh", "old mode 100644", "new mode 100755"),
            ("modify", "run.sh", "run.sh", "100644", "100755"),
            id="mode-to-exec",
        ),
        pytest.param(
            d("diff --git a/run.sh b/run.sh", "old mode 100755", "new mode 100644"),
            ("modify", "run.sh", "run.sh", "100755", "100644"),
            id="mode-to-plain",
        ),
        pytest.param(
            d(*create("new.txt", "x")),
            ("create", None, "new.txt", None, "100644"),
            id="create",
        ),
        pytest.param(
            d(*create("run.sh", "x", mode="100755")),
            ("create", None, "run.sh", None, "100755"),
            id="create-exec",
        ),
        pytest.param(
            d("diff --git a/e b/e", "new file mode 100644", "index 0000000..e69de29"),
            ("create", None, "e", None, "100644"),
            id="create-empty",
        ),
        pytest.param(
            d(*delete("old.txt", "x")), ("delete", "old.txt", None, "100644", None), id="delete"
        ),
        pytest.param(
            d(
                "diff --git a/x y b/z w",
                "similarity index 100%",
                "rename from x y",
                "rename to z w",
            ),
            ("rename", "x y", "z w", None, None),
            id="rename-with-spaces",
        ),
        pytest.param(
            d("diff --git a/a b b/a b", "old mode 100644", "new mode 100755"),
            ("modify", "a b", "a b", "100644", "100755"),
            id="spaces-without-labels",
        ),
        pytest.param(
            d(*section('"a/\\303\\251.txt"', '"b/\\303\\251.txt"')),
            ("modify", "\u00e9.txt", "\u00e9.txt", None, None),
            id="quoted-utf8",
        ),
        pytest.param(
            d(
                *section(
                    "a/plain",
                    '"b/\\303\\251"',
                    "similarity index 90%",
                    "rename from plain",
                    'rename to "\\303\\251"',
                )
            ),
            ("rename", "plain", "\u00e9", None, None),
            id="half-quoted-rename",
        ),
        pytest.param(
            d(*modify("cafe\u0301.txt")),
            ("modify", "cafe\u0301.txt", "cafe\u0301.txt", None, None),
            id="nfd-name-kept-as-is",
        ),
        pytest.param(
            d("diff --git a/sp ace b/sp ace", "--- a/sp ace\t", "+++ b/sp ace\t", *HUNK),
            ("modify", "sp ace", "sp ace", None, None),
            id="tab-after-name-with-space",
        ),
        pytest.param(
            d(*modify("50%.txt")),
            ("modify", "50%.txt", "50%.txt", None, None),
            id="plain-percent",
        ),
        pytest.param(
            d(*modify(".github/x.gitignore")),
            ("modify", ".github/x.gitignore", ".github/x.gitignore", None, None),
            id="git-lookalikes",
        ),
    ],
)
def test_parse_accepts(text: str, expected: tuple[str | None, ...]) -> None:
    (p,) = diffs.parse(text)
    assert (p.kind, p.old_path, p.new_path, p.old_mode, p.new_mode) == expected


def test_parse_markers_and_minimal_hunks() -> None:
    text = d(
        *modify(
            "f.txt",
            body=("@@ -1,2 +1,2 @@", " a", "-b", NO_EOL, "+c", NO_EOL, "@@ -0,0 +0,0 @@"),
        )
    )
    assert reason_of(text) == "bad_hunk"  # nothing may follow the end of the file
    (p,) = diffs.parse(d(*modify("f.txt", body=("@@ -1,2 +1,2 @@", " a", "-b", NO_EOL, "+c"))))
    assert (p.hunks[0].old_no_eol, p.hunks[0].new_no_eol) == (True, False)
    (p,) = diffs.parse(d(*modify("f.txt", body=("@@ -2 +2 @@", "-b", "+B"))))
    assert (p.hunks[0].old_len, p.hunks[0].new_len) == (1, 1)
    (p,) = diffs.parse(d(*modify("f.txt", body=("@@ -3,0 +4,2 @@", "+x", "+y"))))
    assert p.added == 2


def test_stats() -> None:
    text = d(
        *modify("f.txt"),
        *create("n.txt", "1", "2"),
        *delete("o.txt", "1"),
        "diff --git a/r1 b/r2",
        "similarity index 100%",
        "rename from r1",
        "rename to r2",
    )
    assert diffs.stats(diffs.parse(text)) == [
        {"path": "f.txt", "old_path": None, "kind": "modify", "added": 1, "removed": 1},
        {"path": "n.txt", "old_path": None, "kind": "create", "added": 2, "removed": 0},
        {"path": "o.txt", "old_path": None, "kind": "delete", "added": 0, "removed": 1},
        {"path": "r2", "old_path": "r1", "kind": "rename", "added": 0, "removed": 0},
    ]


def test_unquote_and_check_path() -> None:
    assert diffs.unquote('"\\a\\b\\t\\n\\v\\f\\r\\"\\\\\\101"') == '\a\b\t\n\v\f\r"\\A'
    assert diffs.unquote('"\\303\\251 \u00fc"') == "\u00e9 \u00fc"
    diffs.check_path("src/\u00e9t\u00e9/ok.py")
    for bad, reason in [("", "bad_path"), ("a/.", "bad_path"), ("a/.gIt/x", "git_dir")]:
        with pytest.raises(DiffError) as info:
            diffs.check_path(bad)
        assert info.value.reason == reason
    assert diffs.fold("RE\u0301ADME") == diffs.fold("r\u00e9adme")


# --------------------------------------------------------------------------------------
# apply

REPEATED = b"start\na\nb\nc\nmid\na\nb\nc\nend\n"

APPLIED: list[object] = [
    pytest.param(ABC, MODIFY, {"f.txt": b"a\nB\nc\n"}, id="modify"),
    pytest.param(
        {"f.txt": REPEATED},
        d(*modify("f.txt", body=("@@ -6,3 +6,3 @@", " a", "-b", "+B", " c"))),
        {"f.txt": b"start\na\nb\nc\nmid\na\nB\nc\nend\n"},
        id="repeated-context-second-copy",
    ),
    pytest.param(
        {"f.txt": REPEATED},
        d(*modify("f.txt", body=("@@ -2,3 +2,3 @@", " a", "-b", "+B", " c"))),
        {"f.txt": b"start\na\nB\nc\nmid\na\nb\nc\nend\n"},
        id="repeated-context-first-copy",
    ),
    pytest.param(
        {"f.txt": b"1\n2\n3\n4\n5\n6\n7\n8\n9\n"},
        d(
            *modify(
                "f.txt",
                body=("@@ -1,2 +1,3 @@", " 1", "+1.5", " 2", "@@ -8,2 +9,1 @@", "-8", " 9"),
            )
        ),
        {"f.txt": b"1\n1.5\n2\n3\n4\n5\n6\n7\n9\n"},
        id="two-hunks",
    ),
    pytest.param(
        {"f.txt": b"a\r\nb\r\nc\r\n"},
        d(*modify("f.txt", body=("@@ -1,3 +1,3 @@", " a\r", "-b\r", "+B\r", " c\r"))),
        {"f.txt": b"a\r\nB\r\nc\r\n"},
        id="crlf-content",
    ),
    pytest.param(
        {"f.txt": b"a\nb\r\nc\n"},
        d(*modify("f.txt", body=("@@ -1,3 +1,3 @@", " a", "-b\r", "+b", " c"))),
        {"f.txt": b"a\nb\nc\n"},
        id="strip-one-cr",
    ),
    pytest.param(
        {"f.txt": b"a\nb"},
        d(*modify("f.txt", body=("@@ -1,2 +1,2 @@", " a", "-b", NO_EOL, "+c", NO_EOL))),
        {"f.txt": b"a\nc"},
        id="no-eol-both-sides",
    ),
    pytest.param(
        {"f.txt": b"a\nb"},
        d(*modify("f.txt", body=("@@ -1,2 +1,2 @@", " a", "-b", NO_EOL, "+b"))),
        {"f.txt": b"a\nb\n"},
        id="add-final-newline",
    ),
    pytest.param(
        {"f.txt": b"a\nb\n"},
        d(*modify("f.txt", body=("@@ -1,2 +1,2 @@", " a", "-b", "+b", NO_EOL))),
        {"f.txt": b"a\nb"},
        id="drop-final-newline",
    ),
    pytest.param(
        {"f.txt": b"a\nb"},
        d(*modify("f.txt", body=("@@ -1,2 +1,3 @@", "+z", " a", " b", NO_EOL))),
        {"f.txt": b"z\na\nb"},
        id="no-eol-context",
    ),
    pytest.param(
        {"f.txt": b"a\nb\nc\n"},
        d(*modify("f.txt", body=("@@ -3,0 +4,2 @@", "+d", "+e"))),
        {"f.txt": b"a\nb\nc\nd\ne\n"},
        id="u0-append",
    ),
    pytest.param(
        {"f.txt": b"a\nb\nc\n"},
        d(*modify("f.txt", body=("@@ -2 +1,0 @@", "-b"))),
        {"f.txt": b"a\nc\n"},
        id="u0-remove",
    ),
    pytest.param(
        {"f.txt": b"a\n"},
        d(*modify("f.txt", body=("@@ -1 +0,0 @@", "-a"))),
        {"f.txt": b""},
        id="empty-the-file",
    ),
    pytest.param({}, d(*create("d/new.txt", "x", "y")), {"d/new.txt": b"x\ny\n"}, id="create"),
    pytest.param(
        {},
        d(*create("new.txt", "x"), NO_EOL),
        {"new.txt": b"x"},
        id="create-no-eol",
    ),
    pytest.param(
        {},
        d("diff --git a/e b/e", "new file mode 100644", "index 0000000..e69de29"),
        {"e": b""},
        id="create-empty",
    ),
    pytest.param(
        {"old.txt": b"x\ny\n"}, d(*delete("old.txt", "x", "y")), {"old.txt": None}, id="delete"
    ),
    pytest.param(
        {"e": b""},
        d("diff --git a/e b/e", "deleted file mode 100644", "index e69de29..0000000"),
        {"e": None},
        id="delete-empty",
    ),
    pytest.param(
        {"x.txt": b"a\nb\nc\n"},
        d(
            "diff --git a/x.txt b/y/z.txt",
            "similarity index 66%",
            "rename from x.txt",
            "rename to y/z.txt",
            "--- a/x.txt",
            "+++ b/y/z.txt",
            *HUNK,
        ),
        {"x.txt": None, "y/z.txt": b"a\nB\nc\n"},
        id="rename-with-hunk",
    ),
    pytest.param(
        {"x.txt": b"a\n"},
        d(
            "diff --git a/x.txt b/y.txt",
            "similarity index 100%",
            "rename from x.txt",
            "rename to y.txt",
        ),
        {"x.txt": None, "y.txt": b"a\n"},
        id="rename-pure",
    ),
    pytest.param(
        {"run.sh": b"echo\n"},
        d("diff --git a/run.sh b/run.sh", "old mode 100644", "new mode 100755"),
        {"run.sh": b"echo\n"},
        id="mode-only",
    ),
    pytest.param(
        {"caf\u00e9.txt": b"a\nb\nc\n"},
        d(*section('"a/caf\\303\\251.txt"', '"b/caf\\303\\251.txt"')),
        {"caf\u00e9.txt": b"a\nB\nc\n"},
        id="quoted-nfc-name",
    ),
    pytest.param(
        {"cafe\u0301.txt": b"a\nb\nc\n"},
        d(*modify("cafe\u0301.txt")),
        {"cafe\u0301.txt": b"a\nB\nc\n"},
        id="nfd-name",
    ),
    pytest.param(
        {"f.txt": "\u00e9t\u00e9\n".encode(), "g.txt": b"1\n"},
        d(
            *modify("f.txt", body=("@@ -1 +1 @@", "-\u00e9t\u00e9", "+hiver")),
            *delete("g.txt", "1"),
            *create("h.txt", "2"),
        ),
        {"f.txt": b"hiver\n", "g.txt": None, "h.txt": b"2\n"},
        id="several-files",
    ),
]

REJECTED = [
    pytest.param({"f.txt": b"x\na\nb\nc\n"}, MODIFY, "context_mismatch", id="context-moved-down"),
    pytest.param(
        {"f.txt": REPEATED},
        d(*modify("f.txt", body=("@@ -5,3 +5,3 @@", " a", "-b", "+B", " c"))),
        "context_mismatch",
        id="repeated-context-wrong-position",
    ),
    pytest.param({"f.txt": b"a\nb\n"}, MODIFY, "context_mismatch", id="past-eof"),
    pytest.param({"f.txt": b"a\r\nb\r\nc\r\n"}, MODIFY, "context_mismatch", id="crlf-vs-lf"),
    pytest.param({"f.txt": b"a\nb\nc"}, MODIFY, "context_mismatch", id="missing-marker"),
    pytest.param(
        {"f.txt": b"a\nb\n"},
        d(*modify("f.txt", body=("@@ -1,2 +1,2 @@", " a", "-b", NO_EOL, "+c"))),
        "context_mismatch",
        id="marker-but-newline",
    ),
    pytest.param(
        {"f.txt": b"a\nb\nc\nd\n"},
        d(*modify("f.txt", body=("@@ -1,2 +1,2 @@", " a", "-b", NO_EOL, "+c"))),
        "context_mismatch",
        id="marker-before-end",
    ),
    pytest.param(
        {"f.txt": b"a\nb"},
        d(*modify("f.txt", body=("@@ -2,0 +3 @@", "+c"))),
        "context_mismatch",
        id="append-after-no-eol",
    ),
    pytest.param({}, MODIFY, "missing", id="modify-missing"),
    pytest.param({"new.txt": b""}, d(*create("new.txt", "x")), "exists", id="create-exists"),
    pytest.param({}, d(*delete("old.txt", "x")), "missing", id="delete-missing"),
    pytest.param(
        {"old.txt": b"x\ny\n"}, d(*delete("old.txt", "x")), "context_mismatch", id="delete-more"
    ),
    pytest.param(
        {"old.txt": b"x"}, d(*delete("old.txt", "x")), "context_mismatch", id="delete-no-eol"
    ),
    pytest.param(
        {"e": b"x\n"},
        d("diff --git a/e b/e", "deleted file mode 100644"),
        "context_mismatch",
        id="delete-nonempty-as-empty",
    ),
    pytest.param(
        {"x": b"1\n", "y": b"2\n"},
        d("diff --git a/x b/y", "similarity index 100%", "rename from x", "rename to y"),
        "exists",
        id="rename-onto-existing",
    ),
    pytest.param(
        {},
        d("diff --git a/x b/y", "similarity index 100%", "rename from x", "rename to y"),
        "missing",
        id="rename-missing-source",
    ),
    pytest.param({"f.txt": b"a\n\xffb\nc\n"}, MODIFY, "not_text", id="latin1-file"),
    pytest.param({"f.txt": b"a\nb\nc\n\x00"}, MODIFY, "not_text", id="binary-file"),
    pytest.param(
        {"f.txt": b"\x00"},
        d("diff --git a/f.txt b/f.txt", "old mode 100644", "new mode 100755"),
        "not_text",
        id="mode-change-on-binary",
    ),
    pytest.param(
        ABC,
        d(*modify("f.txt", "index 1234567..89abcde 100644")),
        "index_mismatch",
        id="index-old-wrong",
    ),
    pytest.param(
        {"a": b"1\n"},
        d(*create("a/b", "x")),
        "path_conflict",
        id="file-under-a-file",
    ),
    pytest.param(
        {"a/b": b"1\n"},
        d(*create("a", "x")),
        "path_conflict",
        id="file-over-a-directory",
    ),
    pytest.param(
        {},
        d(*create("a", "x"), *create("a/b", "y")),
        "path_conflict",
        id="file-and-directory-created",
    ),
    pytest.param(
        ABC,
        d(*modify("g.txt"), *modify("f.txt", body=("@@ -1 +1 @@", "-x", "+y"))),
        "missing",
        id="all-or-nothing",
    ),
]


@pytest.mark.parametrize(("files", "text", "expected"), APPLIED)
def test_apply(files: Files, text: str, expected: dict[str, bytes | None]) -> None:
    patches = diffs.parse(text)
    assert diffs.apply(patches, files.get) == expected
    assert diffs.apply(patches, files.get, tree_paths=list(files)) == expected


@pytest.mark.parametrize(("files", "text", "reason"), REJECTED)
def test_apply_rejects(files: Files, text: str, reason: str) -> None:
    patches = diffs.parse(text)
    calls: list[str] = []

    def read(path: str) -> bytes | None:
        calls.append(path)
        return files.get(path)

    with pytest.raises(DiffError) as info:
        diffs.apply(patches, read, tree_paths=list(files))
    assert info.value.reason == reason
    assert reason in diffs.REASONS


def test_apply_index_lines() -> None:
    old, new = b"a\nb\nc\n", b"a\nB\nc\n"
    ids = diffs.blob_id(old)[:7], diffs.blob_id(new)[:7]
    assert diffs.blob_id(b"") == "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"
    good = d(*modify("f.txt", f"index {ids[0]}..{ids[1]} 100644"))
    assert diffs.apply(diffs.parse(good), {"f.txt": old}.get) == {"f.txt": new}
    wrong_new = d(*modify("f.txt", f"index {ids[0]}..{ids[0]} 100644"))
    with pytest.raises(DiffError) as info:
        diffs.apply(diffs.parse(wrong_new), {"f.txt": old}.get)
    assert info.value.reason == "index_mismatch"
    lax = diffs.apply(diffs.parse(wrong_new), {"f.txt": old}.get, check_index=False)
    assert lax == {"f.txt": new}
    sha256 = diffs.blob_id(old, "sha256")
    text = d(*modify("f.txt", f"index {sha256}..{diffs.blob_id(new, 'sha256')} 100644"))
    assert diffs.apply(diffs.parse(text), {"f.txt": old}.get, object_format="sha256")


def test_apply_tree_paths() -> None:
    tree = {"README.md": b"x\n", "docs/a.txt": b"1\n"}
    created = diffs.parse(d(*create("readme.md", "y")))
    assert diffs.apply(created, tree.get) == {"readme.md": b"y\n"}  # without the tree's list
    with pytest.raises(DiffError) as info:
        diffs.apply(created, tree.get, tree_paths=tree)
    assert info.value.reason == "case_collision"
    with pytest.raises(DiffError) as info:
        diffs.apply(diffs.parse(d(*create("docs", "y"))), tree.get, tree_paths=tree)
    assert info.value.reason == "path_conflict"
    renamed = d(
        "diff --git a/README.md b/readme.txt",
        "similarity index 100%",
        "rename from README.md",
        "rename to readme.txt",
    )
    assert diffs.apply(diffs.parse(renamed), tree.get, tree_paths=tree) == {
        "README.md": None,
        "readme.txt": b"x\n",
    }


def test_apply_checks_hand_built_patches() -> None:
    (p,) = diffs.parse(MODIFY)
    with pytest.raises(DiffError) as info:
        diffs.apply([p, p], ABC.get)
    assert info.value.reason == "duplicate_file"
    swapped = diffs.FilePatch(**{**p.__dict__, "hunks": (p.hunks[0], p.hunks[0])})
    with pytest.raises(DiffError) as info:
        diffs.apply([swapped], ABC.get)
    assert info.value.reason == "bad_hunk"


# --------------------------------------------------------------------------------------
# the real git


class Repo:
    """A throwaway repository (``tests.support.git``: no user or system configuration)."""

    def __init__(self, root: Path) -> None:
        self.repo = init(root / "repo")
        self.root = self.repo.path

    def git(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[bytes]:
        res = self.repo.run(*args)
        if check:
            assert res.returncode == 0, res.stderr.decode(errors="replace")
        return res

    def write(self, files: Spec) -> None:
        for path, spec in files.items():
            data, exe = spec if isinstance(spec, tuple) else (spec, False)
            target = self.root / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            target.chmod(0o755 if exe else 0o644)

    def commit(self, files: Spec) -> None:
        self.write(files)
        self.git("add", "-A")
        self.git("commit", "-q", "--allow-empty", "-m", "base")

    def read(self, path: str) -> bytes | None:
        target = self.root / path
        return target.read_bytes() if target.is_file() else None

    def apply(self, text: str) -> subprocess.CompletedProcess[bytes]:
        patch = self.root.parent / "change.patch"
        patch.write_bytes(text.encode())
        return self.git("apply", "--unidiff-zero", "--whitespace=nowarn", str(patch), check=False)


def _data(spec: bytes | tuple[bytes, bool]) -> bytes:
    return spec[0] if isinstance(spec, tuple) else spec


@pytest.mark.parametrize(("files", "text", "expected"), APPLIED)
def test_git_apply_agrees(
    tmp_path: Path, files: Files, text: str, expected: dict[str, bytes | None]
) -> None:
    repo = Repo(tmp_path)
    repo.commit(dict(files))
    res = repo.apply(text)
    assert res.returncode == 0, res.stderr.decode(errors="replace")
    assert {path: repo.read(path) for path in expected} == expected


def test_git_apply_would_patch_elsewhere(tmp_path: Path) -> None:
    """Why positions are exact: git apply finds moved context at an offset."""
    files = {"f.txt": REPEATED}
    text = d(*modify("f.txt", body=("@@ -4,3 +4,3 @@", " a", "-b", "+B", " c")))
    repo = Repo(tmp_path)
    repo.commit(dict(files))
    assert repo.apply(text).returncode == 0
    assert repo.read("f.txt") != REPEATED
    with pytest.raises(DiffError) as info:
        diffs.apply(diffs.parse(text), files.get)
    assert info.value.reason == "context_mismatch"


def _lines(n: int, tag: str) -> bytes:
    return b"".join(f"{tag} line {i}\n".encode() for i in range(1, n + 1))


LONG = _lines(40, "x")
NFD = unicodedata.normalize("NFD", "r\u00e9sum\u00e9.txt")

GENERATED = [
    pytest.param(
        {"f.txt": LONG},
        {"f.txt": LONG.replace(b"x line 3\n", b"changed\n").replace(b"x line 30\n", b"")},
        id="modify-two-hunks",
    ),
    pytest.param({}, {"dir/new.txt": b"hello\nworld\n"}, id="create"),
    pytest.param({"gone.txt": LONG}, {}, id="delete"),
    pytest.param(
        {"old/name.txt": LONG},
        {"new/name.txt": LONG.replace(b"x line 20\n", b"edited\n")},
        id="rename-with-edit",
    ),
    pytest.param({"a.txt": LONG}, {"b.txt": LONG}, id="rename-pure"),
    pytest.param({"run.sh": b"echo hi\n"}, {"run.sh": (b"echo hi\n", True)}, id="mode-only"),
    pytest.param(
        {"run.sh": (b"echo hi\n", True)},
        {"run.sh": (b"echo bye\n", False)},
        id="mode-and-edit",
    ),
    pytest.param({"f.txt": b"a\nb\n"}, {"f.txt": b"a\nb"}, id="drop-final-newline"),
    pytest.param({"f.txt": b"a\nb"}, {"f.txt": b"a\nb\n"}, id="add-final-newline"),
    pytest.param({"f.txt": b"a\nb"}, {"f.txt": b"a\nc"}, id="no-newline-both"),
    pytest.param({"f.txt": b"a\nb"}, {"f.txt": b"z\na\nb"}, id="no-newline-context"),
    pytest.param(
        {"\u00fcber/stra\u00dfe.txt": b"1\n"},
        {"\u00fcber/stra\u00dfe.txt": b"2\n", "caf\u00e9.txt": b"new\n"},
        id="non-ascii-quoted",
    ),
    pytest.param({}, {NFD: b"nfd\n"}, id="nfd-name"),
    pytest.param({"sp ace.txt": b"1\n"}, {"sp ace.txt": b"2\n"}, id="space-in-name"),
    pytest.param(
        {"dos.txt": b"a\r\nb\r\nc\r\n"}, {"dos.txt": b"a\r\nB\r\nc\r\n"}, id="crlf-content"
    ),
    pytest.param({"e1": b""}, {"e2": b"", "e1x": b"x\n"}, id="empty-files"),
    pytest.param(
        {"keep.txt": LONG, "del.txt": b"bye\n", "mv.txt": LONG},
        {
            "keep.txt": LONG.replace(b"x line 1\n", b"first\n"),
            "add.txt": b"hi\n",
            "moved/mv.txt": (LONG, True),
        },
        id="mixed",
    ),
]


def _check_generated(repo: Repo, before: Spec, after: Spec, *options: str) -> str:
    res = repo.git(
        "diff", "--cached", "-M", "--no-color", "--no-ext-diff", "--no-textconv", *options
    )
    text = res.stdout.decode("utf-8")
    patches = diffs.parse(text)
    base = {path: _data(spec) for path, spec in before.items()}
    result = diffs.apply(patches, base.get, tree_paths=list(base))
    final = {path: _data(spec) for path, spec in after.items()}
    assert result == {path: final.get(path) for path in result}
    changed = {p for p in set(base) | set(final) if base.get(p) != final.get(p)}
    assert changed <= set(result)
    for patch in patches:
        if patch.new_mode is not None:
            spec = after[patch.path]
            executable = isinstance(spec, tuple) and spec[1]
            assert patch.new_mode == ("100755" if executable else "100644")
    renames = [o for o in options if not o.startswith("-U")]  # -U implies a patch
    numstat = repo.git("diff", "--cached", "-M", "--numstat", *renames).stdout.decode()
    counts = [line.split("\t")[:2] for line in numstat.splitlines()]
    assert sum(int(a) for a, _ in counts) == sum(s["added"] for s in diffs.stats(patches))
    assert sum(int(r) for _, r in counts) == sum(s["removed"] for s in diffs.stats(patches))
    return text


@pytest.mark.parametrize(("before", "after"), GENERATED)
def test_git_diff_round_trip(tmp_path: Path, before: Spec, after: Spec) -> None:
    repo = Repo(tmp_path)
    repo.commit(before)
    for path in before:
        (repo.root / path).unlink()
    repo.write(after)
    repo.git("add", "-A")
    text = _check_generated(repo, before, after)
    _check_generated(repo, before, after, "-U0")
    _check_generated(repo, before, after, "-U1")
    if any(not p.isascii() for p in after):
        assert '"b/' in text  # core.quotepath is on by default: names are C-quoted


def _mutate(rng: random.Random, data: bytes) -> bytes:
    lines = data.split(b"\n")
    for _ in range(rng.randint(1, 6)):
        pos = rng.randrange(len(lines) + 1)
        choice = rng.randrange(3)
        if choice == 0:
            lines.insert(pos, rng.choice([b"a", b"b", b"", b"new", b"a\r"]))
        elif choice == 1 and pos < len(lines):
            del lines[pos]
        elif pos < len(lines):
            lines[pos] = rng.choice([b"a", b"b", b"c", b"x"])
    return b"\n".join(lines)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_git_diff_random_edits(tmp_path: Path, seed: int) -> None:
    """Many small edits on files of repeated lines (the hard case for context)."""
    rng = random.Random(seed)  # noqa: S311 - seeded, reproducible test data, not a secret
    before: Spec = {
        f"f{i}.txt": b"\n".join(rng.choice([b"a", b"b", b"c", b""]) for _ in range(30))
        for i in range(12)
    }
    after: Spec = {path: _mutate(rng, _data(spec)) for path, spec in before.items()}
    after["f0.txt"] = b"replaced\n"
    del after["f1.txt"]
    repo = Repo(tmp_path)
    repo.commit(before)
    repo.write(after)
    (repo.root / "f1.txt").unlink()
    repo.git("add", "-A")
    for options in ((), ("-U0",), ("-U1",), ("-U5",), ("--no-renames",)):
        _check_generated(repo, before, after, *options)
