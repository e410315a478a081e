"""Traditional unified diffs (``---``/``+++``/``@@``, no ``diff --git`` line): turned into
the git form and held to every rule of the strict parser.

Accepted forms parse to exactly what their git form parses to, and apply as ``git apply``
applies them; every hostile one is refused with the reason its git form gets.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from patchbox_agent import diffs
from patchbox_agent.diffs import DiffError
from tests.support.git import init


def d(*lines: str) -> str:
    return "".join(line + "\n" for line in lines)


MODIFY = ("@@ -1,3 +1,3 @@", " a", "-b", "+B", " c")
ABC = b"a\nb\nc\n"

ACCEPTED = [
    pytest.param(
        d("--- a/f.txt", "+++ b/f.txt", *MODIFY),
        d("diff --git a/f.txt b/f.txt", "--- a/f.txt", "+++ b/f.txt", *MODIFY),
        id="modify-prefixed",
    ),
    pytest.param(
        d("--- f.txt", "+++ f.txt", *MODIFY),
        d("diff --git a/f.txt b/f.txt", "--- a/f.txt", "+++ b/f.txt", *MODIFY),
        id="modify-no-prefix",
    ),
    pytest.param(
        d(
            "--- a/src/f.txt\t2026-01-01 10:00:00.000000000 +0000",
            "+++ b/src/f.txt\t2026-01-02 10:00:00.000000000 +0000",
            *MODIFY,
        ),
        d("diff --git a/src/f.txt b/src/f.txt", "--- a/src/f.txt", "+++ b/src/f.txt", *MODIFY),
        id="timestamps",
    ),
    pytest.param(
        d("--- /dev/null", "+++ b/new.txt", "@@ -0,0 +1,2 @@", "+x", "+y"),
        d(
            "diff --git a/new.txt b/new.txt",
            "new file mode 100644",
            "--- /dev/null",
            "+++ b/new.txt",
            "@@ -0,0 +1,2 @@",
            "+x",
            "+y",
        ),
        id="create-prefixed",
    ),
    pytest.param(
        d("--- /dev/null", "+++ new.txt", "@@ -0,0 +1 @@", "+x"),
        d(
            "diff --git a/new.txt b/new.txt",
            "new file mode 100644",
            "--- /dev/null",
            "+++ b/new.txt",
            "@@ -0,0 +1 @@",
            "+x",
        ),
        id="create-no-prefix",
    ),
    pytest.param(
        d("--- a/old.txt", "+++ /dev/null", "@@ -1,2 +0,0 @@", "-x", "-y"),
        d(
            "diff --git a/old.txt b/old.txt",
            "deleted file mode 100644",
            "--- a/old.txt",
            "+++ /dev/null",
            "@@ -1,2 +0,0 @@",
            "-x",
            "-y",
        ),
        id="delete",
    ),
    pytest.param(
        # a removed "-- x" line reads "--- x": the hunk's counts say it is no new section
        d(
            "--- a/q.sql",
            "+++ b/q.sql",
            "@@ -1,2 +1,1 @@",
            "--- x",
            " select 1;",
            "--- a/f.txt",
            "+++ b/f.txt",
            *MODIFY,
        ),
        d(
            "diff --git a/q.sql b/q.sql",
            "--- a/q.sql",
            "+++ b/q.sql",
            "@@ -1,2 +1,1 @@",
            "--- x",
            " select 1;",
            "diff --git a/f.txt b/f.txt",
            "--- a/f.txt",
            "+++ b/f.txt",
            *MODIFY,
        ),
        id="two-files-and-a-removed-dash-line",
    ),
    pytest.param(
        d("--- a/f.txt", "+++ b/f.txt", "@@ -1 +1 @@", "-a", "+A", "\\ No newline at end of file"),
        d(
            "diff --git a/f.txt b/f.txt",
            "--- a/f.txt",
            "+++ b/f.txt",
            "@@ -1 +1 @@",
            "-a",
            "+A",
            "\\ No newline at end of file",
        ),
        id="no-newline-marker",
    ),
    pytest.param(
        d('--- "a/say \\"hi\\".txt"', '+++ "b/say \\"hi\\".txt"', *MODIFY),
        d(
            'diff --git "a/say \\"hi\\".txt" "b/say \\"hi\\".txt"',
            '--- "a/say \\"hi\\".txt"',
            '+++ "b/say \\"hi\\".txt"',
            *MODIFY,
        ),
        id="quoted-name",
    ),
]


@pytest.mark.parametrize(("text", "git_form"), ACCEPTED)
def test_traditional_diffs_become_their_git_form(text: str, git_form: str) -> None:
    assert diffs.canonical(text) == git_form
    assert diffs.parse_patch(text) == diffs.parse(git_form)


def test_a_git_diff_is_left_alone() -> None:
    text = d("diff --git a/f.txt b/f.txt", "--- a/f.txt", "+++ b/f.txt", *MODIFY)
    assert diffs.canonical(text) is text
    assert diffs.parse_patch(text) == diffs.parse(text)


def test_a_deleted_file_is_stated_with_its_own_mode() -> None:
    text = d("--- a/run.sh", "+++ /dev/null", "@@ -1 +0,0 @@", "-echo")
    modes = {"run.sh": "100755"}
    assert "deleted file mode 100755\n" in diffs.canonical(text, modes.get)
    (patch,) = diffs.parse_patch(text, modes.get)
    assert (patch.kind, patch.old_mode) == ("delete", "100755")


HOSTILE = [
    pytest.param(d("--- a/../x", "+++ b/../x", *MODIFY), "dotdot", id="dotdot"),
    pytest.param(d("--- ../x", "+++ ../x", *MODIFY), "dotdot", id="dotdot-no-prefix"),
    pytest.param(d("--- /etc/passwd", "+++ /etc/passwd", *MODIFY), "absolute_path", id="abs"),
    pytest.param(
        d("--- /dev/null", "+++ /etc/cron.d/x", "@@ -0,0 +1 @@", "+x"),
        "absolute_path",
        id="abs-create",
    ),
    pytest.param(d("--- a/.git/config", "+++ b/.git/config", *MODIFY), "git_dir", id="git"),
    pytest.param(d("--- .GIT/hooks/x", "+++ .GIT/hooks/x", *MODIFY), "git_dir", id="git-case"),
    pytest.param(d("--- a/x.txt", "+++ b/y.txt", *MODIFY), "header_mismatch", id="mismatch"),
    pytest.param(d("--- a/f.txt", "+++ f.txt", *MODIFY), "header_mismatch", id="half-prefix"),
    pytest.param(d("--- x.txt.orig", "+++ x.txt", *MODIFY), "header_mismatch", id="orig"),
    pytest.param(
        d("--- /dev/null", "+++ /dev/null", "@@ -0,0 +1 @@", "+x"),
        "header_mismatch",
        id="null-to-null",
    ),
    pytest.param(
        d("--- a/f.txt", "+++ /dev/null", "@@ -1,3 +1,3 @@", " a", "-b", "+B", " c"),
        "bad_hunk",
        id="delete-with-new-lines",
    ),
    pytest.param(d("--- a/f.txt", "@@ -1 +1 @@", "-a", "+b"), "bad_header", id="no-plus"),
    pytest.param(d("--- a/f.txt", "+++ b/f.txt"), "bad_hunk", id="no-hunks"),
    pytest.param(
        d("--- a/f.txt", "+++ b/f.txt", "@@ -1,3 +1,3 @@", " a", "-b", "+B", " c", "+extra"),
        "hunk_count_mismatch",
        id="line-beyond-counts",
    ),
    pytest.param(
        d("--- a/f.txt", "+++ b/f.txt", "@@ -1,3 +1,3 @@", " a", "-b", "bogus", " c"),
        "bad_hunk",
        id="bad-line-in-hunk",
    ),
    pytest.param(d("--- a/f.txt", "+++ b/f.txt", "@@ -1 +1", "-a", "+b"), "bad_hunk", id="hdr"),
    pytest.param(d("--- a/f.txt", "+++ b/f.txt", *MODIFY, "thanks!"), "garbage", id="trailing"),
    pytest.param(d("--- a/f.txt", "+++ b/f.txt", *MODIFY, "```"), "fence", id="fence"),
    pytest.param(
        d("Here is the patch:", "--- a/f.txt", "+++ b/f.txt", *MODIFY), "garbage", id="prose"
    ),
    pytest.param(
        d(
            "--- a/f.txt",
            "+++ b/f.txt",
            *MODIFY,
            "diff --git a/g.txt b/g.txt",
            "--- a/g.txt",
            "+++ b/g.txt",
            *MODIFY,
        ),
        "garbage",
        id="mixed-forms",
    ),
    pytest.param(
        "--- a/f.txt\r\n+++ b/f.txt\r\n@@ -1 +1 @@\r\n-a\r\n+b\r\n", "crlf_header", id="crlf"
    ),
    pytest.param(d('--- "a/x\\\\y"', '+++ "b/x\\\\y"', *MODIFY), "backslash", id="backslash"),
    pytest.param(d('--- "a/x\\ty"', '+++ "b/x\\ty"', *MODIFY), "control_char", id="control"),
    pytest.param(
        d("--- a/f.txt", "+++ b/f.txt", *MODIFY, "--- a/F.TXT", "+++ b/F.TXT", *MODIFY),
        "case_collision",
        id="case-collision",
    ),
    pytest.param(
        d("--- a/f.txt", "+++ b/f.txt", *MODIFY, "--- f.txt", "+++ f.txt", *MODIFY),
        "duplicate_file",
        id="duplicate",
    ),
    pytest.param(d("--- a/%2e%2e/x", "+++ b/%2e%2e/x", *MODIFY), "percent_escape", id="percent"),
    pytest.param("--- a/f.txt\n+++ b/f.txt\n@@ -1 +1 @@\n-a\n+b", "truncated", id="trunc"),
    pytest.param(d("--- a/f\x00.txt", "+++ b/f\x00.txt", *MODIFY), "nul", id="nul"),
]


@pytest.mark.parametrize(("text", "reason"), HOSTILE)
def test_hostile_traditional_diffs_are_refused(text: str, reason: str) -> None:
    with pytest.raises(DiffError) as info:
        diffs.parse_patch(text)
    assert info.value.reason == reason, info.value


def test_line_numbers_of_a_converted_diff_are_explained() -> None:
    with pytest.raises(DiffError) as info:
        diffs.parse_patch(d("--- a/f.txt", "+++ b/f.txt", "@@ -1 +1 @@", "-a", "bogus"))
    assert info.value.message == (
        "unexpected text on line 6 (line numbers count the diff in git form: 'diff --git' and"
        " mode lines added)"
    )
    with pytest.raises(DiffError) as info:  # found before the conversion: the text's own
        diffs.parse_patch(d("--- a/f.txt", "+++ b/f.txt", *MODIFY, "thanks!"))
    assert info.value.message == "unexpected text on line 8"


APPLIED = [
    pytest.param(
        {"f.txt": ABC},
        d("--- a/f.txt", "+++ b/f.txt", *MODIFY),
        {"f.txt": b"a\nB\nc\n"},
        id="modify",
    ),
    pytest.param(
        {"f.txt": ABC, "gone.txt": b"x\n"},
        d(
            "--- a/f.txt\t2026-01-01",
            "+++ b/f.txt\t2026-01-01",
            *MODIFY,
            "--- /dev/null",
            "+++ b/sub/new.txt",
            "@@ -0,0 +1 @@",
            "+new",
            "--- a/gone.txt",
            "+++ /dev/null",
            "@@ -1 +0,0 @@",
            "-x",
        ),
        {"f.txt": b"a\nB\nc\n", "sub/new.txt": b"new\n", "gone.txt": None},
        id="modify-create-delete",
    ),
]


@pytest.mark.parametrize(("files", "text", "expected"), APPLIED)
def test_applied_as_git_apply_applies_them(
    tmp_path: Path, files: dict[str, bytes], text: str, expected: dict[str, bytes | None]
) -> None:
    ours = diffs.apply(diffs.parse_patch(text), files.get)
    assert {path: ours.get(path, files.get(path)) for path in expected} == expected
    repo = init(tmp_path / "repo")
    for path, data in files.items():
        (repo.path / path).write_bytes(data)
    assert repo.run("add", "-A").returncode == 0
    assert repo.run("commit", "-qm", "base").returncode == 0
    patch = tmp_path / "change.patch"
    patch.write_bytes(text.encode())
    res = repo.run("apply", str(patch))
    assert res.returncode == 0, res.stderr.decode(errors="replace")
    on_disk = {
        path: (repo.path / path).read_bytes() if (repo.path / path).is_file() else None
        for path in expected
    }
    assert on_disk == expected


def test_git_reads_our_git_form_as_the_same_change(tmp_path: Path) -> None:
    """The converted text is a diff git itself applies (``git apply --check``)."""
    repo = init(tmp_path / "repo")
    (repo.path / "f.txt").write_bytes(ABC)
    (repo.path / "gone.txt").write_bytes(b"x\n")
    assert repo.run("add", "-A").returncode == 0
    assert repo.run("commit", "-qm", "base").returncode == 0
    text = d(
        "--- f.txt", "+++ f.txt", *MODIFY, "--- gone.txt", "+++ /dev/null", "@@ -1 +0,0 @@", "-x"
    )
    patch = tmp_path / "change.patch"
    patch.write_text(diffs.canonical(text))
    res = repo.run("apply", "--check", str(patch))
    assert res.returncode == 0, res.stderr.decode(errors="replace")
