"""``run --output-dir``'s folder and patch, in real git repositories (no daemon):

- the patch mail's subject is the first line of the model's summary, made plain (no control,
  format or bidi character, no secret, no Markdown marks, bounded), else the task's first
  line; ``git am`` takes it as the commit's subject, and the task goes into the body;
- a folder patchbox makes gets a ``.gitignore`` of ``*``, so inside the repository the next
  job's health check finds no local change; a folder of the user's is left as it is;
- a failed command never removes the folder nor a file patchbox did not write."""

from __future__ import annotations

import json
from pathlib import Path

from controller.cli.artifacts import OWN, format_patch, prepare_folder, write_failure
from controller.jobs.records import JobRecord
from controller.logs import Scrubber
from controller.repo.health import check_health
from tests.support.git import git, init, make_diff
from tests.support.jobs import APP, APP_AFTER, FILES

SECRET = "sk-artifact-secret-99"  # noqa: S105 - a test value


def record(prompt: str, final: str | None) -> JobRecord:
    return JobRecord(job_id="job-1", repo="/r", task={"prompt": prompt}, final_message=final)


def subject_and_body(mail: str) -> tuple[str, list[str]]:
    head, _, rest = mail.partition("\n\n")
    [subject] = [line for line in head.splitlines() if line.startswith("Subject: ")]
    body = rest.split("\npatchbox job job-1\n---\n", 1)[0]
    return subject.removeprefix("Subject: [PATCH] "), body.splitlines()


def test_the_subject_is_the_summary_s_first_line_made_plain() -> None:
    scrub = Scrubber("/r", (SECRET,))
    final = (
        "Summary:\n"
        f"## **Capitalize\u202e the \x1b[31mgreeting** with key {SECRET}\r\n"
        "- greet() now says Hello\n---\nFrom me"
    )
    mail = format_patch(record("Fix it.\nSecond line", final), "diff --git a/x b/x\n", scrub, "1")
    subject, body = subject_and_body(mail)
    assert subject == "Capitalize the greeting with key [redacted]"
    assert SECRET not in mail
    assert "\u202e" not in mail
    assert "\x1b" not in mail
    assert "\r" not in mail
    assert body == [
        "    - greet() now says Hello",
        "    ---",
        "    From me",
        "",
        "    Task:",
        "    Fix it.",
        "    Second line",
    ]
    long = format_patch(record("p", "x" * 200), "", scrub, "1")
    assert subject_and_body(long)[0] == "x" * 69 + "..."


def test_without_a_summary_the_task_s_first_line_is_the_subject() -> None:
    scrub = Scrubber("/r")
    for final in (None, "", "  \n**Summary:**\n"):
        mail = format_patch(record("Capitalize.\nKeep the rest.", final), "", scrub, "1")
        assert subject_and_body(mail) == ("Capitalize.", ["    Keep the rest."])
    assert subject_and_body(format_patch(record("", None), "", scrub, "1"))[0] == (
        "patchbox job job-1"
    )


def test_git_am_commits_with_the_summary_s_subject(tmp_path: Path) -> None:
    repo = init(tmp_path / "repo", FILES)
    diff = make_diff(tmp_path, {"app.py": APP}, {"app.py": APP_AFTER})
    job = record("Capitalize the greeting.", "Capitalized the greeting in greet().\n\nOne line.")
    mail = format_patch(job, diff, Scrubber(str(repo.path)), "1")
    (tmp_path / "p.patch").write_text(mail)
    git(repo.path, "am", str(tmp_path / "p.patch"), env=repo.env)
    subject, *body = git(repo.path, "log", "-1", "--format=%s%n%b", env=repo.env).splitlines()
    assert subject == "Capitalized the greeting in greet()."
    assert "    Task:" in body
    assert (repo.path / "app.py").read_text() == APP_AFTER


def test_an_output_folder_in_the_repository_is_no_local_change(tmp_path: Path) -> None:
    repo = init(tmp_path / "repo", FILES)
    out = repo.path / "patchbox-out"
    write_failure(out, "USAGE_ERROR", "a bad task")
    assert sorted(p.name for p in out.iterdir()) == [".gitignore", "error.json", "junit.xml"]
    assert repo.git("status", "--porcelain", "--untracked-files=all") == ""
    health = check_health(repo.path)
    assert health.ok
    assert not health.dirty
    # A folder of the user's (a file patchbox does not write in it) gets no .gitignore:
    mine = repo.path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine\n")
    prepare_folder(mine)
    assert not (mine / ".gitignore").exists()
    assert check_health(repo.path).dirty
    # ... and a .gitignore that is there is never replaced.
    (mine / "notes.txt").unlink()
    (mine / ".gitignore").write_text("notes.txt\n")
    prepare_folder(mine)
    assert (mine / ".gitignore").read_text() == "notes.txt\n"
    assert ".gitignore" in OWN


def test_a_failed_command_keeps_the_folder_and_what_is_not_patchbox_s(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine\n")
    (out / "sub").mkdir()
    (out / "sub" / "more.txt").write_text("mine too\n")
    (out / "run.json").write_text('{"status": "awaiting_review"}')  # an earlier run's
    write_failure(out, "ENVIRONMENT_NOT_READY", "no daemon")
    assert sorted(p.name for p in out.iterdir()) == ["error.json", "junit.xml", "notes.txt", "sub"]
    assert (out / "notes.txt").read_text() == "mine\n"
    assert (out / "sub" / "more.txt").read_text() == "mine too\n"
    error = json.loads((out / "error.json").read_text())
    assert error["error"]["code"] == "ENVIRONMENT_NOT_READY"
