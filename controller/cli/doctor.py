"""``patchbox doctor``: is this machine ready to run sandboxes, and what to do if not."""

from __future__ import annotations

from typing import Any

import docker
import docker.errors

from controller.errors import GitError, NotReadyError
from controller.repo.git import git_version
from controller.sandbox.dockerclient import connect
from controller.sandbox.image import ImageBuilder


def _git_version() -> str | None:
    """The host git's version (run by the controller's hardened runner), None without git."""
    try:
        return git_version().removeprefix("git version ") or None
    except GitError:
        return None


def runsc_works(client: docker.DockerClient, image: str) -> tuple[bool, str]:
    """Whether a container really starts under runsc (registered is not enough)."""
    try:
        client.containers.run(
            image,
            entrypoint=["true"],
            runtime="runsc",
            network_mode="none",
            remove=True,
            labels={"io.patchbox.owner": "patchbox", "io.patchbox.kind": "probe"},
        )
    except docker.errors.DockerException as exc:
        return False, str(getattr(exc, "explanation", None) or type(exc).__name__)[:200]
    return True, "ok"


def diagnose(*, probe_runsc: bool = True) -> dict[str, Any]:
    """Facts and advice. ``ready`` is False when a job cannot run here."""
    report: dict[str, Any] = {"ready": True, "problems": [], "advice": []}
    git = _git_version()
    report["git"] = git
    if git is None:
        report["ready"] = False
        report["problems"].append("git is not installed")
        report["advice"].append("install git")
    try:
        client = connect(timeout=15)
    except NotReadyError as exc:
        report.update(ready=False, docker=None)
        report["problems"].append("docker daemon unreachable")
        report["advice"].append(exc.message)
        return report
    version = client.version()
    info = client.info()
    runtimes = sorted((info.get("Runtimes") or {}).keys())
    report["docker"] = {
        "server_version": version.get("Version"),
        "api_version": version.get("ApiVersion"),
        "cgroup_version": info.get("CgroupVersion"),
        "storage_driver": info.get("Driver"),
        "runtimes": runtimes,
        "default_runtime": info.get("DefaultRuntime"),
    }
    image = ImageBuilder(client).status()
    report["image"] = image
    if not image["ready"]:
        report["advice"].append("run 'patchbox image build' (jobs also build it on first use)")
    runsc: dict[str, Any] = {"registered": "runsc" in runtimes}
    if runsc["registered"] and probe_runsc and image["ready"]:
        runsc["works"], runsc["detail"] = runsc_works(client, str(image["tag"]))
    if not runsc["registered"]:
        runsc["advice"] = (
            "optional: install gVisor (Debian package runsc), add it to /etc/docker/daemon.json "
            'as "runtimes": {"runsc": {"path": "/usr/bin/runsc", "runtimeArgs": '
            '["--network=none"]}} and send SIGHUP to dockerd'
        )
    report["runsc"] = runsc
    return report
