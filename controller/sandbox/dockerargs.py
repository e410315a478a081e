"""The keyword arguments of ``containers.create`` for a sandbox, typed: what
:func:`controller.sandbox.docker.container_config` builds and the tests read back."""

from __future__ import annotations

from typing import TypedDict

from docker.types import LogConfig, Mount, Ulimit


class _Required(TypedDict):
    image: str
    entrypoint: list[str]
    command: list[str]
    user: str
    working_dir: str
    environment: dict[str, str]
    labels: dict[str, str]
    stdin_open: bool
    tty: bool
    detach: bool
    network_mode: str
    cap_drop: list[str]
    security_opt: list[str]
    read_only: bool
    tmpfs: dict[str, str]
    ipc_mode: str
    shm_size: str
    mem_limit: str
    memswap_limit: str
    nano_cpus: int
    pids_limit: int
    ulimits: list[Ulimit]
    oom_score_adj: int
    init: bool
    hostname: str
    log_config: LogConfig


class ContainerConfig(_Required, total=False):
    """The keyword arguments of ``containers.create`` for a sandbox."""

    runtime: str
    mounts: list[Mount]
    auto_remove: bool
