"""Fixtures of the tests on the real daemon that need more than the suite's own: the egress
proxy's image and an outside network with a file server (``tests.support.egress``)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import docker
import docker.errors
import pytest
from docker.models.containers import Container
from docker.models.networks import Network
from docker.types import EndpointConfig, IPAMConfig, IPAMPool

from controller.sandbox.image import ImageBuilder
from controller.sandbox.proxyimage import proxy_image
from tests.support.egress import (
    FILES,
    SERVER,
    SERVER_READY,
    SUBNETS,
    Outside,
    labels_for,
    remove,
)
from tests.support.sandbox import _require_runsc


@pytest.fixture(params=["runc", "runsc-egress"])
def client_runtime(request: pytest.FixtureRequest, docker_client: docker.DockerClient) -> str:
    value: str = request.param
    if value not in (docker_client.info().get("Runtimes") or {}):
        if _require_runsc():
            pytest.fail(f"{value} is not registered with the Docker daemon (required under CI)")
        pytest.skip(f"{value} is not registered with the Docker daemon")
    return value


@pytest.fixture(scope="module")
def proxy_tag(docker_client: docker.DockerClient, sandbox_image: str) -> str:
    del sandbox_image  # built first: the base it resolves is then present
    base_ref = ImageBuilder(docker_client).resolve_base(None)[0]
    return proxy_image(docker_client, base_ref)


@pytest.fixture(scope="module")
def outside(docker_client: docker.DockerClient, sandbox_image: str) -> Iterator[Outside]:
    """A non-private outside network with the file server on it."""
    network: Network | None = None
    for subnet in SUBNETS:
        try:
            network = docker_client.networks.create(
                f"pb-egress-outside-{uuid.uuid4().hex[:8]}",
                driver="bridge",
                ipam=IPAMConfig(pool_configs=[IPAMPool(subnet=subnet)]),
                labels=labels_for("test-egress-outside"),
            )
            break
        except docker.errors.APIError:  # the subnet is in use on this daemon
            continue
    assert network is not None, f"none of {SUBNETS} is free on this daemon"
    server: Container | None = None
    try:
        name = network.name or ""
        server = docker_client.containers.create(
            sandbox_image,
            entrypoint=["python3", "-I", "-S", "-c", SERVER],
            user="10001:10001",
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            network=name,
            networking_config={
                name: EndpointConfig(docker_client.api.api_version, aliases=[FILES, "example.test"])
            },
            labels=labels_for("test-egress-server"),
            detach=True,
        )
        server.start()
        ready = server.exec_run(["python3", "-c", SERVER_READY])
        assert ready.exit_code == 0, ready.output
        server.reload()
        address = server.attrs["NetworkSettings"]["Networks"][name]["IPAddress"]
        yield Outside(network, server, address)
    finally:
        remove(server, network)
