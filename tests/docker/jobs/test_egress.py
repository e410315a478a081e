"""A job whose checks declare ``egress``, end to end on the real daemon under runc and runsc:
the job's proxy (real Squid) lets each check reach its own pairs and nothing else, in the
job's sandbox (the run before the change and the model's ``run_check``) and in the fresh
check sandbox; every request is in the check's result and the record; a failed check names
what the proxy refused; an entry the operator does not allow is refused before anything
starts; the proxy and its network are gone with the job, and a job without egress has no
network at all."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import docker
import pytest

from controller import api
from controller.config.host import HostConfig
from controller.config.network import NetworkConfig
from controller.config.task import TaskSpec
from controller.errors import PatchboxError
from controller.jobs.summary import summary_text
from controller.sandbox.base import Runtime
from controller.sandbox.labels import JOB, KIND, OWNER_FILTER
from tests.support.egress import FILES, SERVER_PORT, Outside
from tests.support.jobs import containers_of, evidence_of, make_repo
from tests.support.proxy import TcpProxy
from tests.support.registries import package_hosts

pytestmark = pytest.mark.docker

PAIR = f"{FILES}:{SERVER_PORT}"


def _fetch(host: str) -> list[str]:
    """A check that fetches /hello from ``host`` through the proxy variables."""
    code = (
        "import sys, urllib.request\n"
        f"body = urllib.request.urlopen('http://{host}:{SERVER_PORT}/hello', timeout=20).read()\n"
        "print(body.decode().strip())\n"
    )
    return ["python3", "-c", code]


RESOLVE = "import socket, sys\nprint(socket.getaddrinfo(sys.argv[1], 80)[0][4][0])\n"
"""A check that resolves a name itself (no proxy): it must not resolve in the sandbox."""


def _outside_name() -> str:
    """A name this host resolves (a package host of the base image), read at run time."""
    name = package_hosts()[0].rsplit(":", 1)[0]
    socket.getaddrinfo(name, 80)  # the host resolves it: in the sandbox it must not
    return name


def _task() -> TaskSpec:
    return TaskSpec.model_validate(
        {
            "prompt": "use the network",
            "checks": {
                "fetch": {"argv": _fetch(FILES), "egress": [PAIR], "timeout_seconds": 60},
                "elsewhere": {
                    "argv": _fetch("example.test"),
                    "egress": [PAIR],
                    "required": False,
                    "timeout_seconds": 60,
                },
                "offline": {"argv": _fetch(FILES), "required": False, "timeout_seconds": 60},
                "resolve": {
                    "argv": ["python3", "-c", RESOLVE, _outside_name()],
                    "egress": [PAIR],
                    "required": False,
                    "timeout_seconds": 60,
                },
            },
            "limits": {"memory_mb": 512, "workspace_mb": 64, "tmp_mb": 32, "wall_seconds": 300},
        }
    )


def _config(outside: Outside, allow: list[str] | None = None) -> HostConfig:
    return HostConfig(
        spare_sandboxes=0,
        network=NetworkConfig(allow=[PAIR] if allow is None else allow, outside=outside.name),
    )


def _networks_of(client: docker.DockerClient, job_id: str) -> list[str]:
    found = client.networks.list(filters={"label": [OWNER_FILTER, f"{JOB}={job_id}"]})
    return [n.name or "" for n in found]


@pytest.mark.usefixtures("sandbox_image", "proxy_tag")
def test_each_check_reaches_its_own_pairs_and_every_request_is_recorded(
    docker_client: docker.DockerClient, tmp_path: Path, runtime: Runtime, outside: Outside
) -> None:
    repo = make_repo(tmp_path / "repo")
    with api.open_session(
        repo, task=_task(), config=_config(outside), client=docker_client, runtime=runtime
    ) as session:
        job_id = session.job_id
        # the run before the change reached the server through the proxy
        before = {c.id: c for c in session.record.baseline_checks}
        assert before["fetch"].status == "passed", before["fetch"].output_tail
        assert before["fetch"].network is not None
        [seen] = before["fetch"].network
        assert (seen.host, seen.port, seen.allowed, seen.status) == (FILES, SERVER_PORT, True, 200)
        assert seen.address == outside.server_address
        assert seen.bytes_in > 0
        assert seen.end >= seen.start

        fetched = session.call("run_check", {"checkId": "fetch"})
        body: dict[str, Any] = fetched.result or {}
        assert body["status"] == "passed", body
        assert "hello from the outside" in body["output"]
        assert [(r["host"], r["allowed"]) for r in body["network"]] == [(FILES, True)]

        # another name, with the same egress: refused, and the verdict names it
        other = session.call("run_check", {"checkId": "elsewhere"}).result or {}
        assert other["status"] == "failed"
        assert (
            "the proxy refused example.test:8000 (not in the check's egress)" in (other["verdict"])
        )
        assert [(r["host"], r["allowed"], r["reason"]) for r in other["network"]] == [
            ("example.test", False, "not_allowed")
        ]
        # a name that resolves on the host does not resolve in the sandbox: no DNS query
        # leaves the job's network
        resolved = session.call("run_check", {"checkId": "resolve"}).result or {}
        assert resolved["status"] == "failed", resolved
        assert "gaierror" in resolved["output"], resolved["output"]
        # a check without egress gets nothing through, though the sandbox has the proxy
        offline = session.call("run_check", {"checkId": "offline"}).result or {}
        assert offline["status"] == "failed"
        assert [(r["host"], r["allowed"]) for r in offline["network"]] == [(FILES, False)]

        assert _networks_of(docker_client, job_id)
        edit = {"path": "app.py", "oldText": '"hello "', "newText": '"Hello "'}
        assert session.call("replace_text", edit).ok
        proposal = session.propose("done")
    record = session.record
    assert proposal.status == "awaiting_review", (proposal.status, record.error)
    after = {c.id: c for c in record.checks}
    assert after["fetch"].status == "passed"
    assert [(r.host, r.allowed) for r in after["fetch"].network or []] == [(FILES, True)]
    assert [(r.host, r.reason) for r in after["elsewhere"].network or []] == [
        ("example.test", "not_allowed")
    ]
    text = summary_text(record)
    assert "network (through the job's proxy):" in text
    assert f"check fetch: {FILES}:{SERVER_PORT} [{outside.server_address}] allowed" in text
    # the evidence holds each request, and nothing of the proxy's variables
    evidence = evidence_of(job_id)
    [fetch] = [c for c in evidence["checks"] if c["id"] == "fetch"]
    assert [(r["host"], r["port"], r["allowed"]) for r in fetch["network"]] == [
        (FILES, SERVER_PORT, True)
    ]
    assert "HTTP_PROXY" not in json.dumps(evidence)
    # the proxy, its network and the sandboxes are gone with the job
    assert containers_of(docker_client, job_id) == []
    assert _networks_of(docker_client, job_id) == []


@pytest.mark.usefixtures("sandbox_image", "proxy_tag")
def test_a_cancelled_job_leaves_no_proxy_and_no_network(
    docker_client: docker.DockerClient, tmp_path: Path, outside: Outside
) -> None:
    repo = make_repo(tmp_path / "repo")
    task = TaskSpec.model_validate(
        {
            "prompt": "x",
            "checks": {"fetch": {"argv": _fetch(FILES), "egress": [PAIR]}},
            "baseline_checks": False,
        }
    )
    session = api.open_session(repo, task=task, config=_config(outside), client=docker_client)
    job_id = session.job_id
    try:
        kinds = sorted(
            c.labels.get(KIND, "")
            for c in docker_client.containers.list(filters={"label": f"{JOB}={job_id}"})
        )
        assert kinds == ["egress-proxy", "sandbox"]
        assert _networks_of(docker_client, job_id)
        session.cancel()
    finally:
        session.close()
    assert session.record.state == "cancelled"
    assert containers_of(docker_client, job_id) == []
    assert _networks_of(docker_client, job_id) == []


@pytest.mark.usefixtures("sandbox_image", "proxy_tag")
def test_a_failed_required_check_names_what_the_proxy_refused(
    docker_client: docker.DockerClient, tmp_path: Path, outside: Outside
) -> None:
    repo = make_repo(tmp_path / "repo")
    task = TaskSpec.model_validate(
        {
            "prompt": "x",
            "checks": {"tests": {"argv": _fetch("example.test"), "egress": [PAIR]}},
            "baseline_checks": False,
        }
    )
    with api.open_session(
        repo, task=task, config=_config(outside), client=docker_client
    ) as session:
        edit = {"path": "app.py", "oldText": '"hello "', "newText": '"Hello "'}
        assert session.call("replace_text", edit).ok
        session.propose("done")
    record = session.record
    assert record.state == "failed"
    assert record.error is not None
    assert record.error.code == "CHECK_FAILED"
    assert "the proxy refused: tests tried example.test:8000 (not in the check's egress)" in (
        record.error.message
    )


@pytest.mark.usefixtures("sandbox_image")
def test_an_entry_the_operator_does_not_allow_is_refused_before_anything_starts(
    docker_client: docker.DockerClient, tmp_path: Path, outside: Outside
) -> None:
    repo = make_repo(tmp_path / "repo")
    before = {c.id for c in docker_client.containers.list(all=True, sparse=True)}
    with pytest.raises(PatchboxError) as raised:
        api.open_session(
            repo,
            task=_task(),
            config=_config(outside, allow=["*.example.org:443"]),
            client=docker_client,
        )
    assert raised.value.code == "EGRESS_NOT_ALLOWED"
    assert "checks.fetch.egress declares what the host configuration's network.allow does " in (
        raised.value.message
    )
    assert PAIR in raised.value.message
    after = {c.id for c in docker_client.containers.list(all=True, sparse=True)}
    assert after <= before


@pytest.mark.usefixtures("sandbox_image")
def test_a_job_without_egress_has_no_network_at_all(
    docker_client: docker.DockerClient, tmp_path: Path
) -> None:
    repo = make_repo(tmp_path / "repo")
    task = TaskSpec.model_validate(
        {
            "prompt": "x",
            "checks": {"offline": {"argv": _fetch(FILES), "timeout_seconds": 30}},
            "baseline_checks": False,
        }
    )
    with api.open_session(
        repo, task=task, config=HostConfig(spare_sandboxes=0), client=docker_client
    ) as session:
        [box] = [
            docker_client.containers.get(c) for c in containers_of(docker_client, session.job_id)
        ]
        assert box.attrs["HostConfig"]["NetworkMode"] == "none"
        assert "HTTP_PROXY" not in " ".join(box.attrs["Config"]["Env"] or [])
        offline = session.call("run_check", {"checkId": "offline"}).result or {}
        assert offline["status"] == "failed"
        assert "network" not in offline
        assert _networks_of(docker_client, session.job_id) == []


@pytest.mark.usefixtures("sandbox_image", "proxy_tag")
def test_egress_through_a_remote_daemon(
    tmp_path: Path, runtime: Runtime, outside: Outside, docker_client: docker.DockerClient
) -> None:
    """The same job against a daemon reached over TCP (``DOCKER_HOST``, the daemon's own
    socket behind a loopback port: no host path means anything to it): the proxy starts,
    the check reaches its pair through it and nothing else, every request is recorded, and
    the proxy and its network are gone with the job."""
    remote = TcpProxy()
    client = docker.DockerClient(base_url=f"tcp://127.0.0.1:{remote.port}", version="auto")
    repo = make_repo(tmp_path / "repo")
    try:
        with api.open_session(
            repo, task=_task(), config=_config(outside), client=client, runtime=runtime
        ) as session:
            job_id = session.job_id
            fetched = session.call("run_check", {"checkId": "fetch"}).result or {}
            assert fetched["status"] == "passed", fetched
            assert [(r["host"], r["allowed"]) for r in fetched["network"]] == [(FILES, True)]
            other = session.call("run_check", {"checkId": "elsewhere"}).result or {}
            assert [(r["host"], r["reason"]) for r in other["network"]] == [
                ("example.test", "not_allowed")
            ]
            session.cancel()
    finally:
        client.close()
        remote.close()
    assert remote.connections > 0  # the job spoke to the daemon over TCP only
    assert session.record.diagnostics["baseline_source"] == "channel"
    assert containers_of(docker_client, job_id) == []
    assert _networks_of(docker_client, job_id) == []
