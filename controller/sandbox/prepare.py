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
   container while the container unpacks it; the cache is filled once the sandbox is ready
   (in the background, before a spare is offered). When nothing is waiting for this HEAD,
   the container is started while the baseline is being built, and the pipe is fed once
   the baseline is known.
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
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Literal

import docker
import docker.errors
import structlog

from controller.errors import GitError, PatchboxError, SandboxError
from controller.paths import MOUNT_PREFIX, mount_staging_root, owned_temp_dir, patchbox_home
from controller.repo.baseline import (
    Baseline,
    HealthReport,
    Mode,
    SnapshotLimits,
    archive_process,
    archive_stream,
    build_baseline,
    grow_pipe,
    predicted_tree,
)
from controller.repo.git import GIT_TIMEOUT
from controller.repo.layout import locate, resolve_head
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
SPLICE_CHUNK = 1 << 20

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
        with self.writer(baseline.tree) as out:
            _archive_into(baseline, out.fileno())
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

    def waiting(self, key: str) -> bool:
        """Whether a running, unclaimed spare for ``key`` is listed now."""
        return bool(self._spares(key))

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
    discard_thread: threading.Thread | None = None
    """Removes a sandbox started while the baseline was built when a spare served instead."""

    def finish(self, timeout: float = 60.0) -> str | None:
        """Waits for the spare offer (and the removal of an unused early sandbox); returns
        the spare's container id, or None."""
        if self.discard_thread is not None:
            self.discard_thread.join(timeout)
        if self.spare_thread is not None:
            self.spare_thread.join(timeout)
        return self.spare_offered


FeedSource = Baseline | Path | None
"""What a FIFO is fed: a baseline (``git archive``), a cached archive, or nothing."""


class _FifoFeeder(threading.Thread):
    """Feeds the container's FIFO once :meth:`decide` says with what: ``git archive``
    writes into it directly (no byte through Python, and no second copy on the critical
    path: the cache is filled once the sandbox is ready), or a cached archive is spliced
    into it. A reader that stops early ends the feed, not the job: GNU tar stops at the
    end-of-archive blocks, and whether the container unpacked the tree is its own report's
    to say."""

    def __init__(self, fifo: Path) -> None:
        super().__init__(daemon=True, name="baseline-fifo")
        self.fifo = fifo
        self.error: BaseException | None = None
        self.stop = threading.Event()
        self._decided = threading.Event()
        self._source: FeedSource = None

    def decide(self, source: FeedSource) -> None:
        self._source = source
        self._decided.set()

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
        fd = -1
        try:
            fd = self._open()
            self._decided.wait()
            source = self._source
            if isinstance(source, Path):
                src = os.open(source, os.O_RDONLY | os.O_CLOEXEC)
                try:
                    _relay(src, fd)
                finally:
                    os.close(src)
            elif source is not None:
                _archive_into(source, fd)
        except BaseException as exc:
            self.error = exc
        finally:
            if fd >= 0:
                os.close(fd)


def _archive_into(baseline: Baseline, fd: int) -> None:
    """``git archive`` writing into ``fd`` itself; a pipe whose reader left (SIGPIPE) is not
    an error here (see :class:`_FifoFeeder`)."""
    proc = archive_process(baseline, fd)
    try:
        code = proc.wait(timeout=GIT_TIMEOUT)
    except subprocess.TimeoutExpired as exc:
        raise GitError("git archive did not finish") from exc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()
    if code not in (0, -signal.SIGPIPE):
        raise GitError(f"git archive failed with exit {code}")


def _relay(src: int, fd: int) -> None:
    """Copies the file ``src`` into the pipe ``fd`` (spliced: no copy through Python); ends
    quietly when the pipe's reader has gone."""
    splice = getattr(os, "splice", None)
    try:
        while True:
            if splice is not None:
                n = splice(src, fd, SPLICE_CHUNK)
            else:
                data = os.read(src, SPLICE_CHUNK)
                n = len(data)
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
            if n == 0:
                return
    except BrokenPipeError:
        return


class _FifoStart:
    """A sandbox whose baseline comes through a FIFO: started now (in a thread, since the
    start ends with the greeting, after the unpacking), fed when :meth:`feed` names the
    source. Started before the baseline is known, it holds nothing of the repository until
    then; :meth:`discard` removes it."""

    def __init__(
        self, client: docker.DockerClient, spec: SandboxSpec, identity: ControllerIdentity
    ) -> None:
        self.folder = owned_temp_dir(MOUNT_PREFIX, mount_staging_root())
        fifo = self.folder / "baseline.tar"
        os.mkfifo(fifo, 0o644)
        self.feeder = _FifoFeeder(fifo)
        self.box: DockerSandbox | None = None
        self.error: BaseException | None = None
        job = spec.model_copy(update={"preload": str(fifo)})
        self.thread = threading.Thread(
            target=self._start, args=(client, job, identity), name="sandbox-start"
        )
        self.feeder.start()
        self.thread.start()

    def _start(
        self, client: docker.DockerClient, spec: SandboxSpec, identity: ControllerIdentity
    ) -> None:
        try:
            self.box = DockerSandbox.start(client, spec, identity)
        except BaseException as exc:
            self.error = exc
        finally:
            self.feeder.stop.set()  # a feeder still waiting for a reader never gets one

    def _settle(self, source: FeedSource) -> DockerSandbox | None:
        self.feeder.decide(source)
        try:
            self.thread.join()
            self.feeder.join()
        finally:
            _remove(self.folder)
        return self.box

    def feed(self, source: Baseline | Path) -> DockerSandbox:
        """Feeds the FIFO from ``source``; the greeted sandbox holding it."""
        box = self._settle(source)
        if self.error is not None:
            if box is not None:
                box.close()
            raise self.error
        assert box is not None  # noqa: S101 - set whenever the start did not fail
        if self.feeder.error is not None:
            box.close()
            error = self.feeder.error
            raise SandboxError(f"the baseline archive failed: {error}") from error
        return box

    def discard(self) -> None:
        """Ends the FIFO empty and removes the sandbox (nothing of the repository in it)."""
        box = self._settle(None)
        if box is not None:
            box.close()


def _early_start(  # noqa: PLR0913, PLR0917 - internal; one call site
    client: docker.DockerClient,
    repo: Path,
    spec: SandboxSpec,
    identity: ControllerIdentity,
    cache: BaselineCache,
    pool: SparePool | None,
) -> tuple[_FifoStart | None, str | None]:
    """A FIFO sandbox started now, while the baseline is built, unless a spare or a cached
    archive is there for the tree HEAD predicts (the faster sources); with that tree."""
    if not daemon_is_local(client) or spec.runtime != "runc" or not _has_head(repo):
        return None, None
    tree = predicted_tree(repo)
    if tree is not None:
        if cache.path(tree).is_file():
            return None, tree
        if pool is not None and pool.waiting(pool_key(tree, spec)):
            return None, tree
    return _FifoStart(client, spec, identity), tree


def _has_head(repo: Path) -> bool:
    """A work tree whose HEAD names a commit: else the baseline fails, and no container
    should be started for it."""
    try:
        return resolve_head(locate(repo))[1] is None
    except (PatchboxError, OSError):
        return False


def _finish_early(  # noqa: PLR0913, PLR0917 - internal; one call site
    early: _FifoStart,
    predicted: str | None,
    baseline: Baseline,
    spec: SandboxSpec,
    identity: ControllerIdentity,
    cache: BaselineCache,
    pool: SparePool | None,
) -> tuple[DockerSandbox, Source, threading.Thread | None]:
    """The early sandbox fed with the baseline, unless the tree was not the predicted one
    and a spare serves it (the early one is then removed in the background)."""
    if baseline.tree != predicted:
        key = pool_key(baseline.tree, spec)
        spare = _from_spare(spec, identity, pool, key, cache.path(baseline.tree))
        if spare is not None:
            discard = threading.Thread(target=early.discard, name="sandbox-discard")
            discard.start()
            return spare, "spare", discard
    cached = cache.get(baseline.tree)
    if cached is not None:
        return early.feed(cached), "cache", None
    return early.feed(baseline), "fifo", None


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
    confirm: Callable[[str | None], None] | None = None,
) -> Prepared:
    """Health gate, baseline, and a greeted sandbox holding it (see the module docstring
    for the order of sources). Raises the baseline's errors (``NOT_A_REPOSITORY``,
    ``REPO_BLOCKED``, ``CONSENT_REQUIRED``) with no container left (one started while the
    baseline was built holds nothing of the repository and is removed first), and
    ``SANDBOX_FAILED`` with nothing left running.

    ``image_for``, when given, names the sandbox's image once the baseline exists (a project
    environment reads its inputs from it, and builds the image if it is missing).

    ``confirm``, when given, is called once the baseline is built, with the top it was read
    from, before any sandbox gets it; and with None when the build failed, before its error
    is raised. Its error wins: a service job's repository swapped while it was read fails
    the job with the pin's error, not with what the read found
    (:meth:`controller.repo.pin.RepoPin.confirm`)."""
    started = time.perf_counter()
    cache = cache or BaselineCache()
    early: _FifoStart | None = None
    predicted: str | None = None
    if image_for is None:
        early, predicted = _early_start(client, repo, spec, identity, cache, pool)
    try:
        try:
            baseline, report = build_baseline(repo, mode, snapshot)
        except Exception:
            if confirm is not None:
                confirm(None)
            raise
        if confirm is not None:
            confirm(baseline.repo)
    except BaseException:
        if early is not None:
            early.discard()
        raise
    timings = {"baseline": _ms(started)}
    if image_for is not None:
        t = time.perf_counter()
        spec = spec.model_copy(update={"image": image_for(baseline)})
        timings["environment"] = _ms(t)
    local = daemon_is_local(client)
    t = time.perf_counter()
    discard: threading.Thread | None = None
    if early is not None:
        box, source, discard = _finish_early(
            early, predicted, baseline, spec, identity, cache, pool
        )
    else:
        box, source = _start(client, baseline, spec, identity, cache, pool)
    timings["sandbox"] = _ms(t)
    timings["total"] = _ms(started)
    prepared = Prepared(box, baseline, report, source, timings, discard_thread=discard)
    if local and (pool is not None or source == "fifo"):
        prepared.spare_thread = threading.Thread(
            target=_fill_and_offer,
            args=(prepared, spec, identity, cache, pool),
            name="spare-offer",
        )
        prepared.spare_thread.start()
    return prepared


def _fill_and_offer(
    prepared: Prepared,
    spec: SandboxSpec,
    identity: ControllerIdentity,
    cache: BaselineCache,
    pool: SparePool | None,
) -> None:
    """After the sandbox is ready: the archive cached (a FIFO sandbox left it empty), then a
    spare offered for the next job on the same baseline."""
    baseline = prepared.baseline
    try:
        archive = cache.fill(baseline)
    except (GitError, OSError) as exc:
        log.warning("baseline_not_cached", error=str(exc))
        return
    if pool is None:
        return
    spare_spec = spec.model_copy(update={"preload": str(archive)})
    try:
        with mount_alias(archive) as alias:
            prepared.spare_offered = pool.offer(
                pool_key(baseline.tree, spec),
                spare_spec.model_copy(update={"preload": str(alias)}),
                identity,
            )
    except (SandboxError, OSError) as exc:
        log.warning("spare_not_started", error=str(exc))


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
    return _FifoStart(client, spec, identity).feed(baseline), "fifo"


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
