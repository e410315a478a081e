"""Spare sandboxes: started ahead for a baseline, image, runtime and limits, already
unpacked and waiting, unattached, for a controller to claim and greet one. Nothing of the
repository has run in a spare, and an unclaimed one ends by itself."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import docker
import docker.errors
import structlog

from controller.errormap import map_error
from controller.paths import patchbox_home
from controller.sandbox import handover
from controller.sandbox.base import SandboxSpec
from controller.sandbox.cache import mount_alias
from controller.sandbox.docker import container_config
from controller.sandbox.dockerclient import create_container, request_start, start_answer
from controller.sandbox.handover import PendingStart
from controller.sandbox.labels import (
    HOME,
    KIND,
    ControllerIdentity,
    controller_alive,
    home_id,
    labels_of,
    status_of,
)

if TYPE_CHECKING:
    from docker.models.containers import Container

log = structlog.get_logger(__name__)

POOL_KEY = "io.patchbox.pool-key"
SPARE = "spare"
CLAIMED_PREFIX = "patchbox-claimed-"
"""A claimed spare is renamed to this prefix plus its id: only one rename can win."""
OFFERING = ".offer"
"""The suffix of a pool key's lock file, held while a spare for that key is being started."""
SPARE_START_GRACE = 120.0
"""Seconds a spare may stay created but not started: its start was sent and the daemon is
carrying it out (the process that sent it may have ended since)."""


def pool_key(tree: str, spec: SandboxSpec) -> str:
    """What a spare must share with a job to serve it."""
    parts = [tree, spec.image, spec.runtime, spec.limits.model_dump_json(), *spec.agent_argv]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


@dataclass(frozen=True)
class SpareInfo:
    """A spare as a sparse listing shows it (no per-container inspection to race with)."""

    id: str
    key: str
    created: int
    status: str = "running"

    @property
    def starting(self) -> bool:
        """Created and not started yet, recently: its start is on its way."""
        return self.status == "created" and time.time() - self.created < SPARE_START_GRACE

    @property
    def usable(self) -> bool:
        """Running, or about to: a job may claim it (and starts it itself if need be)."""
        return self.status == "running" or self.starting


@dataclass
class SparePool:
    """Spare sandboxes, one baseline each, started with an idle exit so that an unclaimed
    spare ends (and is removed by Docker) on its own.

    A spare belongs to the state directory (``$PATCHBOX_HOME``) that started it, by label,
    and is never listed, claimed or removed from another one. Claiming takes two steps,
    both atomic: a claim file created with ``O_EXCL`` under ``$PATCHBOX_HOME/spares`` (it
    names the claimant, so the reaper can tell a live claim from an abandoned one), then a
    rename of the container on the daemon to a name derived from its id, which only one
    caller can win. Any spare may vanish at any moment (it ends by itself, or another
    controller removed it): that is never an error, the next source is tried."""

    client: docker.DockerClient
    max_spares: int = 1
    idle_seconds: float = 60.0
    root: Path = field(default_factory=lambda: patchbox_home() / "spares")
    home: str = field(default_factory=home_id)

    def _spares(self, key: str | None = None, *, running: bool = True) -> list[SpareInfo]:
        labels = [f"{KIND}={SPARE}", f"{HOME}={self.home}"]
        if key:
            labels.append(f"{POOL_KEY}={key}")
        filters: dict[str, str | list[str] | bool] = {"label": labels}
        if running:
            filters["status"] = "running"
        try:
            found = self.client.containers.list(all=not running, filters=filters, sparse=True)
        except docker.errors.NotFound:
            return []
        return [
            SpareInfo(
                c.id or "",
                labels_of(c).get(POOL_KEY, ""),
                int(c.attrs.get("Created", 0)),
                status_of(c),
            )
            for c in found
            if not str(_name(c)).startswith(CLAIMED_PREFIX)
        ]

    def _claim_file(self, container_id: str) -> Path:
        return self.root / container_id

    def _take(self, container_id: str, identity: ControllerIdentity) -> bool:
        """The claim file, created atomically; False when another controller holds it."""
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            fd = os.open(
                self._claim_file(container_id), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600
            )
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as out:
            out.write(f"{identity.token}\n{identity.host}\n")
        return True

    def waiting(self, key: str) -> bool:
        """Whether an unclaimed spare for ``key``, running or being started, is listed now."""
        return any(s.usable for s in self._spares(key, running=False))

    def claim(self, key: str, identity: ControllerIdentity) -> Container | None:
        """A spare for ``key``, running or being started (running ones first), claimed for
        ``identity``; None when none is left. The container's ``State`` says which: a
        claimant of one still ``created`` sends its start too (the daemon starts it once)."""
        found = [s for s in self._spares(key, running=False) if s.usable]
        for spare in sorted(found, key=lambda s: s.status != "running"):
            if not self._take(spare.id, identity):
                continue
            try:
                self.client.api.rename(spare.id, CLAIMED_PREFIX + spare.id)
                # the rename found it: its id and listed state are all the claim needs
                return self.client.containers.prepare_model(
                    {"Id": spare.id, "State": {"Status": spare.status}}
                )
            except docker.errors.APIError as exc:  # gone, or renamed by someone else first
                log.info("spare_claim_lost", error=str(exc.explanation))
                self.release(spare.id)
        return None

    def claimed_by_live_controller(self, container_id: str) -> bool | None:
        """None when unclaimed; else whether the claiming controller is alive."""
        try:
            token, host = self._claim_file(container_id).read_text().split("\n")[:2]
        except (OSError, ValueError):
            return None
        return controller_alive(token, host)

    def release(self, container_id: str) -> None:
        self._claim_file(container_id).unlink(missing_ok=True)

    def sweep(self) -> int:
        """Removes claim files whose container no longer exists; returns how many."""
        if not self.root.is_dir():
            return 0
        labels = [f"{KIND}={SPARE}", f"{HOME}={self.home}"]
        try:
            alive = {
                c.id
                for c in self.client.containers.list(
                    all=True, filters={"label": labels}, sparse=True
                )
            }
        except docker.errors.APIError:
            return 0
        gone = [p for p in self.root.iterdir() if p.suffix != OFFERING and p.name not in alive]
        for path in gone:
            path.unlink(missing_ok=True)
        for path in self.root.glob(f"*{OFFERING}"):
            _unlink_unless_held(path)
        return len(gone)

    def remove_all(self, identity: ControllerIdentity) -> list[str]:
        """Removes every unclaimed spare of this state directory, running or stopped (each
        claimed first, so one another controller is taking is left to it); returns the
        short ids removed."""
        removed = []
        for spare in self._spares(running=False):
            if not self._take(spare.id, identity):
                continue  # being claimed by a job: it is that job's sandbox now
            try:
                self.client.api.remove_container(spare.id, force=True)
                removed.append(spare.id[:12])
            except docker.errors.NotFound:
                pass  # ended by itself meanwhile
            except docker.errors.APIError as exc:
                log.info("spare_remove_failed", error=str(exc.explanation))
            finally:
                self.release(spare.id)
        return removed

    @contextlib.contextmanager
    def _offering(self, key: str) -> Iterator[int | None]:
        """Holds ``key``'s lock file while a spare for it is started (yields its descriptor);
        None (nothing held) when another job of this state directory is starting one now."""
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(self.root / f"{key}{OFFERING}", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield None
                return
            yield fd
        finally:
            os.close(fd)  # and the lock with it (unless a helper holds it: handover)

    def offer(
        self,
        key: str,
        spec: SandboxSpec,
        identity: ControllerIdentity,
        sent: Callable[[str], None] | None = None,
    ) -> str | None:
        """Starts a spare for ``key`` unless one is waiting or being started (jobs on the
        same baseline that end together start one spare, not one each); keeps at most
        ``max_spares`` (the oldest unclaimed ones go first, each claimed before it is
        removed, so a spare another controller is taking is never removed under it).
        ``spec.preload`` (the baseline's archive) is mounted under a neutral name
        (:func:`~controller.sandbox.cache.mount_alias`). Returns the container id, or None.

        ``sent``, when given, is called with the container's id as soon as the daemon has
        its start, before the daemon answers (a daemon on a unix socket; elsewhere once it
        answered): from then on the process may end, :func:`~controller.sandbox.handover.
        hand_over` leaving the answer to a helper."""
        if self.max_spares <= 0:
            return None
        with self._offering(key) as lock:
            return None if lock is None else self._offer(key, spec, identity, sent, lock)

    def _offer(
        self,
        key: str,
        spec: SandboxSpec,
        identity: ControllerIdentity,
        sent: Callable[[str], None] | None,
        lock: int,
    ) -> str | None:
        waiting = [
            s
            for s in self._spares(running=False)
            if s.usable and self.claimed_by_live_controller(s.id) is None
        ]
        if any(s.key == key for s in waiting):
            return None
        waiting.sort(key=lambda s: s.created)
        while len(waiting) >= self.max_spares:
            old = waiting.pop(0)
            if not self._take(old.id, identity):
                continue
            try:
                self.client.api.remove_container(old.id, force=True)
            except docker.errors.APIError:
                pass  # already gone
            finally:
                self.release(old.id)
        labels = {**identity.labels(SPARE, SPARE), POOL_KEY: key, HOME: self.home}
        with contextlib.ExitStack() as stack:
            alias = stack.enter_context(mount_alias(Path(spec.preload))) if spec.preload else None
            spare = spec.model_copy(
                update={
                    "idle_exit": self.idle_seconds,
                    "job_id": SPARE,
                    "preload": None if alias is None else str(alias),
                }
            )
            folder = None if alias is None else alias.parent
            return self._start(spare, labels, sent, PendingStart(lock, folder))

    def _start(
        self,
        spare: SandboxSpec,
        labels: dict[str, str],
        sent: Callable[[str], None] | None,
        pending: PendingStart,
    ) -> str:
        announce = sent or _nobody
        try:
            container = create_container(self.client, **container_config(spare, labels))
            cid = container.id or ""
            connection = None if sent is None else request_start(self.client, cid)
            if connection is None:  # not asked for, or not a unix socket: the answer first
                container.start()
                announce(cid)
                return cid
            with handover.pending(pending, connection):
                announce(cid)
                start_answer(connection)
        except docker.errors.APIError as exc:
            raise map_error(exc, "cannot start a spare sandbox") from exc
        return cid


def _nobody(_: str) -> None:
    """No one to tell that a spare's start was sent."""


def _unlink_unless_held(path: Path) -> None:
    """Removes a pool key's lock file unless a spare is being started under it. (A job that
    opened it just before loses nothing: at worst two spares for one key are started, and
    the pool keeps at most ``max_spares``.)"""
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        path.unlink(missing_ok=True)
    except OSError:
        pass  # held: a spare is being started
    finally:
        os.close(fd)


def _name(container: Container) -> str:
    names = container.attrs.get("Names") or [container.attrs.get("Name") or ""]
    return str(names[0]).lstrip("/") if names else ""
