"""What ``patchbox serve`` says it loaded, on stderr before it listens: the configuration
file, the store, the workers, each tenant (its name, how many repository roots, whether it
may apply) and the model provider (its API, endpoint host, model and whether a key is set).
Never a key, a token or a token's hash."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from controller.errors import PatchboxError
from controller.paths import patchbox_home

if TYPE_CHECKING:
    from controller.config.host import HostConfig
    from controller.service.config import ServiceConfig

PREFIX = "patchbox serve: "


def _provider_line(host: HostConfig) -> str:
    from controller import api

    try:
        shown = api.describe_provider(host)
    except PatchboxError as exc:
        return f"provider: none usable ({exc.message}); only jobs with calls run"
    return (
        f"provider: {shown['api']} at {shown['endpoint']}, model {shown['model']}, "
        f"key {shown['key']}"
    )


def startup_lines(config_path: Path | None, host: HostConfig, service: ServiceConfig) -> list[str]:
    """The startup summary, one line each (without :data:`PREFIX`)."""
    if config_path is not None:
        where = f"configuration: {config_path}"
    else:
        default = patchbox_home() / "config.toml"
        state = "" if default.is_file() else " (not found: the defaults, no tenant)"
        where = f"configuration: {default}{state}"
    lines = [
        where,
        f"store: {service.state} {service.store_name()}",
        f"data: {service.data_path()}",
        f"workers: {service.workers}",
        f"tenants: {len(service.tenants)}",
    ]
    for tenant in service.tenants:
        roots = len(tenant.repo_roots)
        lines.append(
            f"tenant {tenant.name}: {roots} repository root{'' if roots == 1 else 's'}, "
            f"allow_apply {str(tenant.allow_apply).lower()}"
        )
    metrics = "per tenant with the operator's token" if service.metrics_token_sha256 else "totals"
    lines += [f"metrics: {metrics}", _provider_line(host)]
    return lines
