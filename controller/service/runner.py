"""Running the service's jobs: a pool of worker threads, per-tenant limits, a fair queue.

A queued job starts when a worker is free, its tenant runs fewer than its
``max_concurrent_jobs``, and no job of any tenant runs on the same repository (the engine's
write lock would refuse it). Tenants with queued jobs are served round robin. Each running
job's record is watched: its state changes, tool calls and check results become events.

A job on an uploaded git bundle runs on a clone in the tenant's folder of the service's
``data_dir`` (:mod:`controller.service.bundles`): its worker checks the bundle out when the
job starts (a queued job holds no clone), at most the tenant's ``max_clones`` at once, and
removes the clone when the job ends.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from controller import api
from controller.errors import ErrorCode
from controller.identity import current_identity
from controller.jobs.periodic import periodically
from controller.jobs.store import JobStore
from controller.logs import Scrubber
from controller.sandbox.reaper import remove_own
from controller.service.bundles import checkout, remove_clone, sweep
from controller.service.engines import (
    ENGINE_CODES,
    EngineWatch,
    answers,
    blame_engine,
    can_see,
    engine_name,
    ping_engine,
    roots_of,
)
from controller.service.feed import EventFeed
from controller.service.leases import Leases, interrupt, owner_of
from controller.service.origin import Lineage, choose
from controller.service.policy import (
    apply_denied,
    check_containers,
    check_egress_of,
    check_task,
    confinement_of,
    containers_of,
    host_config_for,
    pin_of,
    quota_of,
)
from controller.service.store import (
    QUEUED,
    RUNNING_STATES,
    ErrorData,
    JobRow,
    ReplicaInfo,
    ServiceStore,
)

if TYPE_CHECKING:
    import docker

    from controller.config.host import HostConfig
    from controller.jobs.engine import Job
    from controller.providers.base import Provider
    from controller.service.config import ServiceConfig, TenantConfig

log = structlog.get_logger(__name__)

REVIEWED_STATES = frozenset({"awaiting_review", "applied"})
"""A job's states an apply or a revert moves it from: a service killed while it applied or
reverted one may have left its row behind its record."""
WATCH_SECONDS = 0.25
"""How often a running job's record is looked at for new tool calls."""
BY_TENANT = "cancelled by the user (a cancel request)"
STOPPING = "cancelled: the service is stopping"
"""A cancelled job's error message: a tenant's cancel, the service's shutdown."""
LEASE_LOST = "interrupted: this replica could not renew its lease on the job in time"
"""A job its replica stops because another replica may own it now (a fenced replica)."""
HOLD_SHARE = 0.8
"""The share of ``lease_seconds`` since the last renewal past which a replica no longer
acts on its jobs: another replica takes them over once the whole lease ran out."""
HEARTBEAT_SECONDS = 2.0
"""At most this long between two renewals of a replica's leases (and two looks at the queue
other replicas fill)."""


@dataclass
class Running:
    row: JobRow
    job: Job | None = None
    cancelled: bool = False
    interrupted: str | None = None
    """Why the job is stopped ``INTERRUPTED`` (its engine lost, its lease lost)."""
    fenced: bool = False
    """The job may be another replica's now: nothing of it is written to the store."""
    finishing: bool = False
    future: Future[None] | None = field(default=None, repr=False)


class Runner:
    """Starts queued jobs on worker threads and cancels them on shutdown."""

    def __init__(
        self,
        store: ServiceStore,
        host: HostConfig,
        service: ServiceConfig,
        *,
        connect: Callable[[], docker.DockerClient] | None = None,
        ping: Callable[[], bool] | None = None,
    ) -> None:
        self.store = store
        self.host = host
        self.service = service
        self.tenants: dict[str, TenantConfig] = {t.name: t for t in service.tenants}
        self.confinements = {t.name: confinement_of(service, t) for t in service.tenants}
        self._order = [t.name for t in service.tenants]
        self._next = 0
        self._lock = threading.RLock()
        self._running: dict[str, Running] = {}
        self._stopping = False
        self._connect = connect or _connect
        self._pool = ThreadPoolExecutor(
            max_workers=max(service.workers, 1), thread_name_prefix="patchbox-worker"
        )
        self.leases = Leases(store, owner_of(current_identity()), service.lease_seconds)
        if ping is None:
            ping = ping_engine if connect is None else answers(self._connect)
        self.engine = EngineWatch(engine_name(), ping)
        self._renewed = time.monotonic()
        self._dirty = False
        """The engine stopped answering under this process's jobs: once it answers again,
        what they left on it is removed."""
        self._beat_stop = threading.Event()
        self._beat = threading.Thread(target=self._heartbeat, name="patchbox-lease", daemon=True)

    # -- start and stop -------------------------------------------------------------------

    def start(self) -> None:
        """Settles what a replica that is gone left (a previous process of this service, or
        another replica whose lease ran out): its jobs that were running end ``failed`` with
        ``INTERRUPTED`` (the engine's rule; their state follows the engine's record when it
        had moved on), an apply or a revert it did not finish is settled from the journal,
        its containers on this host are removed; then the queued jobs start, and a
        heartbeat renews this replica's leases, takes over those of replicas that are gone
        and starts the jobs other replicas queued."""
        api.settle_leftovers(connect=self._connect)
        store = JobStore()
        for job_id in self.leases.take_orphans():
            interrupt(self.store, job_id)
        for row in self.store.jobs_in(REVIEWED_STATES):  # an apply or revert cut short
            with contextlib.suppress(Exception):
                state = store.load(row.job_id).state  # settled from the journal above
                if state != row.state:
                    self.store.append_event(row.job_id, "state", {"state": state})
                    self.store.update_state(row.job_id, state)
        sweep(self.store, self.service, clones=True)
        self.engine.look()
        self._register()
        self.dispatch()
        self._beat.start()

    def _heartbeat(self) -> None:
        while not self._beat_stop.wait(min(self.leases.seconds / 3, HEARTBEAT_SECONDS)):
            with contextlib.suppress(Exception):  # a database that does not answer: next time
                self.beat()

    def beat(self) -> None:
        """One heartbeat: the engine pinged (its loss stops this replica's jobs, its return
        removes what they left), the leases renewed (a job whose lease another replica took,
        or all of them when no renewal came in time, is stopped and no longer written: the
        replica is fenced off it), the replica's roots and engine told to the store, the
        jobs of replicas that are gone taken over, the queue looked at."""
        try:
            with self._lock:
                renewed = set(self.leases.renew())
                self._renewed = time.monotonic()
                lost = [i for i in self._running.values() if i.row.job_id not in renewed]
                for item in self._running.values():
                    if item.row.job_id in renewed:
                        item.fenced = False  # still this replica's: its end is written
                strays = renewed - set(self._running)
        except Exception:  # the database does not answer: past the share, stop the jobs
            if not self.holding():
                items = [i for i in self._items() if not i.finishing]
                self._interrupt(items, LEASE_LOST, fence=True)
            raise
        self._interrupt([i for i in lost if not i.finishing], LEASE_LOST, fence=True)
        for job_id in strays:  # its worker ended while fenced: its end was not written
            interrupt(self.store, job_id)
        change = self.engine.look()
        if change == "lost":
            self._dirty = True
            self._interrupt(self._items(), self.engine.lost())
        elif self._dirty and not self.engine.down:  # what the lost jobs left on it
            self._remove_left()
        self._register()
        taken = self.leases.take_orphans()
        for job_id in taken:
            interrupt(self.store, job_id)
        if taken:  # their containers on this host, their replica being gone
            api.settle_leftovers(connect=self._connect)
        self.dispatch()

    def _remove_left(self) -> None:
        """Removes this process's containers of no running job (each job removes its own
        as it ends: any found were left while the engine did not answer); spares stay."""
        client = self._connect()
        try:
            remove_own(client, current_identity().token, keep=self._running_ids)
        finally:
            client.close()
        self._dirty = False

    def _running_ids(self) -> set[str]:
        with self._lock:
            return set(self._running)

    def holding(self) -> bool:
        """Whether this replica's leases were renewed recently enough to act on its jobs
        (asked when a renewal fails)."""
        return time.monotonic() - self._renewed < self.leases.seconds * HOLD_SHARE

    def _items(self) -> list[Running]:
        with self._lock:
            return list(self._running.values())

    def _interrupt(self, items: list[Running], why: str, *, fence: bool = False) -> None:
        """Stops ``items`` ``INTERRUPTED`` with ``why``; ``fence``: nothing more of them is
        written to the store (another replica may own them)."""
        for item in items:
            with self._lock:
                item.fenced = item.fenced or fence
                if item.interrupted is None:
                    item.interrupted = why
                job = item.job
            if job is not None:
                job.cancel(item.interrupted, ErrorCode.INTERRUPTED)

    def serves(self, row: JobRow) -> bool:
        """Whether this replica can run ``row``: a bundle's job, or a repository under a
        root it can see."""
        return bool(row.request.bundle) or can_see(roots_of(self.service), row.repo)

    def _register(self) -> None:
        info = ReplicaInfo(
            self.leases.owner,
            roots_of(self.service),
            self.engine.name,
            not self.engine.down,
            self.leases.until(),
        )
        self.store.register(info)

    def release(self, row: JobRow) -> None:
        """A bundle job's clone goes once the job no longer runs."""
        if row.request.bundle:
            remove_clone(Path(row.repo))

    def shutdown(self, timeout: float = 60.0) -> list[str]:
        """Cancels every running job and waits up to ``timeout`` seconds for their workers
        (each removes its containers). Queued jobs stay queued. Returns the ids of jobs
        still running at the end (none, normally)."""
        self._beat_stop.set()
        with self._lock:
            self._stopping = True
            running = list(self._running.values())
        for item in running:
            item.cancelled = True
            if item.job is not None:
                item.job.cancel(STOPPING)
        futures = [r.future for r in running if r.future is not None]
        _done, pending = wait(futures, timeout=timeout)
        self._pool.shutdown(wait=not pending, cancel_futures=True)
        with self._lock:
            return sorted(self._running)

    # -- the queue ------------------------------------------------------------------------

    def running_count(self, tenant: str) -> int:
        with self._lock:
            return sum(1 for r in self._running.values() if r.row.tenant == tenant)

    def container_count(self, tenant: str) -> int:
        """The containers the tenant's running jobs may hold: each its sandbox and its
        services (:func:`controller.service.policy.containers_of`)."""
        with self._lock:
            return sum(
                containers_of(r.row.request.task, self.host)
                for r in self._running.values()
                if r.row.tenant == tenant
            )

    def clone_count(self, tenant: str) -> int:
        """The tenant's bundle jobs a worker holds: each has (or is making) a clone."""
        with self._lock:
            return sum(
                1 for r in self._running.values() if r.row.tenant == tenant and r.row.request.bundle
            )

    def dispatch(self) -> None:
        """Starts as many queued jobs as the limits allow, round robin over tenants; each
        claimed in the database first (another replica may take it, or run the tenant's
        last allowed job, or a job on its repository)."""
        with self._lock:
            tried: set[str] = set()
            while (
                not self._stopping
                and not self.engine.down
                and len(self._running) < self.service.workers
            ):
                row = self._pick(frozenset(tried))
                if row is None:
                    return
                tried.add(row.repo)
                quota = quota_of(self.tenants[row.tenant], self.host, row)
                if not self.store.claim(row.job_id, self.leases.owner, self.leases.until(), quota):
                    continue
                item = Running(row)
                self._running[row.job_id] = item
                item.future = self._pool.submit(self._work, item)

    def _pick(self, tried: frozenset[str] = frozenset()) -> JobRow | None:
        busy = tried | frozenset(r.row.repo for r in self._running.values())
        count = len(self._order)
        for step in range(count):
            name = self._order[(self._next + step) % count]
            tenant = self.tenants[name]
            if self.running_count(name) >= tenant.job_limit():
                continue
            bundles = self.clone_count(name) < tenant.max_clones
            row = self.store.next_queued(name, busy, bundles=bundles)
            while row is not None and not self.serves(row):  # another replica's to run
                busy = busy | {row.repo}
                row = self.store.next_queued(name, busy, bundles=bundles)
            if row is not None and tenant.max_sandboxes is not None:
                held = self.container_count(name)
                if held + containers_of(row.request.task, self.host) > tenant.max_sandboxes:
                    continue  # it waits until enough of the tenant's containers are gone
            if row is not None:
                self._next = (self._next + step + 1) % count
                return row
        return None

    def cancel(self, job_id: str) -> str | None:
        """Cancels a queued or running job; the state it is in now (None: neither)."""
        with self._lock:
            item = self._running.get(job_id)
            if item is None:
                row = self.store.get_job(job_id)
                if row is not None and row.state in RUNNING_STATES:  # another replica's
                    JobStore().request_cancel(job_id)
                    return "cancelling"
                if row is None or row.state != QUEUED:
                    return None
                self.release(row)
                self.store.append_event(job_id, "state", {"state": "cancelled"})
                self.store.update_state(job_id, "cancelled")
                return "cancelled"
            item.cancelled = True
            job = item.job
        if job is not None:
            job.cancel(BY_TENANT)
        return "cancelling"

    # -- one job --------------------------------------------------------------------------

    def _work(self, item: Running) -> None:
        row = item.row
        feed = EventFeed(self.store, row.job_id, lambda: not item.fenced)
        client: docker.DockerClient | None = None
        provider: Provider | None = None
        try:
            bundle = row.request.bundle
            if bundle:
                head = row.request.bundle_head or ""
                checkout(self.service, row.tenant, bundle, head, Path(row.repo))
            client = self._connect()
            task = row.request.task
            check_task(task, self.tenants[row.tenant])  # the configuration may have changed
            check_containers(task, self.host, self.tenants[row.tenant])
            check_egress_of(task, self.host.network, self.tenants[row.tenant])
            choice, lineage = choose(self.host, row)
            provider = choice.provider
            job = self._make(row, choice, client, feed, lineage)
            with self._lock:
                item.job = job
                cancelled = item.cancelled or self._stopping
            if item.interrupted is not None:
                job.cancel(item.interrupted, ErrorCode.INTERRUPTED)
            elif cancelled:
                job.cancel(STOPPING if self._stopping else BY_TENANT)
            self._run(job, feed, item)
            if lineage.carried is not None:
                api.mark_rebased(lineage.carried, job.record)
        except Exception as exc:  # the job could not even be made: recorded as an event
            self._not_started(item, exc)
        finally:
            if provider is not None:
                with contextlib.suppress(Exception):
                    provider.close()
            if client is not None:
                with contextlib.suppress(Exception):
                    client.close()
            with self._lock:
                self._running.pop(row.job_id, None)
                if item.interrupted == self.engine.lost():  # it may have left containers
                    self._dirty = True
            self.dispatch()

    def _not_started(self, item: Running, exc: Exception) -> None:
        row = item.row
        log.warning("service job failed to start", job_id=row.job_id, error=str(exc)[:500])
        self.release(row)
        state = "cancelled" if item.cancelled else "failed"
        code = getattr(exc, "code", ErrorCode.INTERNAL_ERROR)
        message = str(exc)
        if item.interrupted is None and code in ENGINE_CODES and self._engine_lost_now():
            item.interrupted = self.engine.lost()
        if item.interrupted is not None:
            state, code, message = "failed", ErrorCode.INTERRUPTED, item.interrupted
        if row.request.bundle:  # the clone's path is the service's, not the tenant's
            message = Scrubber(row.repo).text(message)
        if item.fenced:
            return  # another replica's to end
        error = ErrorData(code=str(code), message=message[:1000])
        self.store.append_event(row.job_id, "state", {"state": state, "error": error})
        self.store.update_state(row.job_id, state)

    def _engine_lost_now(self) -> bool:
        """Whether the engine does not answer: known by the heartbeat, or found now."""
        return self.engine.down or not self.engine.ping()

    def _make(
        self,
        row: JobRow,
        choice: api.ProviderChoice,
        client: docker.DockerClient,
        feed: EventFeed,
        lineage: Lineage,
    ) -> Job:
        tenant = self.tenants[row.tenant]
        holder: list[Job] = []

        def progress(_message: str) -> None:
            if holder:
                feed.sync(holder[0].record)

        request = api.JobRequest(
            repo=Path(row.repo),
            task=row.request.task,
            provider=choice.provider,
            config=host_config_for(self.host, tenant, row),
            include_local_changes=row.request.include_local_changes,
            secrets=choice.secrets,
            pin=pin_of(self.confinements[row.tenant], row),
            apply_denied=apply_denied(tenant, row) or lineage.denied,
            job_id=row.job_id,  # the service's id is the engine's
            carry=lineage.carried.carry if lineage.carried is not None else None,
            follow=lineage.follow,
        )
        job = api.make_job(request, client=client, progress=progress, output=feed.output)
        holder.append(job)
        return job

    def _run(self, job: Job, feed: EventFeed, item: Running) -> None:
        def watch() -> bool:
            with contextlib.suppress(Exception):
                feed.sync(job.record)
            return False

        try:
            with periodically(WATCH_SECONDS, watch, f"watch-{job.record.job_id}"):
                job.run()
        except Exception as exc:  # InternalError: the record says failed, INTERNAL_ERROR
            log.warning("service job ended with an error", job_id=job.record.job_id, error=str(exc))
        finally:
            with contextlib.suppress(Exception):
                self.release(item.row)
            with contextlib.suppress(Exception):
                if blame_engine(job, self.engine):
                    item.interrupted = self.engine.lost()
            item.finishing = True
            feed.sync(job.record, final=True)


def _connect() -> docker.DockerClient:
    from controller.sandbox.dockerclient import connect

    return connect()
