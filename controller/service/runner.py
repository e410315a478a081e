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
from controller.jobs.records import CheckResult, JobRecord, ToolCallRecord
from controller.jobs.store import JobStore
from controller.logs import Scrubber
from controller.repo.pin import Confinement, RepoPin, pin_repo
from controller.service.bundles import checkout, remove_clone, sweep
from controller.service.leases import Leases, interrupt, owner_of
from controller.service.origin import Lineage, choose
from controller.service.policy import check_containers, check_egress_of, check_task, containers_of
from controller.service.store import (
    QUEUED,
    RUNNING_STATES,
    CheckData,
    CheckOutputData,
    ErrorData,
    JobRow,
    ServiceStore,
    ToolCallData,
)

if TYPE_CHECKING:
    import docker

    from controller.config.host import HostConfig
    from controller.jobs.engine import Job
    from controller.providers.base import Provider
    from controller.service.config import ServiceConfig, TenantConfig
    from controller.tools.watch import CheckLine

log = structlog.get_logger(__name__)

REVIEWED_STATES = frozenset({"awaiting_review", "applied"})
"""A job's states an apply or a revert moves it from: a service killed while it applied or
reverted one may have left its row behind its record."""
WATCH_SECONDS = 0.25
OUTPUT_EVERY = 0.5
"""Seconds between two ``check_output`` events of a running check (its lines since the
last one in each)."""
OUTPUT_LINES = 200
"""Lines one ``check_output`` event keeps (the newest)."""
"""How often a running job's record is looked at for new tool calls."""
LOOP_DONE = frozenset(
    {"validating", "checking", "awaiting_review", "applied", "no_change", "failed"}
)
"""States after the tool loop: every tool call is emitted before them."""
BY_TENANT = "cancelled by the user (a cancel request)"
STOPPING = "cancelled: the service is stopping"
"""A cancelled job's error message: a tenant's cancel, the service's shutdown."""
HEARTBEAT_SECONDS = 2.0
"""At most this long between two renewals of a replica's leases (and two looks at the queue
other replicas fill)."""
DECIDED = frozenset({"awaiting_review", "applied", "no_change", "failed", "cancelled"})
"""States after the checks: every check result is emitted before them."""


def host_config_for(host: HostConfig, tenant: TenantConfig, row: JobRow) -> HostConfig:
    """The host configuration a job runs with: no spare sandbox for a bundle job (its clone
    goes when it ends) or for a tenant with ``max_sandboxes`` (a spare outlives its job)."""
    if row.request.bundle or tenant.max_sandboxes is not None:
        return host.model_copy(update={"spare_sandboxes": 0})
    return host


def confinement_of(service: ServiceConfig, tenant: TenantConfig) -> Confinement:
    """Where the tenant's repositories and their git data may be: its ``repo_roots``, never
    the service's own ``data_dir``."""
    return Confinement.of(tenant.name, tenant.repo_roots, [str(service.data_path())])


def pin_of(confinement: Confinement, row: JobRow) -> RepoPin | None:
    """The pin of a job on a tenant's repository as its submit stored it (None for a job
    on a bundle's clone); a job queued without one (by an older service) is pinned now."""
    if row.request.bundle:
        return None
    stored = row.request.pin
    if stored is None:
        return pin_repo(confinement, row.repo)
    return RepoPin.of_record(row.repo, stored, confinement)


def apply_denied(tenant: TenantConfig, row: JobRow) -> str | None:
    """Why the job's ``auto`` or ``trusted-auto`` may not apply it (None: it may): the
    tenant has no ``allow_apply``, or the job runs on an uploaded bundle's clone, which is
    no work tree of the tenant's. The engine's decision then stops for review."""
    if not tenant.allow_apply:
        return f"tenant {tenant.name!r} may not apply jobs (allow_apply = false)"
    if row.request.bundle:
        return "the job ran on an uploaded bundle: the service has no work tree to apply it in"
    return None


def tool_call_event(call: ToolCallRecord) -> ToolCallData:
    data = ToolCallData(
        turn=call.turn, id=call.id, name=call.name, ok=call.ok, error_code=call.error_code
    )
    if call.verdict is not None:
        data["verdict"] = call.verdict
    return data


def check_event(check: CheckResult) -> CheckData:
    return CheckData(
        id=check.id, status=check.status, exit_code=check.exit_code, duration_ms=check.duration_ms
    )


class EventFeed:
    """Turns one job record's progress into events, in order, each once: state changes (the
    record's history), then its tool calls before the loop ends, its checks before the
    decision. Safe to call from several threads."""

    def __init__(self, store: ServiceStore, job_id: str) -> None:
        self._store = store
        self._job_id = job_id
        self._lock = threading.Lock()
        self._states = 0
        self._calls = 0
        self._checks_done = False
        self._output: list[CheckLine] = []
        self._dropped = 0
        self._flushed = time.monotonic()

    def output(self, line: CheckLine) -> None:
        """A line of the running check's output: kept for the next ``check_output`` event,
        emitted once :data:`OUTPUT_EVERY` seconds passed since the last one."""
        with self._lock:
            self._output.append(line)
            if len(self._output) > OUTPUT_LINES:
                del self._output[0]
                self._dropped += 1
            if time.monotonic() - self._flushed >= OUTPUT_EVERY:
                self._emit_output()

    def _emit_output(self) -> None:
        """Under the lock: the kept lines as ``check_output`` events (one per check run)."""
        self._flushed = time.monotonic()
        lines, self._output = self._output, []
        dropped, self._dropped = self._dropped, 0
        while lines:
            first = lines[0]
            same = [x for x in lines if x.handle == first.handle]
            lines = [x for x in lines if x.handle != first.handle]
            data = CheckOutputData(
                check_id=first.check_id,
                handle=first.handle,
                lines=[x.line for x in same],
                dropped=dropped,
            )
            dropped = 0
            self._store.append_event(self._job_id, "check_output", data)

    def sync(self, record: JobRecord, *, final: bool = False) -> None:
        """Emits what is new. The job's end state is held back until ``final`` (its worker
        returned: containers removed, evidence written), so a client that sees it, or whose
        stream ends, finds nothing of the job still running."""
        with self._lock:
            if self._output:
                self._emit_output()  # before the call that ran the check
            history = list(record.history)
            calls = record.tool_calls[self._calls :]  # only what is new: a long job stays cheap
            checks = list(record.checks)
            while self._states < len(history):
                state = history[self._states][0]
                if not final and state not in RUNNING_STATES:
                    break
                if state in LOOP_DONE | DECIDED:
                    self._emit_calls(calls)
                if state in DECIDED:
                    self._emit_checks(checks)
                self._store.append_event(self._job_id, "state", {"state": state})
                self._store.update_state(self._job_id, state)
                self._states += 1
            if self._states and history[self._states - 1][0] == "running":
                self._emit_calls(calls)

    def _emit_calls(self, new: list[ToolCallRecord]) -> None:
        """Emits the calls of ``new`` (the record's calls from the first not emitted at the
        start of this sync) that are not emitted yet."""
        for call in new:
            self._store.append_event(self._job_id, "tool_call", tool_call_event(call))
        self._calls += len(new)
        new.clear()

    def _emit_checks(self, checks: list[CheckResult]) -> None:
        if self._checks_done:
            return
        for check in checks:
            self._store.append_event(self._job_id, "check", check_event(check))
        self._checks_done = True


@dataclass
class Running:
    row: JobRow
    job: Job | None = None
    cancelled: bool = False
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
        self.dispatch()
        self._beat.start()

    def _heartbeat(self) -> None:
        while not self._beat_stop.wait(min(self.leases.seconds / 3, HEARTBEAT_SECONDS)):
            with contextlib.suppress(Exception):  # a database that does not answer: next time
                self.leases.renew()
                taken = self.leases.take_orphans()
                for job_id in taken:
                    interrupt(self.store, job_id)
                if taken:  # their containers on this host, their replica being gone
                    api.settle_leftovers(connect=self._connect)
                self.dispatch()

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
            while not self._stopping and len(self._running) < self.service.workers:
                row = self._pick(frozenset(tried))
                if row is None:
                    return
                tried.add(row.repo)
                limit = self.tenants[row.tenant].job_limit()
                if not self.store.claim(row.job_id, self.leases.owner, self.leases.until(), limit):
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
        feed = EventFeed(self.store, row.job_id)
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
            if cancelled:
                job.cancel(STOPPING if self._stopping else BY_TENANT)
            self._run(job, feed, lambda: self.release(row))
            if lineage.carried is not None:
                api.mark_rebased(lineage.carried, job.record)
        except Exception as exc:  # the job could not even be made: recorded as an event
            log.warning("service job failed to start", job_id=row.job_id, error=str(exc)[:500])
            self.release(row)
            state = "cancelled" if item.cancelled else "failed"
            code = getattr(exc, "code", ErrorCode.INTERNAL_ERROR)
            message = str(exc)
            if row.request.bundle:  # the clone's path is the service's, not the tenant's
                message = Scrubber(row.repo).text(message)
            error = ErrorData(code=str(code), message=message[:1000])
            self.store.append_event(row.job_id, "state", {"state": state, "error": error})
            self.store.update_state(row.job_id, state)
        finally:
            if provider is not None:
                with contextlib.suppress(Exception):
                    provider.close()
            if client is not None:
                with contextlib.suppress(Exception):
                    client.close()
            with self._lock:
                self._running.pop(row.job_id, None)
            self.dispatch()

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

    def _run(self, job: Job, feed: EventFeed, release: Callable[[], None]) -> None:
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
                release()
            feed.sync(job.record, final=True)


def _connect() -> docker.DockerClient:
    from controller.sandbox.dockerclient import connect

    return connect()
