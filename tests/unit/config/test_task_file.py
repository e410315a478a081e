"""The task file given to ``run --task``: anything but a regular file of bounded size is bad
usage (exit 2, ``USAGE_ERROR``) at once; a FIFO or a device never hangs the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from controller.config import inputfile
from controller.config import task as task_file
from controller.errors import ErrorCode, UsageError
from controller.providers import scripted
from tests.support.paths import REPO_ROOT

ROOT = REPO_ROOT
TASK = {"prompt": "Capitalize the greeting.", "checks": {}}


def _run_with_task(task: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """``patchbox run --json`` on ``task``; fails the test (instead of hanging) after 30 s."""
    (tmp_path / "repo").mkdir(exist_ok=True)
    (tmp_path / "config.toml").write_text("spare_sandboxes = 0\n")
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "controller",
            "run",
            "--repo",
            str(tmp_path / "repo"),
            "--task",
            str(task),
            "--config",
            str(tmp_path / "config.toml"),
            "--json",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=30,
        check=False,
    )


def _special(kind: str, tmp_path: Path) -> Path:
    if kind == "fifo":
        fifo = tmp_path / "task.fifo"
        os.mkfifo(fifo)
        return fifo
    if kind == "dev-zero":
        return Path("/dev/zero")
    if kind == "directory":
        folder = tmp_path / "task.d"
        folder.mkdir()
        return folder
    if kind == "link-to-fifo":
        fifo = _special("fifo", tmp_path)
        link = tmp_path / "task.json"
        link.symlink_to(fifo)
        return link
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "directory", "link-to-fifo"])
def test_a_task_that_is_not_a_regular_file_is_bad_usage(kind: str, tmp_path: Path) -> None:
    task = _special(kind, tmp_path)
    done = _run_with_task(task, tmp_path)
    assert done.returncode == 2, done.stderr
    error = json.loads(done.stdout)["error"]
    assert error["code"] == "USAGE_ERROR"
    assert error["message"] == f"task file {str(task)!r} is not a regular file"


def test_an_oversized_task_is_bad_usage(tmp_path: Path) -> None:
    task = tmp_path / "task.json"
    text = json.dumps(TASK)
    task.write_text(text + " " * (task_file.MAX_TASK_FILE_BYTES + 1 - len(text)))
    done = _run_with_task(task, tmp_path)
    assert done.returncode == 2, done.stderr
    error = json.loads(done.stdout)["error"]
    assert error == {
        "code": "USAGE_ERROR",
        "message": f"task file {str(task)!r} is larger than {task_file.MAX_TASK_FILE_BYTES} bytes",
    }


def test_a_missing_task_is_bad_usage(tmp_path: Path) -> None:
    done = _run_with_task(tmp_path / "nowhere.json", tmp_path)
    assert done.returncode == 2, done.stderr
    assert json.loads(done.stdout)["error"] == {
        "code": "USAGE_ERROR",
        "message": f"task file {str(tmp_path / 'nowhere.json')!r} not found",
    }


def test_a_task_at_the_cap_is_read(tmp_path: Path) -> None:
    task = tmp_path / "task.json"
    text = json.dumps(TASK)
    task.write_text(text + " " * (task_file.MAX_TASK_FILE_BYTES - len(text)))
    assert task_file.load_task(task).prompt == TASK["prompt"]


def test_task_and_calls_files_share_one_rule() -> None:
    """One helper, not a copy: the calls file goes through the very same function."""
    assert vars(scripted)["read_input_file"] is inputfile.read_input_file


def test_a_file_growing_past_the_cap_while_read_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cap holds on what is read, not only on the size fstat reported."""
    path = tmp_path / "task.json"
    path.write_bytes(b"x" * 10)
    real_fstat = os.fstat

    def shrunk(fd: int) -> os.stat_result:
        st = real_fstat(fd)
        return os.stat_result((*st[:6], 0, *st[7:10]))

    monkeypatch.setattr(os, "fstat", shrunk)
    with pytest.raises(UsageError) as caught:
        inputfile.read_input_file(path, "task file", 5)
    assert caught.value.code is ErrorCode.USAGE_ERROR
    assert caught.value.message == f"task file {str(path)!r} is larger than 5 bytes"
    assert inputfile.read_input_file(path, "task file", 10) == b"x" * 10
