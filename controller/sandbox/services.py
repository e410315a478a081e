"""A job's services: containers beside its sandbox (a database, a cache) on an internal
network of the job's own.

The network (:func:`controller.sandbox.egress.internal_network`) has no route out and no
address of the host; its members are the job's sandbox and its services, each service
reached by its name. A service is hardened as a sandbox is where its software allows: never
root, every capability dropped but those declared and allowed, no new privileges, a
read-only root with tmpfs folders for its data, memory, CPU and pids limits, no name
resolution beyond the network's own names. It is ready when its ``ready`` command, run in
its container, succeeds; until then a service that exits, or that is not ready in time, is
:class:`controller.errors.ServiceNotReadyError` with its log's tail.
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass
from typing import TypedDict

import docker
import docker.errors
from docker.models.containers import Container
from docker.types import EndpointConfig, LogConfig, Ulimit

from controller.config.services import ServiceSpec
from controller.errors import ServiceNotReadyError
from controller.sandbox.docker import RUNSC_THREADS_IDLE, RUNSC_THREADS_PER_PROCESS
from controller.sandbox.dockerargs import NO_DNS, NO_DNS_OPTIONS
from controller.sandbox.labels import KIND

READY_POLL = 0.25
"""Seconds between two runs of a ``ready`` command."""
LOG_TAIL_LINES = 30


class ServiceConfig(TypedDict):
    """The keyword arguments of ``containers.create`` for a service."""

    image: str
    entrypoint: list[str] | None
    command: list[str] | None
    name: str
    hostname: str
    user: str
    environment: dict[str, str]
    labels: dict[str, str]
    network: str
    networking_config: dict[str, EndpointConfig]
    dns: list[str]
    dns_opt: list[str]
    cap_drop: list[str]
    cap_add: list[str]
    security_opt: list[str]
    read_only: bool
    tmpfs: dict[str, str]
    mem_limit: str
    memswap_limit: str
    nano_cpus: int
    pids_limit: int
    ulimits: list[Ulimit]
    log_config: LogConfig
    init: bool
    runtime: str
    detach: bool


@dataclass(frozen=True)
class ServiceImage:
    """A service's image as the job found or built it."""

    ref: str
    image_id: str
    user: str
    """The user it runs as: the service's ``user``, else its image's."""
    built: bool = False
    """Made from the service's ``build`` (its entrypoint is then its ``command``)."""


@dataclass
class ServiceState:
    """One service container of a job, as its evidence keeps it."""

    name: str
    image: str
    image_id: str
    ready_seconds: float | None = None
    """Seconds from its start to a successful ``ready``; None: it never was ready."""
    exit: str = "running"
    """What it was when it was removed: ``running``, ``exited N``, ``oom``, ``not ready``."""
    log_tail: str = ""
    """Its log's last lines when it failed."""


def image_user(client: docker.DockerClient, ref: str) -> str:
    """The user ``ref``'s image runs as (``""``: root)."""
    config = client.images.get(ref).attrs.get("Config") or {}
    return str(config.get("User") or "")


def is_root(user: str) -> bool:
    return user.split(":", 1)[0] in {"", "root", "0"}


def service_config(  # noqa: PLR0913 - keyword-only settings
    client: docker.DockerClient,
    *,
    name: str,
    container_name: str,
    spec: ServiceSpec,
    image: ServiceImage,
    network: str,
    labels: dict[str, str],
    runtime: str,
    docker_runtime: str,
) -> ServiceConfig:
    """The keyword arguments of ``containers.create`` for service ``name`` (pure but for the
    endpoint's API version)."""
    lim = spec.limits
    tmpfs_opts = f"rw,noexec,nosuid,nodev,mode=1777,size={lim.tmpfs_mb}m"
    pids = lim.pids
    if runtime == "runsc":  # gVisor's sentry threads count, as a sandbox's do
        pids = RUNSC_THREADS_IDLE + RUNSC_THREADS_PER_PROCESS * lim.pids
    return {
        "image": image.image_id,
        # a built image's entrypoint is the agent's: its command replaces it
        "entrypoint": list(spec.command) if image.built and spec.command else None,
        "command": list(spec.command) if not image.built and spec.command else None,
        "name": container_name,
        "hostname": name,
        "user": image.user,
        "environment": dict(spec.env),
        "labels": {**labels, KIND: "service", "dev.patchbox.service": name},
        "network": network,
        "networking_config": {network: client.api.create_endpoint_config(aliases=[name])},
        "dns": list(NO_DNS),
        "dns_opt": list(NO_DNS_OPTIONS),
        "cap_drop": ["ALL"],
        "cap_add": list(spec.cap_add),
        "security_opt": ["no-new-privileges:true"],
        "read_only": True,
        "tmpfs": dict.fromkeys(["/tmp", *spec.tmpfs], tmpfs_opts),  # noqa: S108 - its own
        "mem_limit": f"{lim.memory_mb}m",
        "memswap_limit": f"{lim.memory_mb}m",
        "nano_cpus": int(lim.cpus * 1e9),
        "pids_limit": pids,
        "ulimits": [Ulimit(name="core", soft=0, hard=0)],
        "log_config": LogConfig(
            type=LogConfig.types.JSON, config={"max-size": "1m", "max-file": "1"}
        ),
        "init": True,
        "runtime": docker_runtime,
        "detach": True,
    }


class RunningService:
    """One started service container; :meth:`close` removes it and says how it was."""

    def __init__(
        self, client: docker.DockerClient, container: Container, state: ServiceState
    ) -> None:
        self._client = client
        self.container = container
        self.state = state
        self._closed = False

    def wait_ready(self, spec: ServiceSpec, stop: threading.Event | None = None) -> None:
        """Returns once ``spec.ready.argv`` succeeds in the container; ``SERVICE_NOT_READY``
        (with the log's tail) when the container ends first or the time is up."""
        started = time.monotonic()
        deadline = started + spec.ready.timeout_seconds
        last = ""
        while True:
            status, code, oom = self._status()
            if status not in {"running", "created"}:
                why = "was killed for memory (OOM)" if oom else f"exited with code {code}"
                self._fail(f"service {self.state.name} {why} before it was ready")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                more = f"; its ready command last said: {last[-300:]}" if last.strip() else ""
                self._fail(
                    f"service {self.state.name} was not ready within "
                    f"{spec.ready.timeout_seconds:g} s{more}"
                )
            if stop is not None and stop.is_set():
                self._fail(f"service {self.state.name}: cancelled before it was ready")
            ok, last = self._ready_once(spec.ready.argv, remaining)
            if ok:
                self.state.ready_seconds = round(time.monotonic() - started, 3)
                return
            time.sleep(READY_POLL)

    def _ready_once(self, argv: list[str], bound: float) -> tuple[bool, str]:
        """Runs ``argv`` once in the container, waiting at most ``bound`` seconds."""
        box: dict[str, tuple[bool, str]] = {}

        def run() -> None:
            try:
                result = self.container.exec_run(list(argv))
                out = result.output if isinstance(result.output, bytes) else b""
                box["r"] = (result.exit_code == 0, out.decode("utf-8", "replace"))
            except docker.errors.APIError as exc:
                box["r"] = (False, str(exc.explanation or exc))

        thread = threading.Thread(target=run, name="service-ready", daemon=True)
        thread.start()
        thread.join(max(0.1, bound))
        return box.get("r", (False, "the ready command did not end in time"))

    def _status(self) -> tuple[str, int, bool]:
        try:
            self.container.reload()
        except docker.errors.NotFound:
            return "removed", -1, False
        state = self.container.attrs.get("State") or {}
        return (
            str(state.get("Status") or ""),
            int(state.get("ExitCode") or 0),
            bool(state.get("OOMKilled")),
        )

    def log_tail(self) -> str:
        with contextlib.suppress(docker.errors.APIError):
            data = self.container.logs(stdout=True, stderr=True, tail=LOG_TAIL_LINES)
            if isinstance(data, bytes):
                return data.decode("utf-8", "replace")[-4000:]
        return ""

    def _fail(self, message: str) -> None:
        tail = self.log_tail()
        self.state.exit = "not ready"
        self.state.log_tail = tail
        text = message + (f"\nlast lines of its log:\n{tail.rstrip()}" if tail.strip() else "")
        raise ServiceNotReadyError(text)

    def close(self) -> ServiceState:
        """Removes the container; its state says how it was (``exited N``, ``oom``)."""
        if self._closed:
            return self.state
        self._closed = True
        status, code, oom = self._status()
        if self.state.exit != "not ready":
            if oom:
                self.state.exit = "oom"
            elif status == "exited":
                self.state.exit = f"exited {code}"
                self.state.log_tail = self.state.log_tail or self.log_tail()
        with contextlib.suppress(docker.errors.NotFound):
            self.container.remove(force=True, v=True)
        return self.state


def start_service(
    client: docker.DockerClient, config: ServiceConfig, *, name: str, image: ServiceImage
) -> RunningService:
    """Creates and starts service ``name`` from ``config`` (:func:`service_config`), not
    waiting for it to be ready; ``SERVICE_NOT_READY`` when Docker refuses it, with nothing
    left."""
    state = ServiceState(name=name, image=image.ref, image_id=image.image_id)
    try:
        container = client.containers.create(**config)
    except docker.errors.APIError as exc:
        state.exit = "not ready"
        msg = f"service {name} could not be created: {(exc.explanation or str(exc))[:500]}"
        raise ServiceNotReadyError(msg) from exc
    running = RunningService(client, container, state)
    try:
        container.start()
    except docker.errors.APIError as exc:
        state.exit = "not ready"
        running.close()
        msg = f"service {name} could not start: {(exc.explanation or str(exc))[:500]}"
        raise ServiceNotReadyError(msg) from exc
    return running
