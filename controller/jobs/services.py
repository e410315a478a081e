"""One job's services (:mod:`controller.config.services`): their network, made before the
job's first sandbox, their images, found or built once, and their containers, started
before the first check that needs them and ready before it runs.

The tools' sandbox and the fresh check sandbox each get their own services: :meth:`renew`
removes the first sandbox's, so nothing its checks wrote into a database reaches the
required run. Every container is recorded in the job's ``services``; :meth:`close` removes
what is left and the network (the reaper does, after a crash: all carry the job's labels).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Literal

import docker
import docker.errors
from docker.models.networks import Network

from controller.config.checks import needed_services
from controller.config.environment import EnvironmentSpec
from controller.config.services import ServiceSpec
from controller.config.task import CheckSpec
from controller.errors import PatchboxError, ServiceNotReadyError
from controller.jobs.records import JobRecord, ServiceRecord
from controller.sandbox.egress import internal_network, remove_network
from controller.sandbox.envbuild import EnvironmentBuilder
from controller.sandbox.labels import KIND
from controller.sandbox.services import (
    RunningService,
    ServiceImage,
    ServiceState,
    image_user,
    is_root,
    service_config,
    start_service,
)


class JobServices:
    """The services of one job (see the module docstring)."""

    def __init__(  # noqa: PLR0913 - the job's parts, keyword-only
        self,
        client: docker.DockerClient,
        *,
        record: JobRecord,
        environment: EnvironmentSpec,
        checks: Mapping[str, CheckSpec],
        labels: dict[str, str],
        runtime: str,
        docker_runtime: str,
        builder: Callable[[], EnvironmentBuilder],
        progress: Callable[[str], None],
        stop: threading.Event,
    ) -> None:
        self._client = client
        self._record = record
        self._specs: dict[str, ServiceSpec] = dict(environment.services)
        self._environment = environment
        self._checks = dict(checks)
        self._labels = labels
        self._runtime = runtime
        self._docker_runtime = docker_runtime
        self._builder = builder
        self._progress = progress
        self._stop = stop
        self._images: dict[str, ServiceImage] = {}
        self._running: dict[str, RunningService] = {}
        self._slots: dict[int, int] = {}
        """A running service's place in the record's ``services``."""
        self._sandbox: Literal["loop", "checks"] = "loop"
        self._lock = threading.Lock()
        self._network: Network | None = None
        self.network_name = f"patchbox-services-{record.job_id}"

    def create_network(self) -> str:
        """The job's services network, made now (the sandboxes join it when they start)."""
        try:
            self._network = internal_network(
                self._client, self.network_name, {**self._labels, KIND: "services-network"}
            )
        except docker.errors.APIError as exc:
            msg = f"the services network could not be made: {exc.explanation or exc}"
            raise ServiceNotReadyError(msg) from exc
        return self.network_name

    def ensure(self, check_id: str) -> None:
        """Starts each service ``check_id`` needs that does not run yet for this sandbox and
        waits until it is ready; ``SERVICE_NOT_READY`` when one is not."""
        check = self._checks.get(check_id)
        if check is None:
            return
        with self._lock:
            for name in needed_services(check, self._environment):
                if name not in self._running:
                    self._start(name)

    def renew(self) -> None:
        """The fresh check sandbox's services from now on: the tools' sandbox's are removed
        (and recorded)."""
        with self._lock:
            self._close_running()
            self._sandbox = "checks"

    def close(self) -> None:
        """Removes every service container and the network; never raises."""
        with self._lock:
            self._close_running()
            if self._network is not None:
                remove_network(self._network)
                self._network = None

    def _start(self, name: str) -> None:
        spec = self._specs[name]
        try:
            image = self._image(name, spec)
        except ServiceNotReadyError:
            self._keep_failed(name, ServiceImage(spec.image or "(build)", "", ""))
            raise
        self._progress(f"service {name}: starting ({image.ref})")
        suffix = "" if self._sandbox == "loop" else "-checks"
        try:
            config = service_config(
                self._client,
                name=name,
                container_name=f"patchbox-{self._record.job_id}-{name}{suffix}",
                spec=spec,
                image=image,
                network=self.network_name,
                labels=self._labels,
                runtime=self._runtime,
                docker_runtime=self._docker_runtime,
            )
            running = start_service(self._client, config, name=name, image=image)
        except ServiceNotReadyError:
            self._keep_failed(name, image)
            raise
        self._running[name] = running
        self._note(running.state, running)  # in the record while it runs
        try:
            running.wait_ready(spec, self._stop)
        except ServiceNotReadyError:
            self._running.pop(name, None)
            self._keep(running)
            raise
        self._note(running.state, running)
        ready = running.state.ready_seconds or 0.0
        self._progress(f"service {name}: ready in {ready:.1f} s")

    def _image(self, name: str, spec: ServiceSpec) -> ServiceImage:
        found = self._images.get(name)
        if found is not None:
            return found
        image = self._built(name, spec) if spec.build is not None else self._pulled(name, spec)
        self._images[name] = image
        return image

    def _built(self, name: str, spec: ServiceSpec) -> ServiceImage:
        build = spec.build
        assert build is not None  # noqa: S101 - the caller's branch
        recipe = EnvironmentSpec(
            base=build.base,
            setup=build.setup,
            egress=self._environment.egress,
            setup_timeout_seconds=self._environment.setup_timeout_seconds,
            setup_memory_mb=self._environment.setup_memory_mb,
        )
        baseline = self._record.baseline
        if baseline is None:  # a check runs only once the baseline is made
            msg = f"service {name}: the job has no baseline yet"
            raise ServiceNotReadyError(msg)
        self._progress(f"service {name}: finding or building its image")
        try:
            made = self._builder().ensure(recipe, baseline, cancel=self._stop)
        except PatchboxError as exc:
            msg = f"service {name}: its image could not be built: {exc.message}"
            raise ServiceNotReadyError(msg[:6000]) from exc
        return ServiceImage(made.tag, made.image_id, spec.user or "", built=True)

    def _pulled(self, name: str, spec: ServiceSpec) -> ServiceImage:
        ref = spec.image or ""
        try:
            found = self._client.images.get(ref)
        except docker.errors.ImageNotFound:
            self._progress(f"service {name}: pulling {ref}")
            try:
                found = self._client.images.pull(ref)
            except docker.errors.APIError as exc:
                msg = (
                    f"service {name}: the image {ref!r} is not on this Docker host and cannot "
                    f"be pulled: {(exc.explanation or str(exc))[:300]}"
                )
                raise ServiceNotReadyError(msg) from exc
        except docker.errors.APIError as exc:
            msg = f"service {name}: the image {ref!r} cannot be inspected: {exc.explanation}"
            raise ServiceNotReadyError(msg) from exc
        user = spec.user or image_user(self._client, ref)
        if is_root(user):
            msg = (
                f"service {name}: the image {ref!r} runs as root; give the service the user "
                "its software runs as (user = ...)"
            )
            raise ServiceNotReadyError(msg)
        return ServiceImage(ref, found.id or "", user)

    def _note(self, state: ServiceState, running: RunningService | None = None) -> None:
        """``state`` as the record keeps it now: in the place of ``running``'s entry when it
        has one, else appended (and, with ``running``, its place remembered)."""
        entry = ServiceRecord(
            name=state.name,
            image=state.image,
            image_id=state.image_id,
            sandbox=self._sandbox,
            ready_seconds=state.ready_seconds,
            exit=state.exit,
            log_tail=state.log_tail,
        )
        kept = list(self._record.services)
        slot = None if running is None else self._slots.get(id(running))
        if slot is None:
            kept.append(entry)
            if running is not None:
                self._slots[id(running)] = len(kept) - 1
        else:
            kept[slot] = entry
        self._record.services = kept

    def _keep(self, running: RunningService) -> None:
        """Removes ``running``; the record keeps how it ended, in its place."""
        self._note(running.close(), running)
        self._slots.pop(id(running), None)

    def _keep_failed(self, name: str, image: ServiceImage) -> None:
        self._note(ServiceState(name, image.ref, image.image_id, exit="not ready"))

    def _close_running(self) -> None:
        running, self._running = self._running, {}
        for service in running.values():
            try:
                self._keep(service)
            except docker.errors.APIError:
                continue
