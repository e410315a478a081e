"""docs/service.md, "A model server on the host": with compose.yaml's ``extra_hosts``, a
container reaches a server on the Docker host, listening on the bridge's gateway address,
as ``host.docker.internal``; and the provider settings the docs give let the key go there
over plain http. A real container on the default bridge (the sandbox image, for its python3)
posts to a real HTTP server on the host."""

from __future__ import annotations

import ipaddress
import json
import uuid
from typing import Any

import docker
import pytest
import yaml

from controller.errors import UsageError
from controller.providers.config import ProviderConfig
from tests.support.loopback import LoopbackServer, json_reply
from tests.support.paths import REPO_ROOT

pytestmark = pytest.mark.docker

POST = """
import json, sys, urllib.request
request = urllib.request.Request(
    sys.argv[1], data=b'{"model": "m"}', method="POST",
    headers={"Authorization": "Bearer " + sys.argv[2], "Content-Type": "application/json"},
)
with urllib.request.urlopen(request, timeout=20) as answer:
    print(answer.read().decode())
"""


def extra_hosts() -> dict[str, str]:
    compose: dict[str, Any] = yaml.safe_load((REPO_ROOT / "compose.yaml").read_text())
    entries: list[str] = compose["services"]["controller"]["extra_hosts"]
    return dict(entry.split(":", 1) for entry in entries)


def bridge_gateway(client: docker.DockerClient) -> str:
    """The default bridge's address on the host (what ``host-gateway`` names by default):
    its gateway, else the first address of its IPv4 subnet, as the daemon assigns it."""
    bridge = client.networks.get("bridge")
    for config in bridge.attrs["IPAM"]["Config"]:
        if "." in config.get("Gateway", ""):
            return str(config["Gateway"])
        if "." in config.get("Subnet", ""):
            return str(next(ipaddress.ip_network(config["Subnet"]).hosts()))
    raise AssertionError(bridge.attrs["IPAM"])


def test_a_container_reaches_a_model_server_on_the_host(
    docker_client: docker.DockerClient, sandbox_image: str
) -> None:
    hosts = extra_hosts()
    assert hosts == {"host.docker.internal": "host-gateway"}
    gateway = bridge_gateway(docker_client)
    key = f"sk-{uuid.uuid4().hex}"
    with LoopbackServer(gateway) as server:
        port = server.url.rsplit(":", 1)[1]
        base_url = f"http://host.docker.internal:{port}/v1"
        settings = {"base_url": base_url, "model": "m", "api_key": key}
        with pytest.raises(UsageError, match="only over https"):
            ProviderConfig.from_mapping(settings, {})
        allowed = settings | {"allow_insecure_http_hosts": ["host.docker.internal"]}
        assert ProviderConfig.from_mapping(allowed, {}).base_url == base_url
        server.play(json_reply({"ok": True}))
        name = f"patchbox-test-gateway-{uuid.uuid4().hex[:12]}"
        try:
            output = docker_client.containers.run(
                sandbox_image,
                ["python3", "-c", POST, f"{base_url}/chat/completions", key],
                name=name,
                entrypoint=[],
                extra_hosts=hosts,
                user="65534:65534",
                stdout=True,
                stderr=True,
            )
        finally:
            try:
                docker_client.containers.get(name).remove(force=True)
            except docker.errors.NotFound:
                pass
        (request,) = server.received
    assert json.loads(output) == {"ok": True}
    assert request.path == "/v1/chat/completions"
    assert request.headers["authorization"] == f"Bearer {key}"
    assert request.headers["host"] == f"host.docker.internal:{port}"
