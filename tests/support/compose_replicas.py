"""``compose.yaml``'s ``replicas`` profile as an operator runs it: PostgreSQL built from
``compose/postgres.Dockerfile`` and two ``patchbox serve`` replicas on it, brought up with
pytest-docker's commands in a compose project of their own, torn down with its volumes."""

from __future__ import annotations

import os
import secrets
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import httpx
from pytest_docker.plugin import Services, get_docker_services

from tests.support.compose import (
    ROOT,
    Site,
    base_image,
    compose_command,
    free_port,
    site,
    write_service_config,
)
from tests.support.service import TOKENS

PROFILE = "replicas"
REPLICAS = ("replica-a", "replica-b")
HOSTNAMES = {"replica-a": "patchbox-replica-a-test", "replica-b": "patchbox-replica-b-test"}
DATABASE = "postgresql://patchbox@postgres:5432/patchbox"
"""The replicas' ``database``, as compose.yaml's comment gives it (the password: PGPASSWORD)."""
SERVICE_LINES = ('state = "postgres"', f'database = "{DATABASE}"', "workers = 1")
"""One worker each: two jobs of a tenant at once run one on each replica."""


@dataclass
class ReplicaSite:
    site: Site
    urls: dict[str, str]
    password: str

    @property
    def project(self) -> str:
        return self.site.project

    def client(self, replica: str, tenant: str) -> httpx.Client:
        headers = {"Authorization": f"Bearer {TOKENS[tenant]}"}
        return httpx.Client(base_url=self.urls[replica], headers=headers, timeout=30)

    def sql(self, query: str) -> list[list[str]]:
        """A query's rows, run by psql in the postgres container (no port on the host)."""
        try:
            done = self.site.compose(
                "--profile",
                PROFILE,
                "exec",
                "-T",
                "-e",
                f"PGPASSWORD={self.password}",
                "postgres",
                "psql",
                "-h",
                "127.0.0.1",
                "-U",
                "patchbox",
                "-d",
                "patchbox",
                "-At",
                "-F",
                "\t",
                "-c",
                query,
                timeout=60,
            )
        except subprocess.CalledProcessError as exc:
            raise AssertionError(f"psql: {exc.stdout}{exc.stderr}") from exc
        return [line.split("\t") for line in done.stdout.splitlines() if line]


def healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@contextmanager
def replica_site(root: Path, client: docker.DockerClient) -> Iterator[ReplicaSite]:
    """The site, with the replicas' configuration (``state = "postgres"``), their ports,
    names and the database's password in the environment compose.yaml reads."""
    ports = {name: free_port() for name in REPLICAS}
    password = secrets.token_hex(16)
    config = root / "replicas.toml"
    extra = {
        "PATCHBOX_REPLICAS_CONFIG": str(config),
        "PATCHBOX_DB_PASSWORD": password,
        "PATCHBOX_POSTGRES_IMAGE": "patchbox-postgres:test",
        "PATCHBOX_POSTGRES_BASE_IMAGE": base_image(client),
        "PATCHBOX_REPLICA_A_PORT": str(ports["replica-a"]),
        "PATCHBOX_REPLICA_B_PORT": str(ports["replica-b"]),
        "PATCHBOX_REPLICA_A_HOSTNAME": HOSTNAMES["replica-a"],
        "PATCHBOX_REPLICA_B_HOSTNAME": HOSTNAMES["replica-b"],
    }
    project = f"patchboxreplicas{os.getpid()}"
    with site(root, client, project=project, extra_env=extra) as made:
        write_service_config(config, made.repos, service=SERVICE_LINES)
        urls = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
        yield ReplicaSite(made, urls, password)


@contextmanager
def profile_up(made: ReplicaSite) -> Iterator[Services]:
    """One ``up --build`` of the profile's services (``controller`` left out), and ``down``
    with the project's volumes at the end; the compose command as pytest-docker runs it."""
    up = f"--profile {PROFILE} up --build -d postgres {' '.join(REPLICAS)}"
    down = f"--profile {PROFILE} down -v --remove-orphans -t 90"
    with get_docker_services(
        compose_command(), str(ROOT / "compose.yaml"), made.project, [up], [down]
    ) as services:
        yield services


def project_resources(client: docker.DockerClient, project: str) -> dict[str, list[Any]]:
    """What the daemon holds of a compose project: containers, networks, volumes."""
    label = f"com.docker.compose.project={project}"
    return {
        "containers": client.containers.list(all=True, filters={"label": label}),
        "networks": client.networks.list(filters={"label": label}),
        "volumes": client.volumes.list(filters={"label": label}),
    }


def logs(made: ReplicaSite) -> str:
    """The profile's logs, for a failure's message."""
    done = subprocess.run(
        [
            *compose_command().split(),
            "-f",
            str(ROOT / "compose.yaml"),
            "-p",
            made.project,
            "--profile",
            PROFILE,
            "logs",
            "--no-color",
            "--tail",
            "60",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        env={**os.environ, **made.site.env},
    )
    return done.stdout[-6000:] + done.stderr[-2000:]
