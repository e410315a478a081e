"""Removes what a crashed controller left behind, found by label."""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import docker
import docker.errors
import structlog

from controller.identity import JOB
from controller.paths import MOUNT_PREFIX, mount_staging_root
from controller.sandbox.dockerclient import removal_in_progress
from controller.sandbox.labels import (
    CONTROLLER,
    HOME,
    HOST,
    KIND,
    OWNER_FILTER,
    controller_alive,
    labels_of,
    status_of,
)
from controller.sandbox.spares import SPARE_START_GRACE, SparePool

log = structlog.get_logger(__name__)


@dataclass
class ReapReport:
    containers: list[str] = field(default_factory=list)
    volumes: list[str] = field(default_factory=list)
    networks: list[str] = field(default_factory=list)
    folders: list[str] = field(default_factory=list)
    failures: int = 0


def _orphaned(labels: dict[str, str], everything: bool) -> bool:
    return everything or not controller_alive(labels.get(CONTROLLER, ""), labels.get(HOST, ""))


def _spare_orphaned(pool: SparePool, labels: dict[str, str], cid: str, running: bool) -> bool:
    """A spare of another state directory is that home's business (unless it stopped). An
    unclaimed running spare is kept (it ends on its own); a spare that stopped, or was
    claimed by a controller that is gone, is left over."""
    if labels.get(HOME) != pool.home:
        return not running
    claimed = pool.claimed_by_live_controller(cid)
    if claimed is None:
        return not running
    if not claimed:
        pool.release(cid)
    return not claimed


def _reap_containers(client: docker.DockerClient, everything: bool, report: ReapReport) -> None:
    pool = SparePool(client)
    try:
        found = client.containers.list(all=True, filters={"label": OWNER_FILTER}, sparse=True)
    except docker.errors.APIError as exc:
        report.failures += 1
        log.error("reap_list_failed", error=str(exc.explanation))
        return
    for container in found:
        labels, cid = labels_of(container), container.id or ""
        status = status_of(container)
        running = status == "running"
        if labels.get(KIND) == "spare" and not everything:
            created = container.attrs.get("Created")
            starting = (
                status == "created"
                and isinstance(created, int)
                and time.time() - created < SPARE_START_GRACE
            )
            if not _spare_orphaned(pool, labels, cid, running or starting):
                continue
        elif not _orphaned(labels, everything):
            continue
        try:
            client.api.remove_container(cid, force=True, v=True)
            report.containers.append(cid[:12])
        except docker.errors.NotFound:
            pass  # removed by someone else meanwhile: gone is what we wanted
        except docker.errors.APIError as exc:
            if removal_in_progress(exc):
                continue
            report.failures += 1
            log.error("reap_container_failed", container=cid[:12], error=str(exc.explanation))


def _reap_volumes(client: docker.DockerClient, everything: bool, report: ReapReport) -> None:
    try:
        volumes = client.volumes.list(filters={"label": OWNER_FILTER})
    except docker.errors.APIError as exc:
        report.failures += 1
        log.error("reap_list_failed", error=str(exc.explanation))
        return
    for volume in volumes:
        if not _orphaned(volume.attrs.get("Labels") or {}, everything):
            continue
        try:
            volume.remove(force=True)
            report.volumes.append(volume.name or "")
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:
            report.failures += 1
            log.error("reap_volume_failed", volume=volume.name, error=str(exc.explanation))


def _reap_networks(client: docker.DockerClient, everything: bool, report: ReapReport) -> None:
    """A job's egress network, once its proxy and sandboxes are gone (they are reaped first:
    a network with a container on it cannot be removed)."""
    try:
        networks = client.networks.list(filters={"label": OWNER_FILTER})
    except docker.errors.APIError as exc:
        report.failures += 1
        log.error("reap_list_failed", error=str(exc.explanation))
        return
    for network in networks:
        if not _orphaned(network.attrs.get("Labels") or {}, everything):
            continue
        try:
            network.remove()
            report.networks.append(network.name or "")
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:
            report.failures += 1
            log.error("reap_network_failed", network=network.name, error=str(exc.explanation))


OWNERLESS_GRACE_SECONDS = 120.0
"""A temp folder gets its ``.owner`` file just after it is made: until then it is young,
not abandoned."""


def _reap_folders(tmp_root: Path, everything: bool, report: ReapReport, prefix: str = "") -> None:
    try:
        folders = [f for f in tmp_root.iterdir() if f.name.startswith(prefix)]
    except OSError:
        return
    for folder in folders:
        try:
            token, host = (folder / ".owner").read_text().split("\n")[:2]
        except (OSError, ValueError):
            try:
                young = time.time() - folder.stat().st_mtime < OWNERLESS_GRACE_SECONDS
            except OSError:
                continue  # removed meanwhile
            if young and not everything:
                continue
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
    SparePool(client).sweep()
    _reap_volumes(client, everything, report)
    _reap_networks(client, everything, report)
    if tmp_root is not None and tmp_root.is_dir():
        _reap_folders(tmp_root, everything, report)
    _reap_folders(mount_staging_root(), everything, report, MOUNT_PREFIX)
    if report.containers or report.volumes or report.networks or report.folders:
        log.info(
            "reaped",
            containers=len(report.containers),
            volumes=len(report.volumes),
            networks=len(report.networks),
            folders=len(report.folders),
        )
    return report


def remove_own(client: docker.DockerClient, token: str, keep: Callable[[], set[str]]) -> list[str]:
    """Removes the labelled containers of the controller ``token`` (a running process's)
    but its spares and those of the jobs ``keep`` names, asked once the containers are
    listed (a job started after the listing has none in it): what its jobs left while
    the daemon did not answer them. Returns their short ids."""
    removed: list[str] = []
    found = client.containers.list(
        all=True, filters={"label": [OWNER_FILTER, f"{CONTROLLER}={token}"]}, sparse=True
    )
    kept = keep()
    for container in found:
        cid, labels = container.id or "", labels_of(container)
        if labels.get(CONTROLLER) != token or labels.get(KIND) == "spare":
            continue
        if labels.get(JOB) in kept:
            continue
        with contextlib.suppress(docker.errors.NotFound):
            client.api.remove_container(cid, force=True, v=True)
            removed.append(cid[:12])
    return removed
