"""A controller killed with SIGKILL leaves a sandbox and a temp folder; the next start reaps them."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from unittest import mock

import docker
import docker.errors
import pytest

from controller.paths import patchbox_home
from controller.sandbox.labels import HOME, JOB, current_identity
from controller.sandbox.reaper import reap
from controller.sandbox.spares import SPARE, SPARE_START_GRACE
from tests.support.sandbox import SandboxFactory

pytestmark = pytest.mark.docker

CRASHING_CONTROLLER = """
import sys
from controller.sandbox.dockerclient import connect
from controller.sandbox.labels import current_identity
from controller.config.limits import Limits
from controller.paths import owned_temp_dir
from controller.sandbox.base import SandboxSpec
from controller.sandbox.docker import DockerSandbox
spec = SandboxSpec(image=sys.argv[1], job_id=sys.argv[2], limits=Limits(memory_mb=512, workspace_mb=128))
box = DockerSandbox.start(connect(), spec, current_identity())
folder = owned_temp_dir("job-")
print(box.container.id, folder, flush=True)
import time
time.sleep(600)
"""


def test_reaper_removes_what_a_killed_controller_left(
    docker_client: docker.DockerClient, sandbox_image: str, make_sandbox: SandboxFactory
) -> None:
    alive = make_sandbox()  # ours, still running: must survive the reap
    job = "crash-" + str(os.getpid())
    proc = subprocess.Popen(
        [sys.executable, "-c", CRASHING_CONTROLLER, sandbox_image, job],
        stdout=subprocess.PIPE,
        text=True,
        env=os.environ.copy(),
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().split()
    assert len(line) == 2, "the child controller did not start its sandbox"
    cid, folder = line[0], Path(line[1])
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert docker_client.containers.get(cid).status == "running"
    assert folder.is_dir()

    report = reap(docker_client, patchbox_home() / "tmp")

    assert cid[:12] in report.containers
    assert folder.name in report.folders
    assert not folder.exists()
    assert docker_client.containers.list(all=True, filters={"label": f"{JOB}={job}"}) == []
    assert alive.container.id is not None
    assert docker_client.containers.get(alive.container.id).status == "running"
    assert alive.list_files().files == []
    assert report.failures == 0


def test_a_spare_being_started_is_not_taken_for_a_stopped_one(
    docker_client: docker.DockerClient, sandbox_image: str
) -> None:
    """Between its create and its start a spare is ``created``: another controller's reaper
    that lists it then leaves it to the controller starting it (it removed such spares of
    other state directories as if they had stopped)."""
    identity = current_identity()
    labels = {**identity.labels(SPARE, SPARE), HOME: "e" * 16}
    container = docker_client.containers.create(
        sandbox_image, entrypoint=["true"], network_disabled=True, labels=labels
    )
    try:
        report = reap(docker_client)
        assert (container.id or "")[:12] not in report.containers
        assert docker_client.containers.get(container.id or "").status == "created"
        old = time.time() + SPARE_START_GRACE + 1
        with mock.patch("controller.sandbox.reaper.time.time", return_value=old):
            report = reap(docker_client)
        assert (container.id or "")[:12] in report.containers  # never started: left over
    finally:
        with contextlib.suppress(docker.errors.NotFound):
            container.remove(force=True)


CRASHING_EGRESS_CONTROLLER = """
import sys, time
from controller.sandbox.dockerclient import connect
from controller.sandbox.egress import EgressProxy
from controller.sandbox.labels import current_identity
job = sys.argv[2]
proxy = EgressProxy.start(
    connect(), name=f"patchbox-egress-{job}", labels=current_identity().labels(job, "egress"),
    image=sys.argv[1],
)
print(proxy.network, flush=True)
time.sleep(600)
"""


def test_reaper_removes_the_proxy_and_network_a_killed_controller_left(
    docker_client: docker.DockerClient, proxy_tag: str
) -> None:
    job = "crash-egress-" + str(os.getpid())
    proc = subprocess.Popen(
        [sys.executable, "-c", CRASHING_EGRESS_CONTROLLER, proxy_tag, job],
        stdout=subprocess.PIPE,
        text=True,
        env=os.environ.copy(),
    )
    assert proc.stdout is not None
    network = proc.stdout.readline().strip()
    assert network, "the child controller did not start its proxy"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    [proxy] = docker_client.containers.list(filters={"label": f"{JOB}={job}"})
    assert proxy.status == "running"
    assert docker_client.networks.get(network).name == network

    report = reap(docker_client, patchbox_home() / "tmp")

    assert network in report.networks
    assert (proxy.id or "")[:12] in report.containers
    assert docker_client.containers.list(all=True, filters={"label": f"{JOB}={job}"}) == []
    with pytest.raises(docker.errors.NotFound):
        docker_client.networks.get(network)
    assert report.failures == 0
