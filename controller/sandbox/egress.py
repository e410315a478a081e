"""The egress proxy: Debian's squid in its own hardened container, the only way out of a
job's internal network.

A sandbox that may reach the network runs on a per-job *internal* Docker network (no route
out, and no address of the host: the bridge has no IPv4 address of its own) whose one
other member is the proxy, also attached to an outside network. Squid passes ``CONNECT
host:port`` and plain-HTTP requests only for the pairs of the current allow list, resolves
every name itself and refuses names with an inward address (loopback, private, link-local,
metadata, multicast, unspecified), and logs each request. The allow list is replaced per
check through an external ACL helper that re-reads it on change, so squid is never
reconfigured (a reconfigure closes the listening port while it reloads).

The recipe is ``sandbox-image/proxy``; :mod:`controller.sandbox.proxyimage` builds it once
per (base image, recipe) and :class:`EgressProxy` runs it.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypedDict

import docker
import docker.errors
from docker.models.containers import Container
from docker.models.networks import Network
from docker.types import LogConfig

from controller.config.network import EgressRule
from controller.errors import SandboxError
from controller.sandbox.labels import KIND
from controller.sandbox.proxyimage import default_proxy_image

PROXY_PORT = 3128
PROXY_UID = 13
"""Debian's ``proxy`` user, which squid runs as."""

READY_SECONDS = 20.0
CTL = ["python3", "-I", "-S", "/opt/proxy/ctl.py"]

NOT_ALLOWED_PAGE = "ERR_PATCHBOX_NOT_ALLOWED"
INWARD_PAGE = "ERR_PATCHBOX_INWARD"
UNRESOLVED_PAGES = frozenset({"ERR_PATCHBOX_UNRESOLVED", "ERR_DNS_FAIL"})

_LOG_FIELDS = 12
"""``logformat patchbox`` in squid.conf: %tS %tr %rm %>rd %>rP %<a %>Hs %>st %<st %Ss
%err_code %>a."""


class RequestView(TypedDict):
    """A :class:`Connection` as a check's result carries it."""

    host: str
    port: int
    address: str | None
    allowed: bool
    reason: str
    status: int
    bytes_out: int
    bytes_in: int
    start: float
    end: float


@dataclass(frozen=True)
class Connection:
    """One request the proxy saw (a CONNECT tunnel or a plain-HTTP request)."""

    host: str
    port: int
    address: str | None
    """The address squid connected to; None if it connected nowhere."""
    allowed: bool
    reason: str
    """``""`` when allowed; else ``not_allowed`` (the pair is not in the list), ``inward``
    (the name has a loopback, private, link-local, metadata, multicast or unspecified
    address), ``unresolved`` or ``proxy`` (any other refusal or failure of the proxy)."""
    status: int
    bytes_out: int
    """Bytes the client sent (request and, for a tunnel, everything sent through it)."""
    bytes_in: int
    """Bytes the client received."""
    start: float
    end: float
    """Epoch seconds."""

    def as_dict(self) -> RequestView:
        return {
            "host": self.host,
            "port": self.port,
            "address": self.address,
            "allowed": self.allowed,
            "reason": self.reason,
            "status": self.status,
            "bytes_out": self.bytes_out,
            "bytes_in": self.bytes_in,
            "start": self.start,
            "end": self.end,
        }


def _number(text: str) -> int:
    return int(text) if text.isdigit() else 0


def _seconds(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return 0.0


def parse_log_line(line: str) -> Connection | None:
    """A :class:`Connection` from one access-log line; None for a line of another shape."""
    fields = line.split()
    if len(fields) != _LOG_FIELDS:
        return None
    start_s, took_ms, _method, host, port, address, status, sent, got, squid, err, _ = fields
    err = err.rpartition(":")[2]  # a deny_info page with its status: "503:ERR_..."
    denied = squid.startswith("TCP_DENIED")
    failed = err != "-"
    reason = ""
    if denied or failed:
        if err == NOT_ALLOWED_PAGE:
            reason = "not_allowed"
        elif err == INWARD_PAGE:
            reason = "inward"
        elif err in UNRESOLVED_PAGES:
            reason = "unresolved"
        else:
            reason = "proxy"
    start = _seconds(start_s)
    return Connection(
        host="" if host == "-" else host,
        port=_number(port),
        address=None if address == "-" else address,
        allowed=not (denied or failed),
        reason=reason,
        status=_number(status),
        bytes_out=_number(sent),
        bytes_in=_number(got),
        start=start,
        end=start + _number(took_ms) / 1000.0,
    )


def _subnets(network: Network) -> list[str]:
    network.reload()
    configs = (network.attrs.get("IPAM") or {}).get("Config") or []
    return [str(c["Subnet"]) for c in configs if c.get("Subnet")]


def internal_network(client: docker.DockerClient, name: str, labels: dict[str, str]) -> Network:
    """A new internal bridge network: no route out, and no address of the host on it."""
    return client.networks.create(
        name,
        driver="bridge",
        internal=True,
        # Without it the host's address on the bridge (the gateway) answers a container of
        # an internal network; with it the bridge has no address.
        options={"com.docker.network.bridge.inhibit_ipv4": "true"},
        labels=labels,
        check_duplicate=True,
    )


def remove_network(network: Network) -> None:
    """Removes ``network``, waiting briefly for endpoints still detaching; never raises for
    one that is already gone."""
    for _ in range(20):
        try:
            network.remove()
        except docker.errors.NotFound:
            return
        except docker.errors.APIError:
            time.sleep(0.1)  # an endpoint still detaching
            continue
        return
    with contextlib.suppress(docker.errors.NotFound):
        network.remove()


class _Required(TypedDict):
    image: str
    name: str
    labels: dict[str, str]
    network: str
    environment: dict[str, str]
    user: str
    cap_drop: list[str]
    security_opt: list[str]
    read_only: bool
    tmpfs: dict[str, str]
    mem_limit: str
    memswap_limit: str
    pids_limit: int
    nano_cpus: int
    log_config: LogConfig
    init: bool
    auto_remove: bool
    runtime: str
    detach: bool


class ProxyConfig(_Required, total=False):
    """The keyword arguments of ``containers.create`` for the proxy."""

    sysctls: dict[str, str]
    extra_hosts: dict[str, str]


def proxy_container_config(  # noqa: PLR0913 - keyword-only settings
    *,
    name: str,
    labels: dict[str, str],
    image: str,
    outside: str,
    clients: Sequence[str],
    extra_hosts: dict[str, str] | None = None,
) -> ProxyConfig:
    """The keyword arguments of ``containers.create`` for the proxy (pure)."""
    config: ProxyConfig = {
        "image": image,
        "name": f"{name}-proxy",
        "labels": {**labels, KIND: "egress-proxy"},
        "network": outside,
        "environment": {"PROXY_CLIENTS": " ".join(clients)},
        "user": f"{PROXY_UID}:{PROXY_UID}",
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges"],
        "read_only": True,
        "tmpfs": {"/run/proxy": f"rw,noexec,nosuid,nodev,size=32m,mode=0700,uid={PROXY_UID}"},
        # Squid skips every IPv6 address while the loopback has none: enabling it keeps
        # names that resolve to ::1 refused as inward (squid connects over IPv6 nowhere
        # else: neither network has IPv6).
        "sysctls": {
            "net.ipv6.conf.all.disable_ipv6": "0",
            "net.ipv6.conf.lo.disable_ipv6": "0",
        },
        "mem_limit": "256m",
        "memswap_limit": "256m",
        "pids_limit": 128,
        "nano_cpus": 1_000_000_000,
        "log_config": LogConfig(type=LogConfig.types.NONE),
        "init": False,
        "auto_remove": False,
        "runtime": "runc",
        "detach": True,
    }
    if extra_hosts:
        config["extra_hosts"] = dict(extra_hosts)
    return config


class EgressProxy:
    """A running proxy and its job's internal network; :meth:`close` removes both."""

    def __init__(
        self, client: docker.DockerClient, network: Network, container: Container, address: str
    ) -> None:
        self._client = client
        self._network_obj = network
        self._container = container
        self._offset = 0
        self._closed = False
        self.network: str = network.name or ""
        self.address = address

    @classmethod
    def start(  # noqa: PLR0913 - keyword-only settings
        cls,
        client: docker.DockerClient,
        *,
        name: str,
        labels: dict[str, str],
        image: str,
        outside: str = "bridge",
        extra_hosts: dict[str, str] | None = None,
    ) -> EgressProxy:
        """Creates the internal network ``name`` and the proxy on it and on ``outside``;
        returns once squid answers (within :data:`READY_SECONDS`)."""
        network: Network | None = None
        container: Container | None = None
        try:
            network = internal_network(client, name, {**labels, KIND: "egress-network"})
            config = proxy_container_config(
                name=name,
                labels=labels,
                image=image,
                outside=outside,
                clients=_subnets(network),
                extra_hosts=extra_hosts,
            )
            container = _create_and_start(client, network, config)
            proxy = cls(client, network, container, _address(container, name))
            proxy._wait_ready()
        except BaseException as exc:
            _remove(container, network)
            if isinstance(exc, docker.errors.APIError):
                raise SandboxError(f"egress proxy did not start: {exc.explanation}") from exc
            raise
        return proxy

    def _ctl(self, *args: str) -> tuple[int, str]:
        try:
            result = self._container.exec_run([*CTL, *args], user=f"{PROXY_UID}:{PROXY_UID}")
        except docker.errors.APIError as exc:
            raise SandboxError(f"egress proxy is not running: {exc.explanation}") from exc
        output = result.output
        text = output.decode("utf-8", "replace") if isinstance(output, bytes) else ""
        return int(result.exit_code or 0), text

    def _wait_ready(self) -> None:
        code, text = self._ctl("ready", str(READY_SECONDS))
        if code == 0:
            return
        detail = ""
        with contextlib.suppress(ValueError, AttributeError):
            detail = str(json.loads(text.strip().splitlines()[-1]).get("cache_log", ""))
        raise SandboxError(
            f"egress proxy: squid did not answer within {READY_SECONDS:.0f} s"
            + (f"; its log ends:\n{detail.strip()}" if detail.strip() else "")
        )

    def environment(self) -> dict[str, str]:
        url = f"http://{self.address}:{PROXY_PORT}"
        return {
            "HTTP_PROXY": url,
            "HTTPS_PROXY": url,
            "http_proxy": url,
            "https_proxy": url,
            "NO_PROXY": "",
            "no_proxy": "",
        }

    def allow(self, rules: Sequence[EgressRule]) -> None:
        """Replaces the allowed pairs for the next request on; an empty list denies all."""
        code, text = self._ctl("allow", *(rule.text() for rule in rules))
        if code != 0:
            raise SandboxError(f"egress proxy refused the allow list: {text.strip()[:300]}")

    def connections(self) -> list[Connection]:
        """The requests logged since the last call (a tunnel is logged when it closes)."""
        code, text = self._ctl("log", str(self._offset))
        try:
            data = json.loads(text.strip().splitlines()[-1]) if code == 0 else None
        except (ValueError, IndexError):
            data = None
        if not isinstance(data, dict):
            raise SandboxError(f"egress proxy log could not be read: {text.strip()[:300]}")
        self._offset = int(data["offset"])
        found = (parse_log_line(str(line)) for line in data["lines"])
        return [c for c in found if c is not None]

    def close(self) -> None:
        if self._closed:
            return
        _remove(self._container, self._network_obj)
        self._closed = True

    def __enter__(self) -> EgressProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def start_proxy(  # noqa: PLR0913 - keyword-only settings
    client: docker.DockerClient,
    progress: Callable[[str], None],
    *,
    name: str,
    labels: dict[str, str],
    outside: str,
    rules: Sequence[EgressRule] = (),
    image: str | None = None,
) -> EgressProxy:
    """A job's proxy from ``image`` (by default the proxy image, built once from the default
    base), started on the internal network ``name``, allowing ``rules``."""
    image = image or default_proxy_image(client, progress)
    proxy = EgressProxy.start(client, name=name, labels=labels, image=image, outside=outside)
    if rules:
        try:
            proxy.allow(rules)
        except BaseException:
            proxy.close()
            raise
    return proxy


def _create_and_start(
    client: docker.DockerClient, network: Network, config: ProxyConfig
) -> Container:
    """Creates the proxy, attaches it to the internal network and starts it. A host
    without IPv6 (``ipv6.disable=1``) refuses the IPv6 sysctls: the proxy then starts
    without them, and squid, seeing no IPv6, never connects to an IPv6 address (a name
    with only IPv6 addresses is refused as unresolved)."""
    try:
        return _start_one(client, network, config)
    except docker.errors.APIError as exc:
        if "ipv6" not in str(exc.explanation or exc).lower() or "sysctls" not in config:
            raise
    without = config.copy()
    without.pop("sysctls", None)
    return _start_one(client, network, without)


def _start_one(client: docker.DockerClient, network: Network, config: ProxyConfig) -> Container:
    container = client.containers.create(**config)
    try:
        network.connect(container)
        container.start()
    except BaseException:
        _remove(container, None)
        raise
    return container


def _address(container: Container, network: str) -> str:
    container.reload()
    networks = container.attrs.get("NetworkSettings", {}).get("Networks") or {}
    address = str((networks.get(network) or {}).get("IPAddress") or "")
    if not address:
        raise SandboxError(f"egress proxy has no address on network {network}")
    return address


def _remove(container: Container | None, network: Network | None) -> None:
    """Removes the proxy and the network; never raises for what is already gone."""
    if container is not None:
        with contextlib.suppress(docker.errors.NotFound):
            container.remove(force=True, v=True)
    if network is not None:
        remove_network(network)
