"""The service streams a running check's output over real HTTP as ``check_output`` server-sent
events, before the call's ``tool_call`` event, and ``patchbox remote events`` shows each line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import docker

from tests.support.jobs import make_repo
from tests.support.remote import remote
from tests.support.service import LIMITS, events, serving, write_config
from tests.support.service_http import submit

BRIEF = {
    "argv": ["sh", "-c", 'for i in 0 1 2 3 4 5 6 7; do echo "out $i"; sleep 0.3; done'],
    "timeout_seconds": 60,
}
TASK: dict[str, Any] = {
    "prompt": "Run the check.",
    "checks": {"brief": BRIEF},
    "baseline_checks": False,
    "limits": LIMITS,
}
CALLS: dict[str, Any] = {
    "turns": [[{"id": "c1", "name": "run_check", "arguments": {"checkId": "brief"}}]],
    "final": "done",
}


def test_check_output_is_an_sse_event_and_remote_events_shows_it(
    client: docker.DockerClient, tmp_path: Path
) -> None:
    del client
    with serving(write_config(tmp_path, workers=1)) as live:
        alpha = live.client("alpha")
        repo = make_repo(tmp_path / "alpha" / "greet")
        accepted = submit(alpha, repo, TASK, calls=CALLS)
        assert accepted.status_code == 202, accepted.text
        job_id = accepted.json()["job_id"]
        stream = events(alpha, job_id)
        types = [e["type"] for e in stream]
        outputs = [e for e in stream if e["type"] == "check_output"]
        assert outputs, types
        assert {(e["data"]["check_id"], e["data"]["handle"][:4]) for e in outputs} == {
            ("brief", "chk_")
        }
        lines = [line for e in outputs for line in e["data"]["lines"]]
        assert lines == [f"out {i}" for i in range(8)]
        assert len(outputs) > 1  # as it came, not at the end
        assert types.index("tool_call") > max(i for i, t in enumerate(types) if t == "check_output")
        shown = remote(live, "events", job_id)
        assert shown.returncode == 0, shown.stderr
        for i in range(8):
            assert f"check_output brief: out {i}" in shown.stdout
