"""Connecting to the Docker daemon (local socket or ``DOCKER_HOST``)."""

from __future__ import annotations

import os
from typing import Any

import docker
import docker.errors
from docker.models.containers import (  # type: ignore[attr-defined]
    Container,
    _create_container_args,
)

from controller.errors import NotReadyError

_versions: dict[str, str] = {}
"""The API version each daemon (by ``DOCKER_HOST``) answered this process's first client
with: a later client of the same daemon is made without asking again (``GET /version``)."""


def connect(timeout: float = 120.0) -> docker.DockerClient:
    """A client for the daemon named by the environment; NotReadyError if it cannot answer."""
    host = os.environ.get("DOCKER_HOST", "")
    try:
        client = docker.from_env(timeout=int(timeout), version=_versions.get(host))
        client.ping()
        _versions.setdefault(host, client.api.api_version)
    except docker.errors.DockerException as exc:
        raise NotReadyError(
            "the Docker daemon is not reachable: start Docker (or set DOCKER_HOST) and make "
            "sure this user may use it"
        ) from exc
    return client


def removal_in_progress(exc: docker.errors.APIError) -> bool:
    """A forced removal refused because Docker is removing the container already (an
    auto-removed container that ended, or another remover first): gone is what was wanted."""
    return exc.status_code == 409 and "already in progress" in str(exc.explanation)


def create_container(client: docker.DockerClient, **config: Any) -> Container:
    """``client.containers.create(**config)`` without the container's inspection docker-py
    asks for after it: the id is all a new container is used by until it is started (its
    state is read when it is needed)."""
    args = _create_container_args({**config, "version": client.api.api_version})
    created = client.api.create_container(**args)
    return client.containers.prepare_model({"Id": created["Id"]})
