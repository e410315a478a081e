"""``compose.yaml``'s ``replicas`` profile as an operator brings it up: PostgreSQL built on the
local base (no image is pulled) and two ``patchbox serve`` replicas on it, each with the
controller's hardening and a name of its own, sharing the state volume. Jobs sent to either
replica come from one queue: each is visible through the other, and both replicas run them.
``down -v`` leaves nothing of the project on the daemon."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest

from controller.sandbox.labels import HOST, OWNER_FILTER
from tests.support.compose_replicas import (
    HOSTNAMES,
    REPLICAS,
    ReplicaSite,
    healthy,
    logs,
    profile_up,
    project_resources,
    replica_site,
)
from tests.support.jobs import make_repo
from tests.support.service import CALLS, TASK, wait_status

pytestmark = pytest.mark.docker

SERVICE_LABEL = "com.docker.compose.service"


@pytest.fixture(scope="module")
def replicas(
    tmp_path_factory: pytest.TempPathFactory, docker_client: docker.DockerClient, sandbox_image: str
) -> Iterator[ReplicaSite]:
    # sandbox_image: the replicas find the sandbox image this run built.
    assert sandbox_image
    with replica_site(tmp_path_factory.mktemp("compose-replicas"), docker_client) as made:
        try:
            with profile_up(made):
                deadline = time.monotonic() + 180
                while not all(healthy(made.urls[name]) for name in REPLICAS):
                    if time.monotonic() > deadline:
                        pytest.fail(f"the replicas did not answer /healthz:\n{logs(made)}")
                    time.sleep(0.5)
                yield made
        finally:
            left = project_resources(docker_client, made.project)
            hosts = [f"{HOST}={h}" for h in HOSTNAMES.values()]
            boxes = [
                c
                for host in hosts
                for c in docker_client.containers.list(
                    all=True, filters={"label": [OWNER_FILTER, host]}
                )
            ]
            for box in boxes:
                box.remove(force=True)
    assert not any(left.values()), f"compose project left behind: {left}"
    assert not boxes, f"sandboxes of the replicas left behind: {[b.name for b in boxes]}"


def containers(client: docker.DockerClient, made: ReplicaSite) -> dict[str, Any]:
    found = client.containers.list(filters={"label": f"com.docker.compose.project={made.project}"})
    return {c.labels[SERVICE_LABEL]: c for c in found}


def new_repo(made: ReplicaSite, name: str) -> Path:
    repo = make_repo(made.site.repo_root("alpha") / f"{name}-{time.monotonic_ns()}")
    made.site.hand_over(repo)
    return repo


def test_the_profile_runs_postgres_and_two_hardened_replicas_on_one_state_volume(
    replicas: ReplicaSite, docker_client: docker.DockerClient
) -> None:
    running = containers(docker_client, replicas)
    assert set(running) == {"postgres", *REPLICAS}  # `controller` is not part of it
    env = replicas.site.env
    volumes = set()
    for name in REPLICAS:
        box = running[name]
        config, host = box.attrs["Config"], box.attrs["HostConfig"]
        assert config["Hostname"] == HOSTNAMES[name]
        assert config["User"] == f"{env['PATCHBOX_UID']}:{env['PATCHBOX_GID']}"
        assert host["GroupAdd"] == [env["DOCKER_GID"]]
        assert host["ReadonlyRootfs"] is True
        assert host["CapDrop"] == ["ALL"]
        assert host["Privileged"] is False
        assert "no-new-privileges:true" in host["SecurityOpt"]
        state = [m for m in box.attrs["Mounts"] if m["Destination"] == "/var/lib/patchbox"]
        assert [m["Type"] for m in state] == ["volume"]
        volumes.add(state[0]["Name"])
    assert len(volumes) == 1  # one $PATCHBOX_HOME for both
    database = running["postgres"].attrs
    assert database["Config"]["User"] == f"{env['PATCHBOX_UID']}:{env['PATCHBOX_GID']}"
    assert database["HostConfig"]["ReadonlyRootfs"] is True
    assert database["HostConfig"]["CapDrop"] == ["ALL"]
    assert database["Config"]["Image"] == "patchbox-postgres:test"
    assert not database["HostConfig"]["PortBindings"]  # the replicas' network only


def test_jobs_sent_to_either_replica_come_from_one_queue(replicas: ReplicaSite) -> None:
    a, b = (replicas.client(name, "alpha") for name in REPLICAS)
    sent: list[tuple[str, str]] = []
    for n in range(4):
        via = REPLICAS[n % 2]
        client = a if via == "replica-a" else b
        answer = client.post(
            "/v1/jobs",
            json={"repo": str(new_repo(replicas, f"r{n}")), "task": TASK, "calls": CALLS},
        )
        assert answer.status_code == 202, answer.text
        sent.append((via, str(answer.json()["job_id"])))
    for via, job_id in sent:
        other = b if via == "replica-a" else a  # each job seen through the other replica
        view = wait_status(other, job_id, {"awaiting_review", "failed", "cancelled"})
        assert view["status"] == "awaiting_review", (view, logs(replicas))
    ids = {job_id for _, job_id in sent}
    for client in (a, b):
        listed = client.get("/v1/jobs")
        assert listed.status_code == 200, listed.text
        assert ids <= {j["job_id"] for j in listed.json()["jobs"]}
    rows = replicas.sql("SELECT id, owner FROM jobs")
    owners = {job_id: owner.split(" ")[0] for job_id, owner in rows if job_id in ids}
    assert set(owners) == ids
    # one worker each: both replicas ran jobs, each job once, named by its replica's host
    assert set(owners.values()) == set(HOSTNAMES.values()), owners
