"""``patchbox doctor``: is this machine ready to run sandboxes, and what to do if not."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import docker
import docker.errors

from controller.errors import GitError, NotReadyError
from controller.paths import patchbox_home
from controller.repo.git import git_version
from controller.sandbox.dockerclient import connect
from controller.sandbox.image import ImageBuilder
from controller.sandbox.spares import SparePool


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


def _setup(config_path: Path | None) -> dict[str, Any]:
    """Where the state lives, which configuration is in use, and whether a provider is
    configured (from the file or the environment), without reading any secret."""
    from controller.config.host import load_config
    from controller.errors import PatchboxError

    home = patchbox_home()
    target = config_path or home / "config.toml"
    setup: dict[str, Any] = {
        "home": str(home),
        "config": str(target) if target.is_file() else None,
        "config_error": None,
    }
    provider: dict[str, Any] = {}
    try:
        config = load_config(config_path)
    except PatchboxError as exc:
        setup["config_error"] = exc.message
    else:
        provider = dict(config.provider)
        setup["spare_sandboxes"] = config.spare_sandboxes
    model = os.environ.get("PATCHBOX_MODEL") or provider.get("model")
    base_url = os.environ.get("OPENAI_BASE_URL") or provider.get("base_url")
    key_env = str(provider.get("api_key_env") or "OPENAI_API_KEY")
    setup["provider"] = {
        "configured": bool(model and base_url),
        "model": model,
        "base_url": base_url,
        "key_variable": key_env,
        "key_set": bool(os.environ.get(key_env)),
    }
    return setup


def diagnose(*, probe_runsc: bool = True, config_path: Path | None = None) -> dict[str, Any]:
    """Facts and advice. ``ready`` is False when a job cannot run here."""
    report: dict[str, Any] = {"ready": True, "problems": [], "advice": []}
    report.update(_setup(config_path))
    if report["config_error"]:
        report["problems"].append(report["config_error"])
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
    spares = SparePool(client)._spares(running=False)  # noqa: SLF001 - the pool's own listing
    report["spares"] = [{"id": sp.id[:12], "created": sp.created} for sp in spares]
    return report
