"""The egress proxy on the real daemon: real squid, a real internal network, real clients.

The scenario: an "outside" network of the test's own with a subnet outside every inward
range, a small HTTP server on it (``files.example.test``, also ``example.test``), the proxy
started on it, and client containers from the sandbox image on the proxy's internal
network, under runc and under gVisor (``runsc-egress``: runsc with ``--network=host``, so
the sandbox's socket calls reach its own network namespace).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import docker
import docker.errors
import pytest

from controller.config.network import EgressRule, parse_rule
from controller.sandbox.egress import (
    PROXY_PORT,
    Connection,
    EgressProxy,
    parse_log_line,
)
from controller.sandbox.labels import KIND, OWNER, OWNER_VALUE
from tests.support.egress import (
    CLIENT,
    FILES,
    INWARD_HOSTS,
    MB,
    NOT_ALLOWED_TEXT,
    RULE,
    SERVER_PORT,
    Outside,
    labels_for,
    remove,
)

pytestmark = pytest.mark.docker


@pytest.fixture
def proxy(
    docker_client: docker.DockerClient, proxy_tag: str, outside: Outside
) -> Iterator[EgressProxy]:
    started = EgressProxy.start(
        docker_client,
        name=f"pb-egress-test-{uuid.uuid4().hex[:8]}",
        labels=labels_for("test-egress"),
        image=proxy_tag,
        outside=outside.name,
        extra_hosts=INWARD_HOSTS,
    )
    try:
        yield started
    finally:
        started.close()


def _client(
    client: docker.DockerClient,
    image: str,
    proxy: EgressProxy,
    runtime: str,
    probes: list[list[Any]],
    *,
    parallel: bool = False,
    network: str | None = None,
    environment: dict[str, str] | None = None,
) -> list[dict[str, Any]]:
    """Runs the probes in one client container on the proxy's network; their results."""
    container = client.containers.create(
        image,
        entrypoint=[
            "python3",
            "-I",
            "-S",
            "-c",
            CLIENT,
            json.dumps(probes),
            *(["parallel"] if parallel else []),
        ],
        network_mode=network or proxy.network,
        environment=environment or proxy.environment(),
        user="10001:10001",
        cap_drop=["ALL"],
        security_opt=["no-new-privileges"],
        read_only=True,
        runtime=runtime,
        labels=labels_for("test-egress-client"),
        detach=True,
    )
    try:
        container.start()
        status = container.wait(timeout=180)
        out = container.logs(stdout=True, stderr=False).decode()
        err = container.logs(stdout=False, stderr=True).decode()
        assert status["StatusCode"] == 0, err[-2000:]
        results: list[dict[str, Any]] = json.loads(out.strip().splitlines()[-1])
        return results
    finally:
        remove(container)


def _url(host: str, port: int = SERVER_PORT, path: str = "/big") -> str:
    return f"http://{host}:{port}{path}"


def _logged(proxy: EgressProxy, count: int) -> list[Connection]:
    """The connections logged since the last call, once there are ``count`` (a tunnel is
    logged when it closes, a moment after the client saw it end)."""
    seen: list[Connection] = []
    deadline = time.monotonic() + 10.0
    while len(seen) < count and time.monotonic() < deadline:
        seen += proxy.connections()
        if len(seen) < count:
            time.sleep(0.1)
    return seen


def _find(connections: list[Connection], host: str, port: int) -> list[Connection]:
    return [c for c in connections if c.host == host and c.port == port]


# -- 1. allowed pair passes; every other pair is refused; each request is logged ----------


def test_allowed_pair_passes_and_others_are_refused(
    docker_client: docker.DockerClient,
    sandbox_image: str,
    proxy: EgressProxy,
    outside: Outside,
    client_runtime: str,
) -> None:
    proxy.allow([RULE])
    get_ok, tunnel_ok, other_port, other_name, by_address, bare = _client(
        docker_client,
        sandbox_image,
        proxy,
        client_runtime,
        [
            ["get", _url(FILES)],
            ["tunnel", FILES, SERVER_PORT],
            ["get", _url(FILES, 8001)],
            ["get", _url("other.example.test")],
            ["get", _url(outside.server_address)],
            ["tunnel", FILES, 8001],
        ],
    )
    assert (get_ok["status"], get_ok["length"]) == (200, MB)
    assert tunnel_ok["status"] == 200
    assert tunnel_ok["inner"].endswith("200 OK")
    assert tunnel_ok["length"] == MB
    assert other_port["status"] == 403
    assert f"{FILES}:8001 {NOT_ALLOWED_TEXT}" in other_port["body"]
    assert other_name["status"] == 403
    assert f"other.example.test:8000 {NOT_ALLOWED_TEXT}" in other_name["body"]
    assert by_address["status"] == 403
    assert bare["status"] == 403

    seen = _logged(proxy, 6)
    passed = _find(seen, FILES, SERVER_PORT)
    assert len(passed) == 2, seen
    for conn in passed:
        assert (conn.allowed, conn.reason, conn.status) == (True, "", 200)
        assert conn.address == outside.server_address
        assert conn.bytes_in >= MB
        assert conn.bytes_out > 0
        assert conn.end >= conn.start > 0
    refused = [
        *_find(seen, FILES, 8001),
        *_find(seen, "other.example.test", SERVER_PORT),
        *_find(seen, outside.server_address, SERVER_PORT),
    ]
    assert len(refused) == 4, seen
    for conn in refused:
        assert (conn.allowed, conn.reason, conn.status, conn.address) == (
            False,
            "not_allowed",
            403,
            None,
        )
    assert len(seen) == 6, seen
    assert proxy.connections() == []  # only what is new since the last call
    assert passed[0].as_dict()["host"] == FILES


def test_wildcard_rule_matches_subdomains_only(
    docker_client: docker.DockerClient,
    sandbox_image: str,
    proxy: EgressProxy,
    client_runtime: str,
) -> None:
    proxy.allow([EgressRule("*.example.test", SERVER_PORT)])
    sub, bare = _client(
        docker_client,
        sandbox_image,
        proxy,
        client_runtime,
        [["get", _url(FILES, path="/hello")], ["get", _url("example.test", path="/hello")]],
    )
    assert sub["status"] == 200
    assert bare["status"] == 403
    assert [c.reason for c in _logged(proxy, 2)] == ["", "not_allowed"]


# -- 2. the list is replaced per check, without restarting squid ---------------------------


def test_allow_replaces_the_list_at_once(
    docker_client: docker.DockerClient,
    sandbox_image: str,
    proxy: EgressProxy,
    client_runtime: str,
) -> None:
    probe = [["get", _url(FILES, path="/hello")]]
    proxy.allow([RULE])
    assert _client(docker_client, sandbox_image, proxy, client_runtime, probe)[0]["status"] == 200
    proxy.allow([])
    refused = _client(docker_client, sandbox_image, proxy, client_runtime, probe)[0]
    assert refused["status"] == 403
    assert NOT_ALLOWED_TEXT in refused["body"]
    proxy.allow([RULE])
    assert _client(docker_client, sandbox_image, proxy, client_runtime, probe)[0]["status"] == 200
    assert [(c.allowed, c.reason) for c in _logged(proxy, 3)] == [
        (True, ""),
        (False, "not_allowed"),
        (True, ""),
    ]


# -- 3. an allowed name that resolves inward is refused -----------------------------------


def test_allowed_names_resolving_inward_are_refused(
    docker_client: docker.DockerClient,
    sandbox_image: str,
    proxy: EgressProxy,
    client_runtime: str,
) -> None:
    pairs = [("localhost", PROXY_PORT), ("localhost", 80)]
    pairs += [(host, 80) for host in INWARD_HOSTS]
    proxy.allow([*(EgressRule(h, p) for h, p in pairs), EgressRule("nowhere.invalid", 80)])
    probes: list[list[Any]] = [["get", _url(h, p, "/")] for h, p in pairs]
    probes += [["tunnel", "meta.example.test", 80], ["get", _url("nowhere.invalid", 80, "/")]]
    results = _client(docker_client, sandbox_image, proxy, client_runtime, probes)
    for (host, _port), result in zip(pairs, results, strict=False):
        assert result["status"] == 403, (host, result)
        assert f"{host} resolves to a loopback" in result["body"]
    assert results[len(pairs)]["status"] == 403  # the tunnel
    assert results[-1]["status"] == 503
    seen = _logged(proxy, len(probes))
    assert [(c.host, c.port, c.allowed, c.reason, c.address) for c in seen] == [
        *((h, p, False, "inward", None) for h, p in pairs),
        ("meta.example.test", 80, False, "inward", None),
        ("nowhere.invalid", 80, False, "unresolved", None),
    ]


# -- 4. a program that ignores the proxy variables reaches nothing ------------------------


def test_bypassing_the_proxy_reaches_nothing(
    docker_client: docker.DockerClient,
    sandbox_image: str,
    proxy: EgressProxy,
    outside: Outside,
    client_runtime: str,
) -> None:
    proxy.allow([RULE])
    internal = docker_client.networks.get(proxy.network)
    gateways = [str(c["Gateway"]) for c in internal.attrs["IPAM"]["Config"] if c.get("Gateway")]
    assert gateways
    targets: list[tuple[str, int]] = [(outside.server_address, SERVER_PORT)]
    targets += [(proxy.address, port) for port in (22, 80, 3129, 8000)]
    targets += [(gw, port) for gw in gateways for port in (22, 80, 2375)]
    probes: list[list[Any]] = [["tcp", host, port] for host, port in targets]
    udp_targets = [("8.8.8.8", 53), (outside.server_address, 53), *((gw, 53) for gw in gateways)]
    probes += [["udp", host, port] for host, port in udp_targets]
    probes += [["resolve", FILES], ["resolve", "example.com"]]
    probes += [
        ["get", f"http://{proxy.address}:{PROXY_PORT}/squid-internal-mgr/info"],
        ["direct", f"http://{proxy.address}:{PROXY_PORT}/squid-internal-mgr/info"],
        ["direct", _url(FILES, path="/hello")],
    ]
    results = _client(docker_client, sandbox_image, proxy, client_runtime, probes, parallel=True)
    for probe, result in zip(probes, results, strict=True):
        if probe[0] in {"tcp", "udp", "resolve"}:
            assert result["result"] in {"error", "timeout"}, (probe, result)
    manager_via_proxy, manager_direct, direct_get = results[-3:]
    assert manager_via_proxy.get("status", 403) == 403, manager_via_proxy
    assert manager_direct.get("status", 403) == 403, manager_direct
    assert direct_get.get("result") == "error", direct_get  # the name does not resolve
    # What reached squid was refused; nothing was allowed.
    assert all(not c.allowed for c in proxy.connections())


def test_proxy_serves_only_its_own_network(
    docker_client: docker.DockerClient,
    sandbox_image: str,
    proxy: EgressProxy,
    outside: Outside,
) -> None:
    """A container on the outside network that finds the proxy cannot use its list."""
    proxy.allow([RULE])
    container = docker_client.containers.get(f"{proxy.network}-proxy")
    address = container.attrs["NetworkSettings"]["Networks"][outside.name]["IPAddress"]
    url = f"http://{address}:{PROXY_PORT}"
    env = {"http_proxy": url, "https_proxy": url, "no_proxy": ""}
    (result,) = _client(
        docker_client,
        sandbox_image,
        proxy,
        "runc",
        [["get", _url(FILES, path="/hello")]],
        network=outside.name,
        environment=env,
    )
    assert result["status"] == 403
    assert [(c.allowed, c.reason) for c in _logged(proxy, 1)] == [(False, "proxy")]


# -- 5. close removes the proxy and its network, and may be called again ------------------


def test_close_removes_container_and_network(
    docker_client: docker.DockerClient, proxy_tag: str, outside: Outside
) -> None:
    name = f"pb-egress-test-{uuid.uuid4().hex[:8]}"
    proxy = EgressProxy.start(
        docker_client,
        name=name,
        labels=labels_for("test-egress"),
        image=proxy_tag,
        outside=outside.name,
    )
    try:
        assert proxy.network == name
        container = docker_client.containers.get(f"{name}-proxy")
        labels = container.labels
        assert labels[KIND] == "egress-proxy"
        assert labels[OWNER] == OWNER_VALUE
        host = container.attrs["HostConfig"]
        assert host["ReadonlyRootfs"] is True
        assert host["CapDrop"] == ["ALL"]
        assert host["SecurityOpt"] == ["no-new-privileges"]
        assert host["PidsLimit"] == 128
        assert host["Memory"] == 256 * MB
        assert container.attrs["Config"]["User"] == "13:13"
        network = docker_client.networks.get(name)
        assert network.attrs["Internal"] is True
        assert network.attrs["Labels"][KIND] == "egress-network"
        assert proxy.environment()["HTTPS_PROXY"] == f"http://{proxy.address}:{PROXY_PORT}"
    finally:
        proxy.close()
    with pytest.raises(docker.errors.NotFound):
        docker_client.containers.get(f"{name}-proxy")
    with pytest.raises(docker.errors.NotFound):
        docker_client.networks.get(name)
    proxy.close()


# -- pure parts ----------------------------------------------------------------------------


def test_rules_and_log_lines() -> None:
    assert EgressRule("*.example.com", 443).text() == "*.example.com:443"
    for text in ["Example.com:443", "a b:1", "x.com:0", "x.com:70000", ":1"]:
        with pytest.raises(ValueError, match="egress entry"):
            parse_rule(text)
    line = (
        "1796516207.693 50 GET files.example.test 80 203.0.113.80 200 146 176 TCP_MISS - 10.0.0.2"
    )
    conn = parse_log_line(line)
    assert conn is not None
    assert (conn.host, conn.port, conn.address, conn.allowed, conn.reason) == (
        "files.example.test",
        80,
        "203.0.113.80",
        True,
        "",
    )
    assert conn.end == pytest.approx(conn.start + 0.05)
    denied = parse_log_line(
        "1.0 0 GET a.test 81 - 403 1 2 TCP_DENIED ERR_PATCHBOX_NOT_ALLOWED 10.0.0.2"
    )
    assert denied is not None
    assert (denied.allowed, denied.reason) == (False, "not_allowed")
    unresolved = parse_log_line(
        "1.0 0 GET b.test 80 - 503 1 2 TCP_DENIED 503:ERR_PATCHBOX_UNRESOLVED 10.0.0.2"
    )
    assert unresolved is not None
    assert (unresolved.allowed, unresolved.reason, unresolved.status) == (False, "unresolved", 503)
    assert parse_log_line("garbage") is None
