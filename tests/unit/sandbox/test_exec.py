"""The workspace and /tmp allow execution (``nosuid,nodev``, never ``noexec``), as a real
project's checks need: a committed script run as ``./ci/test.sh``, and a binary a check
writes into /tmp and runs. Under runc and gVisor."""

from __future__ import annotations

from controller.config.limits import Limits
from controller.sandbox.base import SandboxSpec
from controller.sandbox.docker import container_config


def test_the_tmpfs_mounts_allow_exec_and_keep_nosuid_nodev() -> None:
    spec = SandboxSpec(image="img", job_id="j", limits=Limits())
    for target in ("/workspace", "/tmp"):
        opts = container_config(spec, {})["tmpfs"][target].split(",")
        assert "exec" in opts
        assert "noexec" not in opts
        assert {"nosuid", "nodev"} <= set(opts)
