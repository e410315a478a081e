"""Removes what a crashed controller left behind (SPEC 4.4), found by label."""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

import docker
import docker.errors
import structlog

from controller.labels import CONTROLLER, HOST, KIND, OWNER_FILTER, controller_alive

log = structlog.get_logger(__name__)


@dataclass
class ReapReport:
    containers: list[str] = field(default_factory=list)
    volumes: list[str] = field(default_factory=list)
    folders: list[str] = field(default_factory=list)
    failures: int = 0


def _orphaned(labels: dict[str, str], everything: bool) -> bool:
    return everything or not controller_alive(labels.get(CONTROLLER, ""), labels.get(HOST, ""))


def _spare_orphaned(client: docker.DockerClient, container_id: str, running: bool) -> bool:
    """An unclaimed running spare is kept (it ends on its own); a spare that stopped, or was
    claimed by a controller that is gone, is left over."""
    from controller.prepare import SparePool  # prepare imports the sandbox: import late

    claimed = SparePool(client).claimed_by_live_controller(container_id)
    if claimed is None:
        return not running
    if not claimed:
        SparePool(client).release(container_id)
    return not claimed


def _reap_containers(client: docker.DockerClient, everything: bool, report: ReapReport) -> None:
    for container in client.containers.list(all=True, filters={"label": OWNER_FILTER}):
        if container.labels.get(KIND) == "spare" and not everything:
            if not _spare_orphaned(client, container.id or "", container.status == "running"):
                continue
        elif not _orphaned(container.labels, everything):
            continue
        try:
            container.remove(force=True, v=True)
            report.containers.append(container.short_id)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:
            report.failures += 1
            log.error(
                "reap_container_failed", container=container.short_id, error=str(exc.explanation)
            )


def _reap_volumes(client: docker.DockerClient, everything: bool, report: ReapReport) -> None:
    for volume in client.volumes.list(filters={"label": OWNER_FILTER}):
        if not _orphaned(volume.attrs.get("Labels") or {}, everything):
            continue
        try:
            volume.remove(force=True)
            report.volumes.append(volume.name or "")
        except docker.errors.APIError as exc:
            report.failures += 1
            log.error("reap_volume_failed", volume=volume.name, error=str(exc.explanation))


def _reap_folders(tmp_root: Path, everything: bool, report: ReapReport) -> None:
    for folder in tmp_root.iterdir():
        try:
            token, host = (folder / ".owner").read_text().split("\n")[:2]
        except (OSError, ValueError):
            token, host = "", ""
        if everything or not controller_alive(token, host):
            shutil.rmtree(folder, ignore_errors=True)
            report.folders.append(folder.name)


def reap(
    client: docker.DockerClient, tmp_root: Path | None = None, *, everything: bool = False
) -> ReapReport:
    """Removes labelled containers, volumes and temp folders whose controller is gone.

    ``everything`` removes them whatever their controller (``patchbox`` itself never does
    that). Temp folders under ``tmp_root`` carry the controller token in a ``.owner`` file
    and are judged the same way. Failures are logged and counted, never raised.
    """
    report = ReapReport()
    _reap_containers(client, everything, report)
    from controller.prepare import SparePool  # prepare imports the sandbox: import late

    SparePool(client).sweep()
    _reap_volumes(client, everything, report)
    if tmp_root is not None and tmp_root.is_dir():
        _reap_folders(tmp_root, everything, report)
    if report.containers or report.volumes or report.folders:
        log.info(
            "reaped",
            containers=len(report.containers),
            volumes=len(report.volumes),
            folders=len(report.folders),
        )
    return report
