"""From a repository to a ready sandbox holding its baseline.

How the baseline gets into the container, fastest first (``docs/performance.md`` has the
measurements behind this order):

1. **A spare**: a sandbox started earlier for the same baseline, image, runtime and limits,
   already unpacked and waiting, unattached, for a controller to greet it (:class:`SparePool`).
   Nothing of the repository has run in it. It ends by itself when unclaimed.
2. **The archive cache**: a tar of the baseline tree kept under
   ``$PATCHBOX_HOME/cache/baselines`` (keyed by tree id, bounded, least recently used
   evicted), mounted read-only into the container and unpacked there by GNU tar.
3. **A FIFO** (runc): ``git archive`` writes into a named pipe mounted read-only into the
   container while the container unpacks it; the same bytes fill the cache.
4. **The channel** (a remote ``DOCKER_HOST``, where nothing on this host can be mounted): the
   tar stream goes through the attach stream.

In every case the container sees a tar of the baseline tree and nothing else: no git
metadata of the user's repository, and nothing it could write back to the host.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Literal

import docker
import docker.errors
import structlog

from controller.errors import SandboxError
from controller.paths import MOUNT_PREFIX, mount_staging_root, owned_temp_dir, patchbox_home
from controller.repo.baseline import (
    Baseline,
    HealthReport,
    Mode,
    SnapshotLimits,
    archive_stream,
    build_baseline,
    grow_pipe,
)
from controller.sandbox.base import SandboxSpec
from controller.sandbox.docker import DockerSandbox
from controller.sandbox.labels import (
    HOME,
    KIND,
    ControllerIdentity,
    controller_alive,
    home_id,
    labels_of,
)

if TYPE_CHECKING:
    from docker.models.containers import Container

log = structlog.get_logger(__name__)

POOL_KEY = "io.patchbox.pool-key"
SPARE = "spare"
CLAIMED_PREFIX = "patchbox-claimed-"
"""A claimed spare is renamed to this prefix plus its id: only one rename can win."""
FIFO_OPEN_SECONDS = 60.0

Source = Literal["spare", "cache", "fifo", "channel"]


def daemon_is_local(client: docker.DockerClient) -> bool:
    """True when the daemon runs on this machine (a unix socket), so host paths mean the
    same thing to it as to us."""
    return str(client.api.base_url).startswith("http+docker://")


class BaselineCache:
    """Tar archives of baseline trees, keyed by tree id; at most ``max_bytes`` in all.

    Writers write a temp file and rename it into place; eviction only unlinks, so a reader
    (or a container that mounted the file) keeps its open copy."""

    def __init__(self, root: Path | None = None, max_bytes: int = 4 << 30) -> None:
        self.root = root or patchbox_home() / "cache" / "baselines"
        self.max_bytes = max_bytes

    def path(self, tree: str) -> Path:
        return self.root / f"{tree}.tar"

    def get(self, tree: str) -> Path | None:
        path = self.path(tree)
        try:
            os.utime(path)
        except OSError:
            return None
        return path

    @contextlib.contextmanager
    def writer(self, tree: str) -> Iterator[IO[bytes]]:
        """A file to write the archive into; it enters the cache only if the block ends
        without an exception."""
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = self.root / f".{tree}.{os.getpid()}.{threading.get_ident()}.tmp"
        try:
            with tmp.open("wb") as out:
                yield out
            tmp.chmod(0o644)
            tmp.replace(self.path(tree))
        finally:
            tmp.unlink(missing_ok=True)
        self.evict(keep=tree)

    def fill(self, baseline: Baseline) -> Path:
        """The cached archive of ``baseline`` (made now if missing)."""
        found = self.get(baseline.tree)
        if found is not None:
            return found
        with archive_stream(baseline) as chunks, self.writer(baseline.tree) as out:
            for chunk in chunks:
                out.write(chunk)
        return self.path(baseline.tree)

    def evict(self, keep: str | None = None) -> list[str]:
        """Removes the least recently used archives until the total fits."""
        entries = []
        for path in self.root.glob("*.tar"):
            with contextlib.suppress(OSError):
                st = path.stat()
                entries.append((st.st_mtime, st.st_size, path))
        total = sum(size for _, size, _ in entries)
        removed = []
        for _, size, path in sorted(entries):
            if total <= self.max_bytes:
                break
            if path.stem == keep:
                continue
            path.unlink(missing_ok=True)
            total -= size
            removed.append(path.stem)
        return removed


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
    idle_seconds: float = 600.0
    root: Path = field(default_factory=lambda: patchbox_home() / "spares")
    home: str = field(default_factory=home_id)

    def _spares(self, key: str | None = None, *, running: bool = True) -> list[SpareInfo]:
        labels = [f"{KIND}={SPARE}", f"{HOME}={self.home}"]
        if key:
            labels.append(f"{POOL_KEY}={key}")
        filters: dict[str, Any] = {"label": labels}
        if running:
            filters["status"] = "running"
        try:
            found = self.client.containers.list(all=not running, filters=filters, sparse=True)
        except docker.errors.NotFound:
            return []
        return [
            SpareInfo(c.id or "", labels_of(c).get(POOL_KEY, ""), int(c.attrs.get("Created", 0)))
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

    def claim(self, key: str, identity: ControllerIdentity) -> Container | None:
        """A running spare for ``key``, claimed for ``identity``; None when none is left."""
        for spare in self._spares(key):
            if not self._take(spare.id, identity):
                continue
            try:
                self.client.api.rename(spare.id, CLAIMED_PREFIX + spare.id)
                return self.client.containers.get(spare.id)
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
        gone = [p for p in self.root.iterdir() if p.name not in alive]
        for path in gone:
            path.unlink(missing_ok=True)
        return len(gone)

    def offer(self, key: str, spec: SandboxSpec, identity: ControllerIdentity) -> str | None:
        """Starts a spare for ``key`` unless one is waiting; keeps at most ``max_spares``
        (the oldest unclaimed ones go first, each claimed before it is removed, so a spare
        another controller is taking is never removed under it). Returns the container id,
        or None."""
        if self.max_spares <= 0:
            return None
        waiting = [s for s in self._spares() if self.claimed_by_live_controller(s.id) is None]
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
        spare = spec.model_copy(update={"idle_exit": self.idle_seconds, "job_id": SPARE})
        container = DockerSandbox.start_detached(self.client, spare, labels)
        return container.id


def _name(container: Container) -> str:
    names = container.attrs.get("Names") or [container.attrs.get("Name") or ""]
    return str(names[0]).lstrip("/") if names else ""


@dataclass
class Prepared:
    """A greeted sandbox holding the baseline, and how it got there.

    A spare for the next job on the same baseline is started in the background (off the
    critical path); :meth:`finish` waits for that before the process may exit."""

    sandbox: DockerSandbox
    baseline: Baseline
    report: HealthReport
    source: Source
    timings_ms: dict[str, int]
    spare_thread: threading.Thread | None = None
    spare_offered: str | None = None

    def finish(self, timeout: float = 60.0) -> str | None:
        """Waits for the spare offer; returns the spare's container id, or None."""
        if self.spare_thread is not None:
            self.spare_thread.join(timeout)
        return self.spare_offered


class _FifoFeeder(threading.Thread):
    """Writes the baseline archive into a FIFO (read by the container) and the cache."""

    def __init__(self, baseline: Baseline, fifo: Path, cache: BaselineCache) -> None:
        super().__init__(daemon=True, name="baseline-fifo")
        self.baseline = baseline
        self.fifo = fifo
        self.cache = cache
        self.error: BaseException | None = None
        self.stop = threading.Event()

    def _open(self) -> int:
        deadline = time.monotonic() + FIFO_OPEN_SECONDS
        while not self.stop.is_set():
            try:
                fd = os.open(self.fifo, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            except OSError as exc:
                if exc.errno != errno.ENXIO or time.monotonic() > deadline:
                    raise
                time.sleep(0.005)
                continue
            os.set_blocking(fd, True)
            grow_pipe(fd)
            return fd
        msg = "stopped before the sandbox opened the baseline"
        raise SandboxError(msg)

    def run(self) -> None:
        try:
            fd = self._open()
            with (
                os.fdopen(fd, "wb", buffering=0) as pipe,
                archive_stream(self.baseline) as chunks,
                self.cache.writer(self.baseline.tree) as out,
            ):
                for chunk in chunks:
                    pipe.write(chunk)
                    out.write(chunk)
        except BaseException as exc:
            self.error = exc


def prepare(  # noqa: PLR0913 - the inputs of a job's start, all keyword-only
    client: docker.DockerClient,
    repo: Path,
    spec: SandboxSpec,
    identity: ControllerIdentity,
    *,
    mode: Mode = "require-clean",
    snapshot: SnapshotLimits | None = None,
    cache: BaselineCache | None = None,
    pool: SparePool | None = None,
    image_for: Callable[[Baseline], str] | None = None,
) -> Prepared:
    """Health gate, baseline, and a greeted sandbox holding it (see the module docstring
    for the order of sources). Raises the baseline's errors (``NOT_A_REPOSITORY``,
    ``REPO_BLOCKED``, ``CONSENT_REQUIRED``) before any container exists, and
    ``SANDBOX_FAILED`` with nothing left running.

    ``image_for``, when given, names the sandbox's image once the baseline exists (a project
    environment reads its inputs from it, and builds the image if it is missing)."""
    started = time.perf_counter()
    baseline, report = build_baseline(repo, mode, snapshot)
    timings = {"baseline": _ms(started)}
    if image_for is not None:
        t = time.perf_counter()
        spec = spec.model_copy(update={"image": image_for(baseline)})
        timings["environment"] = _ms(t)
    local = daemon_is_local(client)
    cache = cache or BaselineCache()
    key = pool_key(baseline.tree, spec)
    t = time.perf_counter()
    box, source = _start(client, baseline, spec, identity, cache, pool)
    timings["sandbox"] = _ms(t)
    timings["total"] = _ms(started)
    prepared = Prepared(box, baseline, report, source, timings)
    if pool is not None and local and cache.get(baseline.tree) is not None:
        spare_spec = spec.model_copy(update={"preload": str(cache.path(baseline.tree))})

        def offer() -> None:
            try:
                with mount_alias(Path(str(spare_spec.preload))) as alias:
                    prepared.spare_offered = pool.offer(
                        key, spare_spec.model_copy(update={"preload": str(alias)}), identity
                    )
            except (SandboxError, OSError) as exc:
                log.warning("spare_not_started", error=str(exc))

        prepared.spare_thread = threading.Thread(target=offer, name="spare-offer")
        prepared.spare_thread.start()
    return prepared


def start_with_baseline(
    client: docker.DockerClient,
    baseline: Baseline,
    spec: SandboxSpec,
    identity: ControllerIdentity,
    cache: BaselineCache | None = None,
) -> DockerSandbox:
    """A fresh, greeted sandbox holding ``baseline`` (no spare: for the check stage)."""
    return _start(client, baseline, spec, identity, cache or BaselineCache(), None)[0]


def _start(  # noqa: PLR0913, PLR0917 - internal; every caller passes all of them
    client: docker.DockerClient,
    baseline: Baseline,
    spec: SandboxSpec,
    identity: ControllerIdentity,
    cache: BaselineCache,
    pool: SparePool | None,
) -> tuple[DockerSandbox, Source]:
    if not daemon_is_local(client):
        box = DockerSandbox.start(client, spec, identity)
        try:
            with archive_stream(baseline) as chunks:
                box.put_archive_stream(chunks)
        except BaseException:
            box.close()
            raise
        return box, "channel"
    key = pool_key(baseline.tree, spec)
    spare = _from_spare(spec, identity, pool, key, cache.path(baseline.tree))
    if spare is not None:
        return spare, "spare"
    return _start_local(client, spec, identity, baseline, cache)


def _from_spare(
    spec: SandboxSpec,
    identity: ControllerIdentity,
    pool: SparePool | None,
    key: str,
    archive: Path,
) -> DockerSandbox | None:
    """A claimed and greeted spare, or None (none waiting, or it ended as we came)."""
    if pool is None:
        return None
    container = pool.claim(key, identity)
    if container is None:
        return None
    try:
        return DockerSandbox.claim(
            pool.client, spec.model_copy(update={"preload": str(archive)}), container
        )
    except SandboxError as exc:
        log.info("spare_unusable", error=exc.message)
        pool.release(container.id or "")
        return None


def _start_local(
    client: docker.DockerClient,
    spec: SandboxSpec,
    identity: ControllerIdentity,
    baseline: Baseline,
    cache: BaselineCache,
) -> tuple[DockerSandbox, Source]:
    cached = cache.get(baseline.tree)
    if cached is None and spec.runtime != "runc":
        cached = cache.fill(baseline)  # gVisor cannot mount a FIFO: a file it is
    if cached is not None:
        with mount_alias(cached) as alias:
            box = DockerSandbox.start(
                client, spec.model_copy(update={"preload": str(alias)}), identity
            )
        return box, "cache"
    folder = owned_temp_dir(MOUNT_PREFIX, mount_staging_root())
    fifo = folder / "baseline.tar"
    os.mkfifo(fifo, 0o644)
    feeder = _FifoFeeder(baseline, fifo, cache)
    feeder.start()
    try:
        box = DockerSandbox.start(client, spec.model_copy(update={"preload": str(fifo)}), identity)
    except BaseException:
        feeder.stop.set()
        with contextlib.suppress(OSError):  # unblock a writer waiting for a reader
            os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))
        feeder.join(5)
        _remove(folder)
        raise
    feeder.join()
    _remove(folder)
    if feeder.error is not None:
        box.close()
        raise SandboxError(f"the baseline archive failed: {feeder.error}") from feeder.error
    return box, "fifo"


@contextlib.contextmanager
def mount_alias(source: Path) -> Iterator[Path]:
    """A second name for ``source`` under :func:`mount_staging_root`, to be bind-mounted
    instead of it: the container sees that neutral name in its mountinfo, never the path of
    ``$PATCHBOX_HOME``. A hard link where both share a filesystem, else a copy. Removed when
    the block ends; a started container's mount keeps the file itself."""
    folder = owned_temp_dir(MOUNT_PREFIX, mount_staging_root())
    alias = folder / "baseline.tar"
    try:
        try:
            os.link(source, alias)
        except OSError:
            shutil.copyfile(source, alias)
            alias.chmod(0o644)
        yield alias
    finally:
        _remove(folder)


def _remove(folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)


def _ms(since: float) -> int:
    return round((time.perf_counter() - since) * 1000)
