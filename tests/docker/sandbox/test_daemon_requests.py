"""The Docker API requests a sandbox's life sends, counted at docker-py's HTTP session: a
sandbox is created, its OOM events followed, attached, started and removed, with no
inspection between (docker-py's ``containers.create`` would add one); a second client of
the same daemon in one process does not negotiate the API version again."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import docker
import pytest
import requests

from controller.sandbox import dockerclient
from tests.support.sandbox import SandboxFactory

pytestmark = pytest.mark.docker


@contextmanager
def counting() -> Iterator[list[str]]:
    seen: list[str] = []
    original = requests.Session.send

    def send(self: requests.Session, request: Any, **kwargs: Any) -> Any:
        path = str(request.url).split("?", 1)[0]
        path = re.sub(r"^[a-z+]+://[^/]*(/v1\.\d+)?", "", path)
        seen.append(f"{request.method} " + re.sub(r"[0-9a-f]{64}", "{id}", path))
        return original(self, request, **kwargs)

    requests.Session.send = send  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        requests.Session.send = original  # type: ignore[method-assign]


def test_a_sandbox_is_not_inspected_between_create_and_start(
    docker_client: docker.DockerClient, make_sandbox: SandboxFactory
) -> None:
    del docker_client
    with counting() as seen:
        box = make_sandbox()
        box.close()
    assert seen == [
        "POST /containers/create",
        "GET /events",
        "POST /containers/{id}/attach",
        "POST /containers/{id}/start",
        "DELETE /containers/{id}",
    ]


def test_a_second_client_reuses_the_negotiated_version(
    docker_client: docker.DockerClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    del docker_client
    monkeypatch.setattr(dockerclient, "_versions", {})
    with counting() as seen:
        first = dockerclient.connect(timeout=30)
        second = dockerclient.connect(timeout=30)
    assert seen == ["GET /version", "GET /_ping", "GET /_ping"]
    assert first.api.api_version == second.api.api_version
    first.close()
    second.close()
