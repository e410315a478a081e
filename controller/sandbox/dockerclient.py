"""Connecting to the Docker daemon (local socket or ``DOCKER_HOST``)."""

from __future__ import annotations

import docker
import docker.errors

from controller.errors import NotReadyError


def connect(timeout: float = 120.0) -> docker.DockerClient:
    """A client for the daemon named by the environment; NotReadyError if it cannot answer."""
    try:
        client = docker.from_env(timeout=int(timeout))
        client.ping()
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
