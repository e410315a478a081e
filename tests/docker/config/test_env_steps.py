"""An environment build's own steps, on the local sandbox base (which has python3 and git):
no step installs python3 for the agent, the seed runs in the agent layer's one container
(no step of its own), and what the setup left in ``/workspace`` is still the sandbox's:
a check reads it. The steps' names and seconds are the build's answer."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import docker
import pytest

from tests.support.cli import job_files, patchbox
from tests.support.git import init

pytestmark = pytest.mark.docker


def test_a_build_has_no_python_step_on_a_base_with_python_and_the_seed_in_the_agent_layer(
    docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> None:
    del sandbox_image
    marker = uuid.uuid4().hex  # a build of its own: a new key
    repo = init(tmp_path / "p", {"a.txt": "a\n"}).path
    environment = {
        "setup": [["sh", "-c", f"mkdir -p made && echo {marker} > made/f"]],
    }
    task = {
        "prompt": "p",
        "environment": environment,
        "checks": {"seeded": {"argv": ["sh", "-c", f"grep -qx {marker} made/f"]}},
    }
    (tmp_path / "task.json").write_text(json.dumps(task))
    built = patchbox(
        "env", "build", "--task", str(tmp_path / "task.json"), "--repo", str(repo), "--json"
    )
    assert built.returncode == 0, built.stderr[-3000:]
    answer = json.loads(built.stdout)
    try:
        names = [step["name"] for step in answer["steps"]]
        assert names == [
            "base",
            "labels",
            "inputs",
            f"setup 1/1: sh -c mkdir -p made && echo {marker} > made/f",
            "agent layer",
        ]
        assert all(step["seconds"] >= 0 for step in answer["steps"])
        edit = {
            "name": "replace_text",
            "arguments": {"path": "a.txt", "oldText": "a", "newText": "b"},
        }
        calls = {"turns": [[{"id": "c1", **edit}]], "final": "done"}
        args = job_files(tmp_path / "job", task, calls)
        proc = patchbox("run", "--repo", str(repo), *args, "--json")
        assert proc.returncode == 0, proc.stderr[-3000:]
        out = json.loads(proc.stdout)
        assert out["status"] == "awaiting_review"
        assert [(c["id"], c["status"]) for c in out["checks"]] == [("seeded", "passed")]
    finally:
        docker_client.images.remove(answer["tag"], force=True)
