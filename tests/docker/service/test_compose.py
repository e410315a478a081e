"""The service in its own container, as an operator runs it: ``compose.yaml`` brought up by
pytest-docker (the compose command is configurable: Debian ships Docker Compose v1), driven
over HTTP with httpx by two tenants. The controller runs non-root with the Docker socket's
group and starts its sandboxes as siblings, each with every hardening a host controller
gives it; a restart of the service mid-job loses no job."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import docker.errors
import httpx
import pytest

from controller.sandbox.labels import HOST, JOB, OWNER_FILTER
from tests.support.compose import HOSTNAME, Site, compose_command, site
from tests.support.jobs import APP, APP_AFTER, make_repo
from tests.support.paths import REPO_ROOT
from tests.support.service import (
    CALLS,
    LIMITS,
    SLOW_CALLS,
    TASK,
    TOKENS,
    events,
    slow_task,
    wait_status,
)

pytestmark = pytest.mark.docker

ROOT = REPO_ROOT
SLOW_TASK = slow_task(60)


# -- pytest-docker's fixtures, pointed at the project's compose.yaml ---------------------


@pytest.fixture(scope="session")
def compose_site(
    tmp_path_factory: pytest.TempPathFactory, docker_client: docker.DockerClient, sandbox_image: str
) -> Iterator[Site]:
    # sandbox_image: the controller finds the sandbox image this run built (same sources,
    # same tag) instead of building its own.
    assert sandbox_image
    with site(tmp_path_factory.mktemp("compose"), docker_client) as made:
        yield made
    left = docker_client.containers.list(
        all=True, filters={"label": [OWNER_FILTER, f"{HOST}={HOSTNAME}"]}
    )
    names = [c.name for c in left]
    for container in left:
        container.remove(force=True)
    assert not names, f"sandboxes of the compose service left behind: {names}"


@pytest.fixture(scope="session")
def docker_compose_command() -> str:
    return compose_command()


@pytest.fixture(scope="session")
def docker_compose_file() -> str:
    return str(ROOT / "compose.yaml")


@pytest.fixture(scope="session")
def docker_compose_project_name(compose_site: Site) -> str:
    return compose_site.project


@pytest.fixture(scope="session")
def docker_setup(compose_site: Site) -> list[str]:
    assert compose_site.env
    return ["up --build -d"]


@pytest.fixture(scope="session")
def docker_cleanup() -> list[str]:
    return ["down -v --remove-orphans -t 90"]


def healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture(scope="session")
def service(docker_services: Any, compose_site: Site) -> Site:
    assert docker_services.port_for("controller", 8765) == compose_site.port
    docker_services.wait_until_responsive(
        check=lambda: healthy(compose_site.url), timeout=180, pause=0.5
    )
    return compose_site


def client_of(service: Site, tenant: str | None) -> httpx.Client:
    headers = {"Authorization": f"Bearer {TOKENS[tenant]}"} if tenant else {}
    return httpx.Client(base_url=service.url, headers=headers, timeout=30)


def new_repo(service: Site, tenant: str) -> Path:
    repo = make_repo(service.repo_root(tenant) / f"repo-{time.monotonic_ns()}")
    service.hand_over(repo)
    return repo


def submit(client: httpx.Client, repo: Path, task: dict[str, Any], calls: dict[str, Any]) -> str:
    response = client.post("/v1/jobs", json={"repo": str(repo), "task": task, "calls": calls})
    assert response.status_code == 202, response.text
    return str(response.json()["job_id"])


def controller_container(client: docker.DockerClient, service: Site) -> Any:
    found = client.containers.list(
        filters={"label": f"com.docker.compose.project={service.project}"}
    )
    assert len(found) == 1, [c.name for c in found]
    return found[0]


def sandboxes_of(client: docker.DockerClient, job_id: str) -> list[Any]:
    return client.containers.list(all=True, filters={"label": f"{JOB}={job_id}"})


def running_sandbox(client: docker.DockerClient, job_id: str) -> Any:
    """A running sandbox of the job, inspected (None while there is none: the job moves
    from its first sandbox to a fresh one for its checks)."""
    for box in client.containers.list(filters={"label": f"{JOB}={job_id}", "status": "running"}):
        try:
            box.reload()
        except docker.errors.NotFound:
            continue
        if box.status == "running":
            return box
    return None


def wait_for(predicate: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(0.25)
    pytest.fail(f"timed out waiting for {what}")


def error_code(response: httpx.Response) -> str:
    return str(response.json()["error"]["code"])


# -- the tests ---------------------------------------------------------------------------


def test_the_controller_runs_non_root_with_the_socket_group_and_is_healthy(
    service: Site, docker_client: docker.DockerClient
) -> None:
    container = controller_container(docker_client, service)
    config, host = container.attrs["Config"], container.attrs["HostConfig"]
    uid = service.env["PATCHBOX_UID"]
    assert config["User"] == f"{uid}:{service.env['PATCHBOX_GID']}"
    assert uid != "0"
    assert host["GroupAdd"] == [service.env["DOCKER_GID"]]
    assert host["ExtraHosts"] == ["host.docker.internal:host-gateway"]
    assert host["ReadonlyRootfs"] is True
    assert host["CapDrop"] == ["ALL"]
    assert host["Privileged"] is False
    assert "no-new-privileges:true" in host["SecurityOpt"]
    assert config["Hostname"] == HOSTNAME
    assert config["Healthcheck"]["Test"][0] == "CMD"

    def health() -> bool:
        container.reload()
        return bool(container.attrs["State"]["Health"]["Status"] == "healthy")

    wait_for(health, 90, "the image's healthcheck")
    whoami = container.exec_run(["id", "-u"], user="")
    assert whoami.output.decode().strip() == uid
    assert client_of(service, None).get("/healthz").json() == {"status": "ok"}


def test_tenants_are_isolated_and_quotas_hold(service: Site) -> None:
    alpha, beta = client_of(service, "alpha"), client_of(service, "beta")
    nobody = client_of(service, None)
    assert nobody.get("/v1/jobs").status_code == 401
    assert error_code(nobody.get("/v1/jobs")) == "UNAUTHORIZED"
    job_id = submit(beta, new_repo(service, "beta"), SLOW_TASK, SLOW_CALLS)
    for path in ("", "/diff", "/evidence", "/events"):
        response = alpha.get(f"/v1/jobs/{job_id}{path}")
        assert (response.status_code, error_code(response)) == (404, "NOT_FOUND"), path
    for action in ("cancel", "apply", "revert", "discard"):
        response = alpha.post(f"/v1/jobs/{job_id}/{action}")
        assert (response.status_code, error_code(response)) == (404, "NOT_FOUND"), action
    assert job_id not in alpha.get("/v1/jobs").text
    # beta may hold one job queued or running: the second is refused, naming the limit
    refused = beta.post(
        "/v1/jobs",
        json={"repo": str(new_repo(service, "beta")), "task": TASK, "calls": CALLS},
    )
    assert (refused.status_code, error_code(refused)) == (429, "QUOTA_EXCEEDED")
    assert "max_queued_jobs = 1" in refused.json()["error"]["message"]
    # alpha cannot reach beta's repositories
    outside = alpha.post(
        "/v1/jobs",
        json={"repo": str(service.repo_root("beta")), "task": TASK, "calls": CALLS},
    )
    assert (outside.status_code, error_code(outside)) == (403, "REPO_NOT_ALLOWED")
    assert beta.post(f"/v1/jobs/{job_id}/cancel").status_code in {200, 202}
    assert wait_status(beta, job_id, {"cancelled"})["status"] == "cancelled"


def test_a_job_streams_events_and_applies_and_reverts(service: Site) -> None:
    alpha = client_of(service, "alpha")
    repo = new_repo(service, "alpha")
    job_id = submit(alpha, repo, TASK, CALLS)
    seen = events(alpha, job_id)
    states = [e["data"]["state"] for e in seen if e["type"] == "state"]
    assert states[0] == "queued"
    assert states[-1] == "awaiting_review", seen
    assert [e["data"]["name"] for e in seen if e["type"] == "tool_call"] == ["replace_text"]
    assert [e["data"]["status"] for e in seen if e["type"] == "check"] == ["passed"]
    assert [e["id"] for e in seen] == list(range(1, len(seen) + 1))
    assert events(alpha, job_id, last=2) == seen[2:]
    diff = alpha.get(f"/v1/jobs/{job_id}/diff").text
    assert '-    return "hello " + name' in diff
    assert '+    return "Hello " + name' in diff
    applied = alpha.post(f"/v1/jobs/{job_id}/apply")
    assert applied.status_code == 200, applied.text
    assert (repo / "app.py").read_text() == APP_AFTER
    reverted = alpha.post(f"/v1/jobs/{job_id}/revert")
    assert reverted.status_code == 200, reverted.text
    assert (repo / "app.py").read_text() == APP


def test_the_sandboxes_it_starts_keep_every_hardening(
    service: Site, docker_client: docker.DockerClient, runtime: str
) -> None:
    if runtime != "runc":
        service.use_runtime(runtime)
        wait_for(lambda: healthy(service.url), 120, "the restarted service")
    try:
        check_hardening(service, docker_client, runtime)
    finally:
        if runtime != "runc":
            service.use_runtime("runc")
            wait_for(lambda: healthy(service.url), 120, "the restarted service")


def check_hardening(service: Site, docker_client: docker.DockerClient, runtime: str) -> None:
    alpha = client_of(service, "alpha")
    job_id = submit(alpha, new_repo(service, "alpha"), SLOW_TASK, SLOW_CALLS)
    wait_status(alpha, job_id, {"running", "checking"}, timeout=120)
    box = wait_for(lambda: running_sandbox(docker_client, job_id), 60, "the job's sandbox")
    config, host = box.attrs["Config"], box.attrs["HostConfig"]
    assert config["User"] not in {"", "0", "root"}
    assert config["Labels"][HOST] == HOSTNAME
    assert host["Runtime"] == runtime
    assert host["NetworkMode"] == "none"
    assert host["ReadonlyRootfs"] is True
    assert host["CapDrop"] == ["ALL"]
    assert not host.get("CapAdd")
    assert host["Privileged"] is False
    assert any(opt.startswith("no-new-privileges") for opt in host["SecurityOpt"])
    assert host["Memory"] == LIMITS["memory_mb"] << 20
    assert (host["PidsLimit"] or 0) > 0
    assert set(host["Tmpfs"]) >= {"/workspace", "/tmp"}
    mounts = box.attrs["Mounts"]
    assert all(m["Type"] in {"bind", "tmpfs"} for m in mounts), mounts
    for mount in (m for m in mounts if m["Type"] == "bind"):
        assert mount["RW"] is False
        assert mount["Source"].startswith(str(service.mounts)), mount
    assert box.attrs["Config"].get("Env") is None or not any(
        "TOKEN" in e or "PATCHBOX_HOME" in e for e in box.attrs["Config"]["Env"]
    )
    cancelled = alpha.post(f"/v1/jobs/{job_id}/cancel")
    assert cancelled.status_code == 202
    assert wait_status(alpha, job_id, {"cancelled"})["status"] == "cancelled"
    wait_for(lambda: not sandboxes_of(docker_client, job_id), 30, "the sandbox's removal")


def test_a_killed_service_loses_no_job(service: Site, docker_client: docker.DockerClient) -> None:
    alpha = client_of(service, "alpha")
    repo = new_repo(service, "alpha")
    running = submit(alpha, repo, SLOW_TASK, SLOW_CALLS)
    queued = submit(alpha, repo, TASK, CALLS)  # same repository: waits for the first
    wait_status(alpha, running, {"running", "checking"}, timeout=120)
    wait_for(lambda: sandboxes_of(docker_client, running), 60, "the running job's sandbox")
    assert alpha.get(f"/v1/jobs/{queued}").json()["status"] == "queued"
    service.compose("kill", "-s", "SIGKILL", "controller")
    # the agent ends its container once the killed controller's attach stream is gone
    wait_for(
        lambda: all(c.status != "running" for c in sandboxes_of(docker_client, running)),
        30,
        "the orphaned sandbox to stop",
    )
    service.compose("up", "-d", "controller")
    wait_for(lambda: healthy(service.url), 120, "the restarted service")
    view = wait_status(alpha, running, {"failed"}, timeout=60)
    assert view["status"] == "failed"
    assert view["error"]["code"] == "INTERRUPTED"
    assert wait_status(alpha, queued, {"awaiting_review"})["status"] == "awaiting_review"
    wait_for(lambda: not sandboxes_of(docker_client, running), 30, "the settled sandbox")
    assert not sandboxes_of(docker_client, queued)


def test_a_stopped_service_drains_and_runs_its_queue_after(
    service: Site, docker_client: docker.DockerClient
) -> None:
    alpha = client_of(service, "alpha")
    repo = new_repo(service, "alpha")
    running = submit(alpha, repo, SLOW_TASK, SLOW_CALLS)
    queued = submit(alpha, repo, TASK, CALLS)
    wait_status(alpha, running, {"running", "checking"}, timeout=120)
    wait_for(lambda: sandboxes_of(docker_client, running), 60, "the running job's sandbox")
    started = time.monotonic()
    service.compose("stop", "-t", "90", "controller")
    assert time.monotonic() - started < 75  # drained well within its grace period
    assert not sandboxes_of(docker_client, running)  # removed by the drain itself
    service.compose("up", "-d", "controller")
    wait_for(lambda: healthy(service.url), 120, "the restarted service")
    assert alpha.get(f"/v1/jobs/{running}").json()["status"] == "cancelled"
    assert wait_status(alpha, queued, {"awaiting_review"})["status"] == "awaiting_review"
