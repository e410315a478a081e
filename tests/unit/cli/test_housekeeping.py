"""Housekeeping through the CLI, on job records in a private state directory: ``--version``,
``jobs`` with its times, durations, error codes and filters, ``prune --older-than``, and
output into a pipe that closes early (``show JOB | head``) ending quietly."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from controller.errorinfo import ErrorInfo
from controller.jobs.records import JobRecord, TranscriptCall, TranscriptTurn
from controller.jobs.store import JobStore
from tests.support.cli import ROOT, patchbox

DAY = 86400.0


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "home"
    folder.mkdir()
    monkeypatch.setenv("PATCHBOX_HOME", str(folder))
    return folder


def _record(job_id: str, state: str, age_days: float, *, error: str | None = None) -> JobRecord:
    now = time.time()
    record = JobRecord(
        job_id=job_id,
        repo="/srv/repos/demo",
        state=state,  # type: ignore[arg-type]
        created_at=now - age_days * DAY,
        updated_at=now - age_days * DAY + 42.0,
    )
    if error:
        record.error = ErrorInfo(code=error, message="it failed")
    return record


@pytest.fixture
def jobs(home: Path) -> list[str]:
    store = JobStore()
    made = [
        _record("20260101-000000-aaaaaaaa", "failed", 30, error="CHECK_FAILED"),
        _record("20260102-000000-bbbbbbbb", "awaiting_review", 20),
        _record("20260103-000000-cccccccc", "applied", 10),
        _record("20260104-000000-dddddddd", "discarded", 3),
        _record("20260105-000000-eeeeeeee", "cancelled", 0.01, error="CANCELLED"),
    ]
    for record in made:
        store.save(record)
    return [r.job_id for r in made]


def _python(code: str) -> subprocess.CompletedProcess[str]:
    """``code`` run by a fresh interpreter from the project's root."""
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, cwd=ROOT
    )


def test_version() -> None:
    proc = patchbox("--version")
    assert proc.returncode == 0
    assert proc.stdout.startswith("patchbox ")
    assert proc.stdout.split()[1][0].isdigit()


def test_version_loads_no_data_model() -> None:
    """``--version`` (and the parser it builds) imports no pydantic: the ground floor and
    the parsers stay free of the data models."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "controller", "--version"],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    loaded = [line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines()]
    assert [m for m in loaded if m.split(".")[0] == "pydantic"] == []
    assert "controller.main" in loaded


def test_a_job_that_signs_nothing_loads_no_signing_library() -> None:
    """What ``run`` imports, the job's engine included, loads no securesystemslib (nor
    what its signers pull in), no cryptography and not the statements' models: they are
    loaded only when a job signs or a key is read, and
    ``show`` and ``jobs`` never load docker-py for a record's network requests."""
    code = (
        "import sys, controller.cli.main, controller.cli.commands, controller.jobs.engine; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'securesystemslib', 'boto3', "
        "'cryptography'} | {m for m in sys.modules} & {'controller.provenance.statement'}))"
    )
    proc = _python(code)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]"
    code = "import sys, controller.jobs.records; print('docker' in sys.modules)"
    proc = _python(code)
    assert proc.stdout.strip() == "False", proc.stderr[-2000:]


def test_a_command_loads_no_console_extras_and_leaves_them_importable() -> None:
    """A command's start imports structlog with rich, better_exceptions and colorama out of
    its sight (its console lines are plain text whatever is installed): none of them is
    loaded by what ``run`` imports, and each one installed still imports afterwards."""
    assert importlib.util.find_spec("rich") is not None  # the development tools bring it
    code = (
        "import importlib, importlib.util, sys, controller.main as entry\n"
        "entry.import_logging()\n"
        "import controller.cli.main, controller.cli.commands, controller.jobs.engine\n"
        "print(sorted(n for n in entry.CONSOLE_EXTRAS if n in sys.modules))\n"
        "found = [n for n in entry.CONSOLE_EXTRAS if importlib.util.find_spec(n)]\n"
        "print(all(importlib.import_module(n) for n in found), 'rich' in found)\n"
    )
    proc = _python(code)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.splitlines() == ["[]", "True True"]
    code = (  # the entry point itself, through to its exit
        "import atexit, sys\n"
        "atexit.register(lambda: print(*(m in sys.modules for m in ('structlog', 'rich'))))\n"
        "sys.argv = ['patchbox', '--version']\n"
        "from controller.main import run\n"
        "run()\n"
    )
    proc = _python(code)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.splitlines()[-1] == "True False"


def test_jobs_shows_times_durations_and_error_codes(home: Path, jobs: list[str]) -> None:
    proc = patchbox("jobs", "--json", home=home)
    assert proc.returncode == 0, proc.stderr
    listed = json.loads(proc.stdout)["jobs"]
    assert [j["job_id"] for j in listed] == jobs
    first = listed[0]
    assert (first["status"], first["error_code"], first["duration_seconds"]) == (
        "failed",
        "CHECK_FAILED",
        42.0,
    )
    assert first["created"][:2] == "20"
    assert "T" in first["created"]
    text = patchbox("jobs", home=home).stdout.splitlines()
    assert text[0].split() == ["JOB", "STATUS", "CREATED", "DURATION", "ERROR", "REPO"]
    assert text[1].split()[0] == jobs[0]
    assert "CHECK_FAILED" in text[1]
    assert "42.0s" in text[1]
    assert len(text) == 1 + len(jobs)
    columns = [text[0].index(name) for name in ("STATUS", "CREATED", "ERROR")]
    assert [text[1].index(v) for v in ("failed", first["created"][:10], "CHECK_FAILED")] == columns


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--status", "failed"], [0]),
        (["--status", "failed,cancelled"], [0, 4]),
        (["--status", "failed", "--status", "applied"], [0, 2]),
        (["--since", "15d"], [2, 3, 4]),
        (["--since", "2h"], [4]),
        (["--since", "15d", "--status", "discarded"], [3]),
    ],
)
def test_jobs_filters(home: Path, jobs: list[str], args: list[str], expected: list[int]) -> None:
    proc = patchbox("jobs", *args, "--json", home=home)
    assert proc.returncode == 0, proc.stderr
    assert [j["job_id"] for j in json.loads(proc.stdout)["jobs"]] == [jobs[i] for i in expected]


def test_jobs_since_an_iso_date(home: Path, jobs: list[str]) -> None:
    import datetime as dt

    day = (dt.datetime.now(dt.UTC).astimezone() - dt.timedelta(days=12)).date().isoformat()
    proc = patchbox("jobs", "--since", day, "--json", home=home)
    assert [j["job_id"] for j in json.loads(proc.stdout)["jobs"]] == jobs[2:]


@pytest.mark.parametrize(
    "args",
    [["--status", "sleeping"], ["--since", "yesterday"], ["--since", "5y"], ["--since", "-3d"]],
)
def test_bad_filters_are_usage(home: Path, jobs: list[str], args: list[str]) -> None:
    del jobs
    proc = patchbox("jobs", *args, "--json", home=home)
    assert proc.returncode == 2
    assert json.loads(proc.stdout)["error"]["code"] == "USAGE_ERROR"


def test_prune_removes_only_old_ended_jobs(home: Path, jobs: list[str]) -> None:
    proc = patchbox("prune", "--older-than", "7d", "--json", home=home)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["removed"] == [jobs[0]]
    left = sorted(p.name for p in (home / "jobs").iterdir())
    assert left == jobs[1:]
    proc = patchbox("prune", "--older-than", "1h", "--json", home=home)
    assert json.loads(proc.stdout)["removed"] == [jobs[3]]
    assert sorted(p.name for p in (home / "jobs").iterdir()) == [jobs[1], jobs[2], jobs[4]]
    bad = patchbox("prune", "--older-than", "soon", "--json", home=home)
    assert (bad.returncode, json.loads(bad.stdout)["error"]["code"]) == (2, "USAGE_ERROR")
    missing = patchbox("prune", "--json", home=home)
    assert missing.returncode == 2


def test_output_into_a_closed_pipe_ends_quietly(home: Path) -> None:
    record = _record("20260106-000000-ffffffff", "failed", 1, error="CHECK_FAILED")
    record.transcript.extend(
        TranscriptTurn(
            turn=i,
            text="x" * 300,
            calls=[
                TranscriptCall(
                    id=f"c{i}", name="read_file", arguments="{}", ok=True, result="y" * 300
                )
            ],
        )
        for i in range(1, 2000)
    )
    JobStore().save(record)
    env = {**os.environ, "PATCHBOX_HOME": str(home)}
    cmd = f"{sys.executable} -m controller show {record.job_id} --transcript | head -n 1"
    proc = subprocess.run(
        ["sh", "-c", cmd],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        check=False,
        timeout=120,
    )
    assert proc.stdout.startswith(f"job {record.job_id}: failed")
    assert proc.stderr == ""
