"""``patchbox run`` with a scripted model that aims a check: the values reach the check as
argv elements, refusals carry their exact reasons, the argv that ran is in the transcript
and the evidence, the required check runs with its defaults."""

from __future__ import annotations

import json
from pathlib import Path

import docker
import pytest

from tests.support.checkargs import CALLS, TASK, check_tool_calls, check_transcript
from tests.support.cli import job_files, patchbox
from tests.support.jobs import make_repo

pytestmark = pytest.mark.docker


def test_a_run_aims_a_check_and_records_the_argv(
    docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> None:
    del docker_client, sandbox_image
    repo = make_repo(tmp_path / "repo")
    out_dir = tmp_path / "out"
    proc = patchbox(
        "run", "--repo", str(repo), *job_files(tmp_path / "f", TASK, CALLS), "--output-dir",
        str(out_dir), "--json",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["status"] == "awaiting_review"
    check_tool_calls(out["tool_calls"])
    check_transcript(json.loads((out_dir / "transcript.json").read_text()))
    evidence = json.loads((out_dir / "evidence.json").read_text())
    check_transcript(evidence["transcript"])
    final = {c["id"]: c for c in out["checks"]}
    assert (final["greet"]["status"], final["echo"]["status"]) == ("passed", "passed")
    assert final["echo"]["output_tail"] == "['app.py']\n"  # the final diff: the default
