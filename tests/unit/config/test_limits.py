"""Limits: safe defaults, strict types, and tmpfs sizes that fit the memory limit."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from controller.config.limits import HEADROOM_MB, SHM_MB, Limits
from controller.sandbox.base import SandboxSpec
from controller.sandbox.docker import container_config
from controller.sandbox.labels import ControllerIdentity, controller_alive


def test_defaults_match_the_spec() -> None:
    lim = Limits()
    assert (lim.memory_mb, lim.cpus, lim.pids, lim.workspace_mb) == (1024, 1.0, 256, 512)
    assert (lim.wall_seconds, lim.max_turns, lim.max_tool_calls) == (900.0, 50, 200)


@pytest.mark.parametrize(
    "fields",
    [
        {"memory_mb": 256, "workspace_mb": 256},  # tmpfs would not fit in memory
        {"memory_mb": "1024"},  # strict: no coercion from strings
        {"pids": 0},
        {"cpus": 0},
        {"unknown": 1},
        {"wall_seconds": -1},
    ],
)
def test_bad_limits_are_refused(fields: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        Limits(**fields)  # type: ignore[arg-type]


def test_tmpfs_must_leave_headroom() -> None:
    need = 100 + 10 + SHM_MB + HEADROOM_MB
    Limits(memory_mb=need, workspace_mb=100, tmp_mb=10)
    with pytest.raises(ValidationError, match="tmpfs pages count against the memory limit"):
        Limits(memory_mb=need - 1, workspace_mb=100, tmp_mb=10)


def test_container_config_is_hardened() -> None:
    spec = SandboxSpec(
        image="img", job_id="j1", limits=Limits(memory_mb=512, workspace_mb=128, cpus=0.5, pids=99)
    )
    cfg = container_config(spec, {"io.patchbox.owner": "patchbox"})
    assert cfg["network_mode"] == "none"
    assert cfg["cap_drop"] == ["ALL"]
    assert cfg["security_opt"] == ["no-new-privileges:true"]
    assert cfg["read_only"] is True
    assert cfg["user"] == "10001:10001"
    assert cfg["mem_limit"] == cfg["memswap_limit"] == "512m"
    assert cfg["nano_cpus"] == 500_000_000
    assert cfg["pids_limit"] == 99
    assert "size=128m" in cfg["tmpfs"]["/workspace"]
    assert "nosuid" in cfg["tmpfs"]["/tmp"]
    assert cfg["log_config"]["Type"] == "none"
    assert "runtime" not in cfg
    assert "privileged" not in cfg
    assert "volumes" not in cfg
    assert "mounts" not in cfg
    gvisor = container_config(spec.model_copy(update={"runtime": "runsc"}), {})
    assert gvisor["runtime"] == "runsc"


def test_controller_identity_liveness() -> None:
    me = ControllerIdentity()
    assert controller_alive(me.token, me.host)
    dead = ControllerIdentity(pid=2**22 + 1, started="12345")
    assert not controller_alive(dead.token, dead.host)
    assert not controller_alive("garbage", me.host)
    # Another host's controllers cannot be judged from here and are left alone.
    assert controller_alive(dead.token, "some-other-host")
