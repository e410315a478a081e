"""Several ``patchbox serve`` processes on one database (replicas, competing for one
queue): a replica runs a job only once it has claimed it in the database (the tenant's
``max_concurrent_jobs`` and the one-job-per-repository rule decided there, across
replicas), holds a lease on each job it runs and renews it, and takes over the jobs of a
replica that is gone: its lease ran out, or it was a process of this host that no longer
runs. One replica wins each such job (a conditional update) and ends it ``failed`` with
``INTERRUPTED``.

Replicas share ``$PATCHBOX_HOME`` (the job records, the journal, the locks): what the
database holds is the queue and who runs what; the records are the engine's files."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

from controller.errors import ErrorCode
from controller.identity import ControllerIdentity, controller_alive
from controller.jobs.records import ACTIVE
from controller.jobs.store import INTERRUPTED_MESSAGE, JobStore, end_interrupted
from controller.service.store import ErrorData, Lease, ServiceStore, StateData


def owner_of(identity: ControllerIdentity) -> str:
    """A replica's name in the database: its host and its process's token."""
    return f"{identity.host} {identity.token}"


@dataclass
class Leases:
    store: ServiceStore
    owner: str
    seconds: float

    def until(self) -> float:
        """A new lease's end."""
        return time.time() + self.seconds

    def renew(self) -> list[str]:
        """Renews this replica's leases; the jobs it still holds."""
        return self.store.renew(self.owner, self.until())

    def take_orphans(self, now: float | None = None) -> list[str]:
        """The running jobs whose replica is gone, each taken over by this one (another
        replica may win one first: it is not listed)."""
        moment = time.time() if now is None else now
        taken = []
        for lease in self.store.leases():
            if lease.owner == self.owner or not gone(lease, moment):
                continue
            if self.store.take_over(lease.job_id, lease.owner, self.owner):
                taken.append(lease.job_id)
        return taken


def gone(lease: Lease, now: float) -> bool:
    """Whether a lease's replica is gone: no lease (a job started by a version without
    them), a lease that ran out, or an owner on this host whose process no longer runs."""
    if lease.owner is None or lease.until is None or lease.until < now:
        return True
    host, _, token = lease.owner.partition(" ")
    return not controller_alive(token, host)


def interrupt(store: ServiceStore, job_id: str) -> str:
    """Ends a job taken over from a replica that is gone: the engine's record, if still
    active (or never written), ``failed`` with ``INTERRUPTED``; else the service's state
    follows the record (an apply, or a job that ended before its replica went, keeps its
    end). Returns the state."""
    records = JobStore()
    state, cut = "failed", True
    with contextlib.suppress(Exception):
        record = records.load(job_id)
        cut = record.state in ACTIVE
        if cut:
            record = end_interrupted(records, record)
        state = record.state
    event: StateData = {"state": state}
    if cut:
        event["reason"] = str(ErrorCode.INTERRUPTED)
        event["error"] = ErrorData(code=str(ErrorCode.INTERRUPTED), message=INTERRUPTED_MESSAGE)
    store.append_event(job_id, "state", event)
    store.update_state(job_id, state)
    return state
