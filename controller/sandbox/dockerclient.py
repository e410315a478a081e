"""Connecting to the Docker daemon (local socket or ``DOCKER_HOST``)."""

from __future__ import annotations

import os
import socket
from typing import Any

import docker
import docker.errors
from docker.models.containers import (  # type: ignore[attr-defined]
    Container,
    _create_container_args,
)

from controller.errors import NotReadyError, SandboxError

ANSWER_LIMIT = 65536
"""Bytes of the daemon's answer to a start read at most (it is a status and a short error)."""

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


def request_start(client: docker.DockerClient, container_id: str) -> socket.socket | None:
    """Sends a container's start to a daemon on a unix socket, on a connection of its own;
    the connection, to read the daemon's answer from (:func:`start_answer`). The daemon
    finishes a start it has been sent even when the sender goes away, so a process may end
    once this returns. None when the client's daemon is not on a unix socket (start the
    container the usual way)."""
    adapter = client.api.get_adapter("http+docker://localhost")
    path = getattr(adapter, "socket_path", None)
    if not isinstance(path, str) or not path:
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(float(client.api.timeout))
    request = (
        f"POST /v{client.api.api_version}/containers/{container_id}/start HTTP/1.1\r\n"
        "Host: docker\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    try:
        sock.connect(path)
        sock.sendall(request.encode("ascii"))
    except OSError as exc:
        sock.close()
        raise SandboxError(f"cannot start a spare sandbox: {exc}") from exc
    return sock


def start_answer(sock: socket.socket) -> None:
    """Reads the daemon's answer to :func:`request_start` and closes the connection;
    ``SandboxError`` with the daemon's reason when it did not start the container."""
    data = b""
    with sock:
        try:
            while len(data) < ANSWER_LIMIT and (chunk := sock.recv(4096)):
                data += chunk
        except OSError as exc:
            raise SandboxError(f"cannot start a spare sandbox: {exc}") from exc
    head, _, body = data.partition(b"\r\n\r\n")
    if head.split(b" ", 2)[1:2] in ([b"204"], [b"304"]):  # started, or running already
        return
    why = body.decode("utf-8", "replace").strip() or head.decode("ascii", "replace")
    raise SandboxError(f"cannot start a spare sandbox: {why[:500] or 'no answer'}")
