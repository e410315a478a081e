"""The workspace and /tmp allow execution (``nosuid,nodev``, never ``noexec``), as a real
project's checks need: a committed script run as ``./ci/test.sh``, and a binary a check
writes into /tmp and runs. Under runc and gVisor."""

from __future__ import annotations

from pathlib import Path

import docker
import pytest

from controller.config.limits import Limits
from controller.sandbox.base import Runtime, SandboxSpec
from controller.sandbox.cache import BaselineCache
from controller.sandbox.labels import current_identity, new_job_id
from controller.sandbox.prepare import prepare
from tests.support.git import init

SCRIPT = '#!/bin/sh\necho "ran from $(pwd)"\n'


@pytest.mark.docker
def test_a_committed_script_and_a_built_binary_run(
    docker_client: docker.DockerClient, sandbox_image: str, runtime: Runtime, tmp_path: Path
) -> None:
    made = init(tmp_path / "proj", {"README.md": "# p\n"})
    made.write("ci/test.sh", SCRIPT, executable=True)
    made.commit("the test script")
    repo = made.path
    spec = SandboxSpec(
        image=sandbox_image,
        job_id=new_job_id(),
        runtime=runtime,
        limits=Limits(memory_mb=512, workspace_mb=64),
    )
    prepared = prepare(
        docker_client,
        repo,
        spec,
        current_identity(),
        cache=BaselineCache(tmp_path / "cache"),
    )
    with prepared.sandbox as box:
        ran = box.run(["./ci/test.sh"], timeout=30)
        assert (ran.exit_code, ran.output.strip()) == (0, "ran from /workspace")
        built = box.run(
            ["sh", "-c", "cp /bin/echo /tmp/built && chmod 755 /tmp/built && /tmp/built hi"],
            timeout=30,
        )
        assert (built.exit_code, built.output.strip()) == (0, "hi")
        mounts = box.run(["cat", "/proc/self/mounts"], timeout=30).output
        for target in ("/workspace", "/tmp"):
            [line] = [m for m in mounts.splitlines() if m.split()[1] == target]
            options = line.split()[3].split(",")
            assert "noexec" not in options
            if runtime == "runc":  # gVisor's mount table does not list nosuid or nodev
                assert {"nosuid", "nodev"} <= set(options)
