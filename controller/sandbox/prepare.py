"""From a repository to a ready sandbox holding its baseline.

How the baseline gets into the container, fastest first (``docs/performance.md`` has the
measurements behind this order):

1. **A spare**: a sandbox started earlier for the same baseline, image, runtime and limits,
   already unpacked and waiting, unattached, for a controller to greet it
   (:class:`~controller.sandbox.spares.SparePool`). Nothing of the repository has run in
   it. It ends by itself when unclaimed.
2. **The archive cache**: a tar of the baseline tree kept under
   ``$PATCHBOX_HOME/cache/baselines`` (:class:`~controller.sandbox.cache.BaselineCache`),
   mounted read-only into the container and unpacked there by GNU tar.
3. **A FIFO** (runc, :mod:`controller.sandbox.fifo`): ``git archive`` writes into a named
   pipe mounted read-only into the container while the container unpacks it; the cache is
   filled once the sandbox is ready (in the background, before a spare is offered). When
   nothing is waiting for this HEAD, the container is started while the baseline is being
   built, and the pipe is fed once the baseline is known.
4. **The channel** (a remote ``DOCKER_HOST``, where nothing on this host can be mounted): the
   tar stream goes through the attach stream.

In every case the container sees a tar of the baseline tree and nothing else: no git
metadata of the user's repository, and nothing it could write back to the host.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import docker
import structlog

from controller.errors import GitError, PatchboxError, SandboxError
from controller.repo.baseline import (
    Baseline,
    Mode,
    archive_stream,
    build_baseline,
    predicted_tree,
)
from controller.repo.health import HealthReport, SnapshotLimits
from controller.repo.layout import locate, resolve_head
from controller.sandbox.base import SandboxSpec
from controller.sandbox.cache import BaselineCache, mount_alias
from controller.sandbox.docker import DockerSandbox
from controller.sandbox.fifo import FifoStart
from controller.sandbox.labels import ControllerIdentity
from controller.sandbox.spares import SparePool, pool_key

log = structlog.get_logger(__name__)

Source = Literal["spare", "cache", "fifo", "channel"]


def daemon_is_local(client: docker.DockerClient) -> bool:
    """True when the daemon runs on this machine (a unix socket), so host paths mean the
    same thing to it as to us."""
    return str(client.api.base_url).startswith("http+docker://")


@dataclass
class Prepared:
    """A greeted sandbox holding the baseline, and how it got there.

    A spare for the next job on the same baseline is started in the background (off the
    critical path); :meth:`finish` waits until the daemon has its start (the daemon
    finishes it even if this process ends then)."""

    sandbox: DockerSandbox
    baseline: Baseline
    report: HealthReport
    source: Source
    timings_ms: dict[str, int]
    spare_thread: threading.Thread | None = None
    spare_offered: str | None = None
    spare_sent: threading.Event = field(default_factory=threading.Event)
    """Set once the spare thread needs this process no more: the spare's start sent to the
    daemon, or no spare started."""
    discard_thread: threading.Thread | None = None
    """Removes a sandbox started while the baseline was built when a spare served instead."""
    close_thread: threading.Thread | None = None
    """Removes :attr:`sandbox` once the job no longer needs it (:meth:`close_later`)."""
    close_error: BaseException | None = None

    def close_later(self) -> None:
        """Removes the sandbox on a thread of its own while the job goes on (its checks,
        validation and decision need the collected change, not the container);
        :meth:`finish` waits for the removal."""

        def close() -> None:
            try:
                self.sandbox.close()
            except BaseException as exc:  # not the engine's (close logs those): raised by finish
                self.close_error = exc

        self.close_thread = threading.Thread(target=close, name="sandbox-close")
        self.close_thread.start()

    def finish(self, timeout: float = 60.0) -> str | None:
        """Waits for the sandbox's removal, the removal of an unused early sandbox and the
        spare offer (until the daemon has the spare's start, not for its answer); returns
        the spare's container id, or None. Raises what the removal raised that was not the
        engine's (a bug)."""
        for thread in (self.close_thread, self.discard_thread):
            if thread is not None:
                thread.join(timeout)
        if self.spare_thread is not None:
            self.spare_sent.wait(timeout)
        if self.close_error is not None:
            error, self.close_error = self.close_error, None
            raise error
        return self.spare_offered


def _early_start(  # noqa: PLR0913, PLR0917 - internal; one call site
    client: docker.DockerClient,
    repo: Path,
    spec: SandboxSpec,
    identity: ControllerIdentity,
    cache: BaselineCache,
    pool: SparePool | None,
) -> tuple[FifoStart | None, str | None]:
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
    return FifoStart(client, spec, identity), tree


def _has_head(repo: Path) -> bool:
    """A work tree whose HEAD names a commit: else the baseline fails, and no container
    should be started for it."""
    try:
        return resolve_head(locate(repo))[1] is None
    except (PatchboxError, OSError):
        return False


def _finish_early(  # noqa: PLR0913, PLR0917 - internal; one call site
    early: FifoStart,
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
    made: Baseline | None = None,
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
    (:meth:`controller.repo.pin.RepoPin.confirm`).

    ``made``, when given, is the baseline, made already in the private git dir (a follow-up's:
    its parent's result); the repository is not read."""
    started = time.perf_counter()
    cache = cache or BaselineCache()
    early: FifoStart | None = None
    predicted: str | None = None
    if image_for is None and made is None:
        early, predicted = _early_start(client, repo, spec, identity, cache, pool)
    try:
        try:
            baseline, report = (
                (made, HealthReport(repo=made.repo, ok=True, head=made.head))
                if made is not None
                else build_baseline(repo, mode, snapshot)
            )
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
            daemon=True,  # once the start is sent (finish), the process need not wait for it
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
    spare offered for the next job on the same baseline. Sets ``prepared.spare_sent`` once
    the spare's start is with the daemon, or when no spare is started."""
    baseline = prepared.baseline

    def sent(container_id: str) -> None:
        prepared.spare_offered = container_id
        prepared.spare_sent.set()

    try:
        try:
            archive = cache.fill(baseline)
        except (GitError, OSError) as exc:
            log.warning("baseline_not_cached", error=str(exc))
            return
        if pool is None:
            return
        try:
            prepared.spare_offered = pool.offer(
                pool_key(baseline.tree, spec),
                spec.model_copy(update={"preload": str(archive)}),
                identity,
                sent,
            )
        except (SandboxError, OSError) as exc:
            log.warning("spare_not_started", error=str(exc))
    finally:
        prepared.spare_sent.set()


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
    return FifoStart(client, spec, identity).feed(baseline), "fifo"


def _ms(since: float) -> int:
    return round((time.perf_counter() - since) * 1000)
