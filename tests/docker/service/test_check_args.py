"""``patchbox serve`` over real HTTP: a job whose scripted model aims a check; its
``tool_call`` events, view and evidence carry the verdicts, the exact refusals and the argv
that ran; the checks on the final diff run with their defaults."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import docker
import pytest

from tests.support.checkargs import CALLS, TASK, check_tool_calls, check_transcript
from tests.support.jobs import make_repo
from tests.support.service import events, serving, write_config
from tests.support.service_http import submit


@pytest.fixture
def live(tmp_path: Path, client: docker.DockerClient) -> Any:
    del client
    with serving(write_config(tmp_path, workers=1)) as running:
        yield running


def test_a_service_job_aims_a_check(live: Any, tmp_path: Path) -> None:
    alpha = live.client("alpha")
    repo = make_repo(tmp_path / "alpha" / "greet")
    accepted = submit(alpha, repo, task=TASK, calls=CALLS)
    assert accepted.status_code == 202, accepted.text
    job_id = accepted.json()["job_id"]
    stream = events(alpha, job_id)
    calls = [e["data"] for e in stream if e["type"] == "tool_call"]
    assert [c["id"] for c in calls] == ["c1", "c2", "c3", "c4", "c5", "c6"]
    assert calls[0]["verdict"] == "echo: passed"
    assert [c["error_code"] for c in calls[1:4]] == ["TOOL_ARGUMENTS_INVALID"] * 3
    view = alpha.get(f"/v1/jobs/{job_id}").json()
    assert view["status"] == "awaiting_review"
    check_tool_calls(view["tool_calls"])
    final = {c["id"]: c for c in view["checks"]}
    assert final["echo"]["status"] == "passed"
    evidence = alpha.get(f"/v1/jobs/{job_id}/evidence").json()
    check_transcript(evidence["transcript"])
    assert {c["id"]: c["output_tail"] for c in evidence["checks"]}["echo"] == "['app.py']\n"
