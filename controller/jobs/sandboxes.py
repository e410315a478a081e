"""How one job's sandboxes are made: their spec (the image, the runtime, the task's limits),
the job's egress proxy when a check declares ``egress`` (the spec then on its network), and
the project environment's image with what its setup may reach."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import docker

from controller.config.checks import check_egress
from controller.config.environment import EnvironmentSpec
from controller.config.network import EgressRule, setup_rules
from controller.config.task import CheckSpec, TaskSpec
from controller.errors import EgressUnavailableError
from controller.jobs.records import BuiltStep, EnvironmentRecord, JobRecord, requests_of
from controller.jobs.request import JobRequest
from controller.jobs.services import JobServices
from controller.repo.baseline import Baseline
from controller.sandbox.base import SandboxSpec
from controller.sandbox.egress import start_proxy
from controller.sandbox.envbuild import EnvironmentBuilder, SetupEgress
from controller.sandbox.image import ImageBuilder
from controller.sandbox.labels import ControllerIdentity
from controller.sandbox.netgate import NetworkGate
from controller.sandbox.prepare import Prepared
from controller.sandbox.spares import SparePool


@dataclass
class JobSandboxes:
    """The makings of one job's sandboxes; :attr:`gate` is the job's proxy once started."""

    client: docker.DockerClient
    request: JobRequest
    record: JobRecord
    identity: ControllerIdentity
    progress: Callable[[str], None]
    gate: NetworkGate | None = None
    _image_ids: dict[str, str] = field(default_factory=dict)

    def spec(self, limits_from: TaskSpec, *, default_image: bool = True) -> SandboxSpec:
        image = ""
        if default_image:
            info = ImageBuilder(self.client, self.progress).ensure()
            image, self._image_ids[info.tag] = info.tag, info.image_id
        runtime = self.record.runtime
        return SandboxSpec(
            image=image,
            job_id=self.record.job_id,
            runtime="runsc" if runtime == "runsc" else "runc",
            limits=limits_from.limits,
            protected=tuple(self.request.config.protected),
        )

    def image_id(self, tag: str) -> str:
        """The id of the image ``tag`` (known once made or found, else asked of Docker)."""
        if tag not in self._image_ids:
            self._image_ids[tag] = self.client.images.get(tag).id or ""
        return self._image_ids[tag]

    def spare_pool(self) -> SparePool | None:
        """The operator's spare sandboxes, for a job with no network (a spare has none)."""
        config = self.request.config
        if not config.spare_sandboxes or self.gate is not None:
            return None
        return SparePool(
            self.client, max_spares=config.spare_sandboxes, idle_seconds=config.spare_idle_seconds
        )

    def networked(
        self,
        task: TaskSpec,
        checks: Mapping[str, CheckSpec],
        environment: EnvironmentSpec | None,
        stop: threading.Event,
    ) -> SandboxSpec:
        """The job's sandbox spec on its network: the proxy's (checks with ``egress``), the
        services' (an environment with services), or none. What is started is in
        :attr:`gate`, also when this raises."""
        spec = self.with_egress(
            self.spec(task, default_image=environment is None),
            check_egress(checks, self.request.config.network),
        )
        return self.with_services(spec, environment, checks, stop)

    def with_egress(
        self, spec: SandboxSpec, rules: dict[str, tuple[EgressRule, ...]]
    ) -> SandboxSpec:
        """With checks that declare ``egress``: the job's proxy, started, and ``spec`` on its
        network (the proxy allows nothing until a check runs). Without: ``spec`` as it is,
        no network at all."""
        if not rules:
            return spec
        network = self.request.config.network
        docker_runtime = self._networked_runtime(spec, "a check declares egress")
        self.progress("starting the egress proxy")
        job_id = self.record.job_id
        proxy = start_proxy(
            self.client,
            self.progress,
            name=f"patchbox-egress-{job_id}",
            labels=self.identity.labels(job_id, "egress"),
            outside=network.outside,
        )
        self.gate = NetworkGate(proxy, rules)
        self.record.diagnostics["egress"] = {
            cid: [r.text() for r in checked] for cid, checked in rules.items()
        }
        return spec.model_copy(
            update={
                "network": proxy.network,
                "docker_runtime": docker_runtime,
                "run_env": proxy.environment(),
            }
        )

    def _networked_runtime(self, spec: SandboxSpec, why: str) -> str | None:
        """The Docker runtime of a sandbox on a network: None (its own) under runc; under
        gVisor the host configuration's ``network.runsc_runtime``, which must be
        registered (``EGRESS_UNAVAILABLE``)."""
        if spec.runtime != "runsc":
            return None
        docker_runtime = self.request.config.network.runsc_runtime
        runtimes = self.client.info().get("Runtimes") or {}
        if docker_runtime not in runtimes:
            msg = (
                f"{why} and the job runs under gVisor, but the Docker runtime "
                f"{docker_runtime!r} (gVisor with a network, network.runsc_runtime) is not "
                "registered with the daemon"
            )
            raise EgressUnavailableError(msg)
        return docker_runtime

    def with_services(
        self,
        spec: SandboxSpec,
        environment: EnvironmentSpec | None,
        checks: Mapping[str, CheckSpec],
        stop: threading.Event,
    ) -> SandboxSpec:
        """With an environment that declares services: the job's services network, made,
        and ``spec`` on it too (the services start when a check needs them). Without:
        ``spec`` as it is."""
        if environment is None or not environment.services:
            return spec
        docker_runtime = self._networked_runtime(spec, "the environment declares services")
        services = JobServices(
            self.client,
            record=self.record,
            environment=environment,
            checks=checks,
            labels=self.identity.labels(self.record.job_id, "service"),
            runtime=spec.runtime,
            docker_runtime=docker_runtime or spec.runtime,
            builder=lambda: EnvironmentBuilder(
                self.client,
                self.progress,
                self.request.config.ca_bundle,
                self.setup_egress(environment),
            ),
            progress=self.progress,
            stop=stop,
        )
        if self.gate is None:
            self.gate = NetworkGate(None, {}, services)
        else:
            self.gate.services = services
        network = services.create_network()
        if spec.network is None:
            return spec.model_copy(update={"network": network, "docker_runtime": docker_runtime})
        return spec.model_copy(update={"networks": (network,)})

    def setup_egress(self, environment: EnvironmentSpec) -> SetupEgress:
        """What the environment's setup steps may reach (its ``egress``, else the host
        configuration's ``network.setup_default``) and the name and labels of their proxy."""
        network = self.request.config.network
        job_id = self.record.job_id
        return SetupEgress(
            setup_rules(environment.egress, network),
            name=f"patchbox-setup-{job_id}",
            labels=self.identity.labels(job_id, "egress"),
            outside=network.outside,
        )

    def environment(
        self, environment: EnvironmentSpec, baseline: Baseline, cancel: threading.Event
    ) -> EnvironmentRecord:
        """The environment's image, built if missing, as the record keeps it."""
        egress = self.setup_egress(environment)
        built = EnvironmentBuilder(
            self.client, self.progress, self.request.config.ca_bundle, egress
        ).ensure(environment, baseline, cancel=cancel)
        return EnvironmentRecord(
            tag=built.tag,
            key=built.key,
            base=built.base,
            built=built.built,
            seconds=round(built.seconds, 3),
            steps=[BuiltStep(name=s["name"], seconds=s["seconds"]) for s in built.steps],
            egress=[r.text() for r in egress.rules],
            network=requests_of(built.network),
        )


def note_prepared(record: JobRecord, prepared: Prepared, seconds: float) -> None:
    """What the record keeps of a prepared sandbox: its baseline, where that came from, the
    time it took."""
    record.baseline = prepared.baseline
    record.timings_ms["prepare"] = round(seconds * 1000)
    if "environment" in prepared.timings_ms:
        record.timings_ms["environment"] = prepared.timings_ms["environment"]
    record.diagnostics["baseline_source"] = prepared.source
