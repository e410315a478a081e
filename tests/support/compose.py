"""The service as an operator runs it: the top-level ``compose.yaml``, brought up by
pytest-docker, with the controller's image built from the top-level ``Dockerfile``.

``PATCHBOX_COMPOSE`` names the compose command (``docker compose`` or ``docker-compose``);
without it, the v2 plugin is used where it exists, else ``docker-compose``.

The image is built from a context holding the Dockerfile and a ``.wheels/`` folder made by
``pip wheel`` on this host (the host trusts the package index's certificate; a build step
may not), on the sandbox image's base: the locally made one where it exists.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import docker
import docker.errors

from controller.sandbox.image import DEFAULT_BASE, LOCAL_BASE_REPO, recipe_hash
from tests.support.paths import REPO_ROOT
from tests.support.service import TOKENS

ROOT = REPO_ROOT
HOSTNAME = "patchbox-controller-test"
CONTAINER_UID = 10002


def compose_command() -> str:
    named = os.environ.get("PATCHBOX_COMPOSE")
    if named:
        return named
    plugin = subprocess.run(
        ["docker", "compose", "version"], capture_output=True, check=False, timeout=30
    )
    return "docker compose" if plugin.returncode == 0 else "docker-compose"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class Site:
    """What the compose file is given: folders on this host and the environment."""

    root: Path
    repos: Path
    mounts: Path
    port: int
    project: str
    env: dict[str, str]

    @property
    def config(self) -> Path:
        return self.root / "service.toml"

    def use_runtime(self, runtime: str) -> None:
        """Rewrites the configuration for ``runtime`` and restarts the controller on it."""
        write_service_config(self.config, self.repos, runtime)
        self.compose("restart", "-t", "90", "controller")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def repo_root(self, tenant: str) -> Path:
        return self.repos / tenant

    def compose(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        argv = [
            *compose_command().split(),
            "-f",
            str(ROOT / "compose.yaml"),
            "-p",
            self.project,
            *args,
        ]
        return subprocess.run(
            argv,
            capture_output=True,
            text=True,
            check=True,
            timeout=timeout,
            env={**os.environ, **self.env},
        )

    def hand_over(self, path: Path) -> None:
        """Makes ``path`` (a folder tree) the controller user's, as an operator would."""
        if os.geteuid() != 0:
            return
        for where, dirs, files in os.walk(path):
            os.chown(where, CONTAINER_UID, CONTAINER_UID)
            for name in dirs + files:
                os.chown(Path(where) / name, CONTAINER_UID, CONTAINER_UID, follow_symlinks=False)


def base_image(client: docker.DockerClient) -> str:
    local = f"{LOCAL_BASE_REPO}:{recipe_hash()}"
    try:
        client.images.get(local)
    except docker.errors.ImageNotFound:
        return os.environ.get("PATCHBOX_TEST_BASE") or DEFAULT_BASE
    return local


def write_service_config(
    path: Path, repos: Path, runtime: str = "runc", service: Sequence[str] = ("workers = 2",)
) -> None:
    """The two tenants' configuration; ``service``: the ``[service]`` table's own lines."""
    tenants = {
        "alpha": {"max_concurrent_jobs": 2, "max_queued_jobs": 10, "allow_apply": True},
        "beta": {"max_concurrent_jobs": 1, "max_queued_jobs": 1, "allow_apply": False},
    }
    lines = ["spare_sandboxes = 0", f'runtime = "{runtime}"', "[service]", *service]
    for name, limits in tenants.items():
        token = hashlib.sha256(TOKENS[name].encode()).hexdigest()
        lines += [
            "[[service.tenants]]",
            f'name = "{name}"',
            f'token_sha256 = "{token}"',
            f'repo_roots = ["{repos / name}"]',
            f"max_concurrent_jobs = {limits['max_concurrent_jobs']}",
            f"max_queued_jobs = {limits['max_queued_jobs']}",
            f"allow_apply = {str(limits['allow_apply']).lower()}",
        ]
    path.write_text("\n".join(lines) + "\n")
    path.chmod(0o644)


@contextmanager
def site(
    root: Path,
    client: docker.DockerClient,
    project: str | None = None,
    extra_env: dict[str, str] | None = None,
) -> Iterator[Site]:
    """Prepares the build context, the folders and the environment ``compose.yaml`` reads;
    the environment is this process's while the site is in use (pytest-docker's commands
    read it). ``project``: the compose project's name (default one per test process);
    ``extra_env``: more of the variables ``compose.yaml`` reads."""
    context = root / "context"
    context.mkdir()
    shutil.copy2(ROOT / "Dockerfile", context / "Dockerfile")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--wheel-dir",
            str(context / ".wheels"),
            str(ROOT),
        ],
        check=True,
        timeout=900,
    )
    repos = root / "repos"
    mounts = root / "mounts"
    for folder in (repos / "alpha", repos / "beta", mounts):
        folder.mkdir(parents=True)
    mounts.chmod(0o1777)
    config = root / "service.toml"
    write_service_config(config, repos)
    uid, gid = (CONTAINER_UID, CONTAINER_UID) if os.geteuid() == 0 else (os.getuid(), os.getgid())
    port = free_port()
    env = {
        "PATCHBOX_BUILD_CONTEXT": str(context),
        "PATCHBOX_CONTROLLER_IMAGE": "patchbox-controller:test",
        "BASE_IMAGE": base_image(client),
        "PATCHBOX_CONTROLLER_HOSTNAME": HOSTNAME,
        "PATCHBOX_UID": str(uid),
        "PATCHBOX_GID": str(gid),
        "DOCKER_GID": str(Path("/var/run/docker.sock").stat().st_gid),
        "PATCHBOX_MOUNT_DIR": str(mounts),
        "PATCHBOX_REPOS": str(repos),
        "PATCHBOX_SERVICE_CONFIG": str(config),
        "PATCHBOX_PORT": str(port),
        **(extra_env or {}),
    }
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    made = Site(root, repos, mounts, port, project or f"patchboxtest{os.getpid()}", env)
    made.hand_over(repos)
    try:
        yield made
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
