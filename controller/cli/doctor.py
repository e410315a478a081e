"""``patchbox doctor``: is this machine ready to run sandboxes, and what to do if not."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import docker
import docker.errors
from pydantic import BaseModel, ConfigDict, Field

from controller import api
from controller.cli.hints import with_remedy
from controller.config.host import HostConfig, load_config
from controller.errors import ExitCode, GitError, NotReadyError, PatchboxError
from controller.paths import patchbox_home
from controller.providers import provider_given
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


class _Part(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ProviderReport(_Part):
    configured: bool
    model: str | None
    base_url: str | None
    key_variable: str
    """The environment variable that holds the key (its value is never read out)."""
    key_set: bool
    refused: str | None = Field(default=None, exclude_if=lambda v: v is None)
    """Why ``run`` refuses the provider settings given (the engine's own check)."""


class DockerReport(_Part):
    server_version: str | None
    api_version: str | None
    cgroup_version: str | None
    storage_driver: str | None
    runtimes: list[str]
    default_runtime: str | None


class ImageReport(_Part):
    base: str | None
    tag: str | None
    ready: bool


class RunscReport(_Part):
    registered: bool
    works: bool | None = Field(default=None, exclude_if=lambda v: v is None)
    detail: str | None = Field(default=None, exclude_if=lambda v: v is None)
    advice: str | None = Field(default=None, exclude_if=lambda v: v is None)


class SpareReport(_Part):
    id: str
    created: int


class DoctorReport(_Part):
    """What ``patchbox doctor`` found; ``ready`` is False when a job cannot run here. The
    parts about the daemon are absent when it does not answer."""

    ready: bool = True
    problems: list[str] = Field(default_factory=list)
    advice: list[str] = Field(default_factory=list)
    home: str
    config: str | None
    config_error: str | None
    provider: ProviderReport
    spare_sandboxes: int | None = Field(default=None, exclude_if=lambda v: v is None)
    git: str | None = None
    docker: DockerReport | None = None
    image: ImageReport | None = Field(default=None, exclude_if=lambda v: v is None)
    runsc: RunscReport | None = Field(default=None, exclude_if=lambda v: v is None)
    spares: list[SpareReport] | None = Field(default=None, exclude_if=lambda v: v is None)
    exit_code: int = Field(default=ExitCode.OK, exclude=True)
    """The command's exit status: that of the first problem (1 for what ``run`` refuses,
    3 for a machine that is not ready)."""

    def data(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def problem(self, text: str, exit_code: ExitCode) -> None:
        """A reason a job cannot run here; the first one gives the exit status."""
        self.ready = False
        self.problems.append(text)
        if self.exit_code == ExitCode.OK:
            self.exit_code = exit_code


def _shown_url(value: object) -> str | None:
    """A base URL as it may be shown: no user, password, query or fragment."""
    if not isinstance(value, str) or not value:
        return None
    try:
        parts = urlsplit(value)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port is not None else ""
    except ValueError:
        return None
    netloc = f"[{host}]{port}" if ":" in host else f"{host}{port}"
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))[:300]


def _provider(config: HostConfig) -> ProviderReport:
    """The provider as ``run`` takes it (:func:`controller.api.check_provider`): its model
    and endpoint, or why ``run`` refuses the settings given; never the key."""
    table = config.provider
    key_env = str(table.get("api_key_env") or "OPENAI_API_KEY")
    try:
        settings = api.check_provider(config)
    except PatchboxError as exc:
        given = provider_given(table)
        model = os.environ.get("PATCHBOX_MODEL") or table.get("model")
        return ProviderReport(
            configured=False,
            model=str(model)[:256] if given and model else None,
            base_url=_shown_url(os.environ.get("OPENAI_BASE_URL") or table.get("base_url"))
            if given
            else None,
            key_variable=key_env,
            key_set=bool(os.environ.get(key_env)),
            refused=exc.message if given else None,
        )
    return ProviderReport(
        configured=True,
        model=settings.model,
        base_url=settings.base_url,
        key_variable=key_env,
        key_set=settings.api_key is not None,
    )


def _setup(config_path: Path | None) -> tuple[DoctorReport, HostConfig | None]:
    """Where the state lives, which configuration is in use, and whether ``run`` takes it
    and its provider (the engine's own checks), without reading any secret out."""
    home = patchbox_home()
    target = config_path or home / "config.toml"
    config: HostConfig | None = None
    config_error = None
    try:
        config = load_config(config_path)
    except PatchboxError as exc:
        config_error = exc.message
    provider = (
        _provider(config)
        if config is not None
        else ProviderReport(
            configured=False,
            model=None,
            base_url=None,
            key_variable="OPENAI_API_KEY",
            key_set=bool(os.environ.get("OPENAI_API_KEY")),
        )
    )
    report = DoctorReport(
        home=str(home),
        config=str(target) if target.is_file() else None,
        config_error=config_error,
        spare_sandboxes=config.spare_sandboxes if config is not None else None,
        provider=provider,
    )
    if config_error is not None:
        report.problem(config_error, ExitCode.FAILED)
        report.advice.append("fix the configuration file: run refuses it")
    if provider.refused is not None:
        report.problem(f"provider refused: {provider.refused}", ExitCode.FAILED)
        report.advice.append("fix the provider settings: run refuses them")
    return report, config


def diagnose(*, probe_runsc: bool = True, config_path: Path | None = None) -> DoctorReport:
    """Facts and advice. ``ready`` is False when a job cannot run here; a configuration or
    provider that ``run`` refuses comes first."""
    report, config = _setup(config_path)
    report.git = _git_version()
    if report.git is None:
        report.problem("git is not installed", ExitCode.NOT_READY)
        report.advice.append("install git")
    try:
        client = connect(timeout=15)
    except NotReadyError as exc:
        report.problem("docker daemon unreachable", ExitCode.NOT_READY)
        report.advice.append(with_remedy(exc.message, exc.hint))
        return report
    version = client.version()
    info = client.info()
    runtimes = sorted((info.get("Runtimes") or {}).keys())
    report.docker = DockerReport(
        server_version=version.get("Version"),
        api_version=version.get("ApiVersion"),
        cgroup_version=info.get("CgroupVersion"),
        storage_driver=info.get("Driver"),
        runtimes=runtimes,
        default_runtime=info.get("DefaultRuntime"),
    )
    image = ImageReport.model_validate(ImageBuilder(client).status())
    report.image = image
    if not image.ready:
        report.advice.append("run 'patchbox image build' (jobs also build it on first use)")
    runsc = RunscReport(registered="runsc" in runtimes)
    if runsc.registered and probe_runsc and image.ready:
        runsc.works, runsc.detail = runsc_works(client, str(image.tag))
    if not runsc.registered:
        runsc.advice = (
            "optional: install gVisor (Debian package runsc), add it to /etc/docker/daemon.json "
            'as "runtimes": {"runsc": {"path": "/usr/bin/runsc", "runtimeArgs": '
            '["--network=none"]}} and send SIGHUP to dockerd'
        )
    if (
        config is not None
        and config.runtime == "runsc"
        and not (runsc.registered and runsc.works is not False)
    ):
        state = "is not registered" if not runsc.registered else "does not start a container"
        report.problem(
            f"the configuration's runtime is runsc, which {state} here", ExitCode.NOT_READY
        )
    report.runsc = runsc
    spares = SparePool(client)._spares(running=False)  # noqa: SLF001 - the pool's own listing
    report.spares = [SpareReport(id=sp.id[:12], created=sp.created) for sp in spares]
    return report


def doctor_text(report: DoctorReport) -> list[str]:
    """The report as lines of text: whether it is ready, the reasons it is not (first), the
    facts, and what to do."""
    lines = [f"ready: {'yes' if report.ready else 'no'}"]
    lines += [f"problem: {p}" for p in report.problems]
    lines.append(f"state: {report.home}")
    lines.append(f"config: {report.config or 'none (defaults)'}")
    prov = report.provider
    if prov.configured:
        key = "set" if prov.key_set else "not set"
        lines.append(f"provider: {prov.model} at {prov.base_url} (key {prov.key_variable} {key})")
    elif prov.refused is not None:
        at = f" at {prov.base_url}" if prov.base_url else ""
        lines.append(f"provider: {prov.model or 'no model'}{at}: refused (run refuses it)")
    else:
        lines.append(
            "provider: not configured (set PATCHBOX_MODEL and OPENAI_BASE_URL, or [provider]; "
            "without one, run needs --calls)"
        )
    if report.docker is not None:
        d = report.docker
        runtimes = ", ".join(d.runtimes)
        lines.append(f"docker: {d.server_version} (API {d.api_version}), runtimes {runtimes}")
    lines.append(f"git: {report.git or 'missing'}")
    if report.image is not None:
        img = report.image
        lines.append(f"image: {img.tag or 'not built'} ({'ready' if img.ready else 'missing'})")
    if report.runsc is not None:
        r = report.runsc
        state = "works" if r.works else ("registered" if r.registered else "not registered")
        lines.append(f"gVisor (runsc): {state}")
    if report.spares is not None:
        wanted = "?" if report.spare_sandboxes is None else report.spare_sandboxes
        remove = "; 'patchbox prune --spares' removes them" if report.spares else ""
        lines.append(f"spare sandboxes: {len(report.spares)} (spare_sandboxes = {wanted}{remove})")
    lines += [f"to do: {a}" for a in report.advice]
    return lines
