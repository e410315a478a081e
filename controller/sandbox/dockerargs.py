"""The keyword arguments of ``containers.create`` for a sandbox, typed: what
:func:`controller.sandbox.docker.container_config` builds and the tests read back."""

from __future__ import annotations

from typing import TypedDict

from docker.types import LogConfig, Mount, Ulimit

NO_DNS = ("127.0.0.1",)
"""The name servers of a container on a job's network: Docker's own resolver answers the
network's names (a service's) and passes every other query to this address, where nothing
answers, so no name outside the network resolves and no query leaves the host."""
NO_DNS_OPTIONS = ("timeout:1", "attempts:1")


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
    dns: list[str]
    dns_opt: list[str]
    mounts: list[Mount]
    auto_remove: bool
