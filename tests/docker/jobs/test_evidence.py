"""The evidence bundle: what it holds, and that no secret or absolute host path
reaches it, the ``run --json`` output, or the CLI's stderr; the JUnit XML of the checks."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import docker
import pytest

from controller.jobs.evidence import junit
from controller.jobs.records import CheckResult, JobRecord
from controller.jobs.store import JobStore
from controller.logs import REDACTED, Scrubber
from controller.paths import patchbox_home
from tests.support.cli import patchbox
from tests.support.jobs import (
    EDIT,
    GREET,
    call,
    code_of,
    containers_of,
    make_repo,
    make_task,
    new_job,
    scripted,
)
from tests.support.paths import REPO_ROOT

pytestmark = pytest.mark.docker

KEY = "sk-planted-5c0b8e2d4a7f4f19a3"
MARKER = "mk-q7z3x9"
"""In the name of the folder that holds the repository."""
LEAK = {
    "argv": ["python3", "-c", "import os, sys; print('key:', os.environ['GREETING']); sys.exit(1)"],
    "env": {"GREETING": KEY},
}
"""A check that prints the key (given to it under a harmless name) and fails."""
ROOT = REPO_ROOT


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    return make_repo(tmp_path / f"work-{MARKER}" / "greet")


def assert_clean(text: str, *paths: Path) -> None:
    for needle in (KEY, MARKER, *(str(p) for p in paths)):
        assert needle not in text


def outputs(job_id: str) -> dict[str, str]:
    folder = JobStore().folder(job_id)
    return {
        name: (folder / name).read_text()
        for name in ("evidence.json", "diff.patch", "checks.junit.xml")
        if (folder / name).exists()
    }


def prompt_for(repo: Path) -> str:
    return f"Capitalize the greeting in {repo}/app.py."


def test_evidence_holds_the_job_and_no_secret_or_host_path(
    client: docker.DockerClient, repo: Path
) -> None:
    task = make_task(checks={"greet": GREET, "leak": LEAK}, baseline_checks=False).model_copy(
        update={"prompt": prompt_for(repo)}
    )
    job = new_job(client, repo, task, scripted([call("c1", EDIT)]), secrets=(KEY,))
    record = job.run()
    assert record.state == "failed"
    assert code_of(record) == "CHECK_FAILED"
    files = outputs(record.job_id)
    assert sorted(files) == ["checks.junit.xml", "diff.patch", "evidence.json"]
    for text in files.values():
        assert_clean(text, repo)
    assert files["diff.patch"] == job.diff
    evidence = json.loads(files["evidence.json"])
    assert {
        "inputs",
        "baseline",
        "tool_calls",
        "ledger",
        "diff",
        "checks",
        "decision",
        "timings_ms",
    } <= set(evidence)
    assert evidence["inputs"]["repository"] == "greet"
    assert evidence["inputs"]["task"]["prompt"] == "Capitalize the greeting in <repo>/app.py."
    assert record.baseline is not None
    assert evidence["baseline"]["head"] == record.baseline.head
    assert "private_git_dir" not in evidence["baseline"]
    assert evidence["diff"]["sha256"] == record.diff_sha256
    assert evidence["ledger"] == [e.model_dump(mode="json") for e in record.ledger]
    leak = next(c for c in evidence["checks"] if c["id"] == "leak")
    assert (leak["status"], leak["exit_code"]) == ("failed", 1)
    assert leak["output_tail"] == f"key: {REDACTED}\n"
    assert evidence["decision"]["failed_checks"] == ["leak"]
    suite = ET.fromstring(files["checks.junit.xml"])  # noqa: S314 - our own output
    assert (suite.get("tests"), suite.get("failures")) == ("2", "1")
    cases = {str(c.get("name")): c for c in suite.iter("testcase")}
    assert sorted(cases) == ["greet", "leak"]
    assert cases["greet"].find("failure") is None
    failure = cases["leak"].find("failure")
    assert failure is not None
    assert failure.get("message") == "failed (exit 1)"
    assert failure.text == f"key: {REDACTED}\n"


def cli_inputs(tmp_path: Path, prompt: str) -> list[str]:
    task = {
        "prompt": prompt,
        "checks": {"greet": GREET, "leak": LEAK},
        "baseline_checks": False,
        "limits": {"memory_mb": 512, "workspace_mb": 64, "tmp_mb": 32},
    }
    (tmp_path / "task.json").write_text(json.dumps(task))
    (tmp_path / "calls.json").write_text(json.dumps({"turns": [[call("c1", EDIT)]]}))
    (tmp_path / "config.toml").write_text("spare_sandboxes = 0\n")
    return [
        "--task",
        str(tmp_path / "task.json"),
        "--calls",
        str(tmp_path / "calls.json"),
        "--config",
        str(tmp_path / "config.toml"),
        "--json",
    ]


def test_cli_run_and_show_print_no_secret_and_the_evidence_no_host_path(
    client: docker.DockerClient, repo: Path, tmp_path: Path
) -> None:
    """The local CLI names the user's own paths; only the evidence, which may be shared,
    hides them. No secret anywhere."""
    args = cli_inputs(tmp_path, prompt_for(repo))
    done = patchbox("run", "--repo", str(repo), *args)
    assert done.returncode == 1, done.stderr
    assert_clean(done.stdout + done.stderr)
    data = json.loads(done.stdout)
    assert data["status"] == "failed"
    assert data["error"]["code"] == "CHECK_FAILED"
    leak = next(c for c in data["checks"] if c["id"] == "leak")
    assert leak["output_tail"] == f"key: {REDACTED}\n"
    assert containers_of(client, data["job_id"]) == []
    for text in outputs(data["job_id"]).values():
        assert_clean(text, repo)
    shown = patchbox("show", data["job_id"], "--diff", "--json")
    assert shown.returncode == 0, shown.stderr
    assert_clean(shown.stdout + shown.stderr)
    assert json.loads(shown.stdout)["checks"] == data["checks"]
    plain = patchbox("show", data["job_id"])
    assert plain.returncode == 0
    assert_clean(plain.stdout + plain.stderr)


@pytest.mark.parametrize(
    ("kind", "code"),
    [
        ("not_a_repo", "NOT_A_REPOSITORY"),
        ("symlink", "NOT_A_REPOSITORY"),
        ("inside", "NOT_A_REPOSITORY"),
    ],
)
def test_errors_before_the_job_leave_no_job_and_keep_host_paths_out_of_the_artifacts(
    client: docker.DockerClient, repo: Path, tmp_path: Path, kind: str, code: str
) -> None:
    del client
    target = repo / "sub" if kind == "inside" else repo.parent / "not-a-repo"
    target.mkdir()
    if kind == "symlink":
        link = tmp_path / f"link-{MARKER}"
        link.symlink_to(repo.parent, target_is_directory=True)
        target = link / "not-a-repo"
    before = {r.job_id for r in JobStore().all()}
    out = tmp_path / "artifacts"
    args = cli_inputs(tmp_path, "Do it.")
    done = patchbox("run", "--repo", str(target), *args, "--output-dir", str(out), "--json")
    assert done.returncode == 2, done.stderr
    error = json.loads(done.stdout)["error"]
    assert error["code"] == code
    message = error["message"]  # names the user's own path
    assert str(target) in message or str(target.resolve()) in message
    assert {r.job_id for r in JobStore().all()} == before  # no job was made
    files = {p.name: p.read_text() for p in out.iterdir()}
    assert sorted(files) == [".gitignore", "error.json", "junit.xml"]
    for text in files.values():
        assert_clean(text, target, target.resolve(), repo)
    assert json.loads(files["error.json"])["error"]["code"] == code


def test_scrubber_masks_the_repository_its_parents_and_secrets() -> None:
    scrub = Scrubber("/srv/users/alice/proj", ["sk-abcdefgh"])
    text = (
        "/srv/users/alice/proj/x.py; inside /srv/users/alice. /srv/users/alice/proj2 "
        "sk-abcdefgh /srv/x /srv/users/alice/proj.bak /srv/users/alice/proj"
    )
    assert scrub.text(text) == (
        "<repo>/x.py; inside <repo>/... <repo>/../proj2 "
        f"{REDACTED} /srv/x <repo>/../proj.bak <repo>"
    )
    assert scrub.value({"/srv/users/alice/proj": ["sk-abcdefgh", 3]}) == {"<repo>": [REDACTED, 3]}


def ran(fields: dict[str, Any]) -> CheckResult:
    """A check result with what the JUnit XML does not show filled in."""
    source = "none" if fields["status"] == "skipped" else "docker-exec"
    return CheckResult.model_validate(
        {"diff_sha256": "", "required": True, "source": source, **fields}
    )


def test_junit_has_one_case_per_check_and_failures_for_failed_ones() -> None:
    home = str(patchbox_home())
    record = JobRecord(job_id="j-junit", repo="/srv/users/alice/proj")
    record.checks = [
        ran(
            {"id": "ok", "status": "passed", "exit_code": 0, "duration_ms": 1500, "output_tail": ""}
        ),
        ran(
            {
                "id": "bad",
                "status": "failed",
                "exit_code": 2,
                "duration_ms": 20,
                "output_tail": "in /srv/users/alice/proj/x.py and " + home + "/jobs",
            }
        ),
        ran(
            {
                "id": "slow",
                "status": "timed_out",
                "exit_code": 137,
                "duration_ms": 1000,
                "output_tail": "",
            }
        ),
        ran(
            {
                "id": "skip",
                "status": "skipped",
                "exit_code": None,
                "duration_ms": 0,
                "output_tail": "",
                "reason": "trusted-auto: project checks skipped",
            }
        ),
    ]
    data = junit(record, Scrubber(record.repo))
    suite = ET.fromstring(data)  # noqa: S314 - our own output
    assert (suite.get("tests"), suite.get("failures"), suite.get("skipped")) == ("4", "2", "1")
    cases = list(suite.iter("testcase"))
    assert [c.get("name") for c in cases] == ["ok", "bad", "slow", "skip"]
    assert [c.get("time") for c in cases] == ["1.500", "0.020", "1.000", "0.000"]
    ok, bad, slow, skip = cases
    assert ok.find("failure") is None
    assert ok.find("skipped") is None
    bad_failure = bad.find("failure")
    assert bad_failure is not None
    assert bad_failure.get("message") == "failed (exit 2)"
    assert bad_failure.text == "in <repo>/x.py and <path>/jobs"
    slow_failure = slow.find("failure")
    assert slow_failure is not None
    assert slow_failure.get("message") == "timed_out (exit 137)"
    skipped = skip.find("skipped")
    assert skipped is not None
    assert skipped.get("message") == "trusted-auto: project checks skipped"
    assert skip.find("failure") is None
    assert b"/srv/users/alice" not in data
    assert home.encode() not in data
