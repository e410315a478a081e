"""Services for the tests of a job's services: PostgreSQL and Redis built from Debian's
packages on the local base, the environment's clients, and a host configuration whose
setup reaches the package hosts (read at run time)."""

from __future__ import annotations

import tomllib
from typing import Any

from controller.config.host import HostConfig
from tests.support.registries import network_table

PACKAGES = [
    ["apt-get", "update"],
    [
        "apt-get", "install", "-y", "--no-install-recommends",
        "postgresql", "redis-server", "python3-psycopg2", "python3-redis",
    ],
]  # fmt: skip
"""One setup for the environment and both services: built once (the same base and steps
make the same image), PostgreSQL and Redis, and the project's clients for them."""
POSTGRES: dict[str, Any] = {
    "build": {"setup": PACKAGES},
    "user": "postgres",
    "command": [
        "/bin/sh",
        "-c",
        (
            "for B in /usr/lib/postgresql/*/bin; do break; done"
            " && $B/initdb -D /tmp/pg -A trust -U app"
            " >/dev/null && echo 'host all all 0.0.0.0/0 trust' >> /tmp/pg/pg_hba.conf"
            " && exec $B/postgres -D /tmp/pg -k /tmp -c listen_addresses='*'"
        ),
    ],
    "ready": {"argv": ["pg_isready", "-h", "127.0.0.1", "-U", "app"], "timeout_seconds": 60},
    "limits": {"memory_mb": 512},
}
REDIS: dict[str, Any] = {
    "build": {"setup": PACKAGES},
    "user": "redis",
    "command": ["redis-server", "--dir", "/tmp", "--appendonly", "no", "--protected-mode", "no"],
    "ready": {"argv": ["redis-cli", "ping"], "timeout_seconds": 30},
}
CLIENTS = PACKAGES
"""The environment's setup: the project's database and cache clients (and the servers)."""


def services_config() -> HostConfig:
    data = tomllib.loads(network_table())
    return HostConfig.model_validate({"spare_sandboxes": 0, "network": data["network"]})
