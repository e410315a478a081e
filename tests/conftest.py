"""Shared fixtures. Docker tests use the real daemon and share one image build per run.

gVisor tests run wherever runsc is registered with the daemon; where it is not, they are
skipped, except under CI (``CI=true``) or ``PATCHBOX_REQUIRE_RUNSC=1``, where a missing
runtime is a failure.

``PATCHBOX_TEST_BASE=IMAGE`` builds the sandbox image on another base (any image with
python3 >= 3.9 and git), to run the Docker tests against another interpreter.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest
import structlog

from tests.support.paths import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "sandbox-image"))
# Subprocesses (``python3 -m controller``, the installed ``patchbox``) import this checkout's
# package, not whichever checkout the environment's editable install points at.
os.environ["PYTHONPATH"] = os.pathsep.join(
    p
    for p in (str(REPO_ROOT), str(REPO_ROOT / "sandbox-image"), os.environ.get("PYTHONPATH", ""))
    if p
)

from controller.config.limits import Limits
from controller.sandbox.base import Runtime, SandboxSpec
from controller.sandbox.docker import DockerSandbox
from controller.sandbox.dockerclient import connect
from controller.sandbox.image import ImageBuilder
from controller.sandbox.labels import CONTROLLER, OWNER_FILTER, current_identity, new_job_id
from controller.sandbox.local import LocalSandbox
from tests.support.harness import AgentWorkspace
from tests.support.postgres import Cluster, server_bin, start_cluster
from tests.support.postgres import required as postgres_required
from tests.support.sandbox import SandboxFactory, _require_runsc

RUNTIMES: list[Runtime] = ["runc", "runsc"]
DOCKER_FIXTURES = frozenset(
    {"docker_client", "sandbox_image", "make_sandbox", "runtime", "runsc_available"}
)
"""A test that uses any of these needs the daemon: it is marked ``docker`` on collection."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Marks every test that needs the daemon, so ``-m "not docker"`` runs without one."""
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        callspec = getattr(item, "callspec", None)
        params = callspec.params if callspec is not None else {}
        if names & DOCKER_FIXTURES or params.get("agent") == "docker":
            item.add_marker(pytest.mark.docker)


@pytest.fixture(autouse=True)
def _logging_config() -> Iterator[None]:
    """Each test leaves structlog's configuration as it found it: a test that configures the
    CLI's logging in-process (its level filter) must not hide the events a later test
    captures."""
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


@pytest.fixture(scope="session", autouse=True)
def _private_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Keeps the suite's state out of the user's data directory."""
    home = tmp_path_factory.mktemp("patchbox-home")
    old = os.environ.get("PATCHBOX_HOME")
    os.environ["PATCHBOX_HOME"] = str(home)
    yield home
    tmp = home / "tmp"
    left = sorted(p.name for p in tmp.iterdir()) if tmp.is_dir() else []
    assert not left, f"temp folders left behind: {left}"
    if old is None:
        os.environ.pop("PATCHBOX_HOME", None)
    else:
        os.environ["PATCHBOX_HOME"] = old


def _ours(labels: dict[str, str]) -> bool:
    """Made by this test run (tests that start raw containers label them with
    ``current_identity().labels(...)`` too)."""
    return labels.get(CONTROLLER) == current_identity().token


@pytest.fixture(scope="session")
def docker_client() -> Iterator[docker.DockerClient]:
    """The real daemon. At the end of the run no labelled container or volume made by this
    run may remain (other controllers' live resources on the same daemon are not ours)."""
    client = connect()
    yield client
    leftovers = [
        c
        for c in client.containers.list(all=True, filters={"label": OWNER_FILTER}, sparse=True)
        if _ours(c.attrs.get("Labels") or {})
    ]
    volumes = [
        v
        for v in client.volumes.list(filters={"label": OWNER_FILTER})
        if _ours(v.attrs.get("Labels") or {})
    ]
    networks = [
        n
        for n in client.networks.list(filters={"label": OWNER_FILTER})
        if _ours(n.attrs.get("Labels") or {})
    ]
    names = [(c.attrs.get("Names") or [c.id])[0] for c in leftovers]
    for c in leftovers:
        with contextlib.suppress(docker.errors.NotFound):
            c.remove(force=True, v=True)
    for n in networks:
        with contextlib.suppress(docker.errors.APIError):
            n.remove()
    client.close()
    assert not leftovers, f"labelled containers left behind: {names}"
    assert not volumes, f"labelled volumes left behind: {[v.name for v in volumes]}"
    assert not networks, f"labelled networks left behind: {[n.name for n in networks]}"


@pytest.fixture(scope="session")
def sandbox_image(docker_client: docker.DockerClient) -> str:
    builder = ImageBuilder(docker_client, lambda m: print(f"[image] {m}", file=sys.stderr))
    return builder.ensure(os.environ.get("PATCHBOX_TEST_BASE") or None).tag


@pytest.fixture
def client(docker_client: docker.DockerClient, sandbox_image: str) -> docker.DockerClient:
    """The daemon, once the sandbox image is built (before a test's first job)."""
    del sandbox_image
    return docker_client


@pytest.fixture(scope="session")
def runsc_available(docker_client: docker.DockerClient) -> bool:
    return "runsc" in (docker_client.info().get("Runtimes") or {})


@pytest.fixture(params=RUNTIMES)
def runtime(request: pytest.FixtureRequest, runsc_available: bool) -> Runtime:
    value: Runtime = request.param
    if value == "runsc" and not runsc_available:
        if _require_runsc():
            pytest.fail("runsc is not registered with the Docker daemon (required under CI)")
        pytest.skip("runsc is not registered with the Docker daemon")
    return value


@pytest.fixture
def make_sandbox(
    docker_client: docker.DockerClient, sandbox_image: str
) -> Iterator[SandboxFactory]:
    """Starts sandboxes (``runtime=``, ``limits=`` or limit fields); all are closed after."""
    boxes: list[DockerSandbox] = []

    def factory(
        runtime: Runtime = "runc",
        limits: Limits | None = None,
        protected: tuple[str, ...] = (),
        **fields: Any,
    ) -> DockerSandbox:
        lim = limits or Limits(**({"memory_mb": 512, "workspace_mb": 128} | fields))
        spec = SandboxSpec(
            image=sandbox_image,
            job_id=new_job_id(),
            runtime=runtime,
            limits=lim,
            protected=protected,
        )
        box = DockerSandbox.start(docker_client, spec, current_identity())
        boxes.append(box)
        return box

    yield factory
    for box in boxes:
        box.close()


@pytest.fixture(params=["local", "docker"])
def agent(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[AgentWorkspace]:
    """An empty workspace served by the agent over pipes (``local``) or in a container."""
    if request.param == "local":
        root = tmp_path / "ws"
        root.mkdir()
        (tmp_path / "outside").mkdir()
        with LocalSandbox(root, env={"PATCHBOX_REGEX_SECONDS": "2"}) as box:
            yield AgentWorkspace("local", box, root, str(tmp_path / "outside"))
        return
    make: SandboxFactory = request.getfixturevalue("make_sandbox")
    yield AgentWorkspace("docker", make(), Path("/workspace"), "/tmp/outside")


@pytest.fixture(scope="session")
def postgres_cluster() -> Iterator[Cluster]:
    """A throwaway PostgreSQL cluster on loopback for the session (tests/support/postgres.py);
    skipped without Debian's server programs, except under CI where that fails."""
    if server_bin() is None:
        if postgres_required():
            pytest.fail("PostgreSQL's server programs are not installed (required under CI)")
        pytest.skip("PostgreSQL's server programs are not installed")
    cluster = start_cluster(Path(tempfile.mkdtemp(prefix="patchbox-pg-")))
    yield cluster
    cluster.stop()
