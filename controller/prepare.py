"""From a repository to a ready sandbox holding its baseline (SPEC 3 and 4).

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
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Literal

import docker
import docker.errors
import structlog

from controller.baseline import (
    Baseline,
    HealthReport,
    Mode,
    SnapshotLimits,
    archive_stream,
    build_baseline,
    grow_pipe,
)
from controller.errors import SandboxError
from controller.labels import KIND, ControllerIdentity, controller_alive
from controller.paths import owned_temp_dir, patchbox_home
from controller.sandbox.base import SandboxSpec
from controller.sandbox.docker import DockerSandbox

if TYPE_CHECKING:
    from docker.models.containers import Container

log = structlog.get_logger(__name__)

POOL_KEY = "io.patchbox.pool-key"
SPARE = "spare"
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


@dataclass
class SparePool:
    """Spare sandboxes, one baseline each, started with an idle exit so that an unclaimed
    spare ends (and is removed by Docker) on its own. A claim is a file created with
    ``O_EXCL`` under ``$PATCHBOX_HOME/spares``: two controllers never get the same spare."""

    client: docker.DockerClient
    max_spares: int = 1
    idle_seconds: float = 600.0
    root: Path = field(default_factory=lambda: patchbox_home() / "spares")

    def _spares(self, key: str | None = None) -> list[Container]:
        labels = [f"{KIND}={SPARE}"] + ([f"{POOL_KEY}={key}"] if key else [])
        return self.client.containers.list(filters={"label": labels, "status": "running"})

    def _claim_file(self, container_id: str) -> Path:
        return self.root / container_id

    def claim(self, key: str, identity: ControllerIdentity) -> Container | None:
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        for container in self._spares(key):
            path = self._claim_file(container.id or "")
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                continue
            with os.fdopen(fd, "w") as out:
                out.write(f"{identity.token}\n{identity.host}\n")
            return container
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
        alive = {
            c.id
            for c in self.client.containers.list(all=True, filters={"label": f"{KIND}={SPARE}"})
        }
        gone = [p for p in self.root.iterdir() if p.name not in alive]
        for path in gone:
            path.unlink(missing_ok=True)
        return len(gone)

    def offer(self, key: str, spec: SandboxSpec, identity: ControllerIdentity) -> str | None:
        """Starts a spare for ``key`` unless one is waiting; keeps at most ``max_spares``
        (the oldest unclaimed ones go first). Returns the container id, or None."""
        if self.max_spares <= 0:
            return None
        waiting = [c for c in self._spares() if self.claimed_by_live_controller(c.id or "") is None]
        if any(c.labels.get(POOL_KEY) == key for c in waiting):
            return None
        waiting.sort(key=lambda c: str(c.attrs.get("Created", "")))
        while len(waiting) >= self.max_spares:
            old = waiting.pop(0)
            with contextlib.suppress(docker.errors.APIError):
                old.remove(force=True)
        labels = {**identity.labels(SPARE, SPARE), POOL_KEY: key}
        spare = spec.model_copy(update={"idle_exit": self.idle_seconds, "job_id": SPARE})
        container = DockerSandbox.start_detached(self.client, spare, labels)
        return container.id


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
) -> Prepared:
    """Health gate, baseline, and a greeted sandbox holding it (see the module docstring
    for the order of sources). Raises the baseline's errors (``NOT_A_REPOSITORY``,
    ``REPO_BLOCKED``, ``CONSENT_REQUIRED``) before any container exists, and
    ``SANDBOX_FAILED`` with nothing left running."""
    started = time.perf_counter()
    baseline, report = build_baseline(repo, mode, snapshot)
    timings = {"baseline": _ms(started)}
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
                prepared.spare_offered = pool.offer(key, spare_spec, identity)
            except SandboxError as exc:
                log.warning("spare_not_started", error=exc.message)

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
        return DockerSandbox.start(
            client, spec.model_copy(update={"preload": str(cached)}), identity
        ), "cache"
    folder = owned_temp_dir("fifo-")
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


def _remove(folder: Path) -> None:
    import shutil

    shutil.rmtree(folder, ignore_errors=True)


def _ms(since: float) -> int:
    return round((time.perf_counter() - since) * 1000)
