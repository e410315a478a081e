"""How one job's sandboxes are made: their spec (the image, the runtime, the task's limits),
the job's egress proxy when a check declares ``egress`` (the spec then on its network), and
the project environment's image with what its setup may reach."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

import docker

from controller.config.environment import EnvironmentSpec
from controller.config.network import EgressRule, setup_rules
from controller.config.task import TaskSpec
from controller.errors import EgressUnavailableError
from controller.jobs.records import BuiltStep, EnvironmentRecord, JobRecord, requests_of
from controller.jobs.request import JobRequest
from controller.repo.baseline import Baseline
from controller.sandbox.base import SandboxSpec
from controller.sandbox.egress import start_proxy
from controller.sandbox.envbuild import EnvironmentBuilder, SetupEgress
from controller.sandbox.image import ImageBuilder
from controller.sandbox.labels import ControllerIdentity
from controller.sandbox.netgate import NetworkGate


@dataclass
class JobSandboxes:
    """The makings of one job's sandboxes; :attr:`gate` is the job's proxy once started."""

    client: docker.DockerClient
    request: JobRequest
    record: JobRecord
    identity: ControllerIdentity
    progress: Callable[[str], None]
    gate: NetworkGate | None = None

    def spec(self, limits_from: TaskSpec, *, default_image: bool = True) -> SandboxSpec:
        image = ImageBuilder(self.client, self.progress).ensure().tag if default_image else ""
        runtime = self.record.runtime
        return SandboxSpec(
            image=image,
            job_id=self.record.job_id,
            runtime="runsc" if runtime == "runsc" else "runc",
            limits=limits_from.limits,
            protected=tuple(self.request.config.protected),
        )

    def with_egress(
        self, spec: SandboxSpec, rules: dict[str, tuple[EgressRule, ...]]
    ) -> SandboxSpec:
        """With checks that declare ``egress``: the job's proxy, started, and ``spec`` on its
        network (the proxy allows nothing until a check runs). Without: ``spec`` as it is,
        no network at all."""
        if not rules:
            return spec
        network = self.request.config.network
        docker_runtime = None
        if spec.runtime == "runsc":
            docker_runtime = network.runsc_runtime
            runtimes = self.client.info().get("Runtimes") or {}
            if docker_runtime not in runtimes:
                msg = (
                    f"a check declares egress and the job runs under gVisor, but the Docker "
                    f"runtime {docker_runtime!r} (gVisor with a network, network.runsc_runtime) "
                    "is not registered with the daemon"
                )
                raise EgressUnavailableError(msg)
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
