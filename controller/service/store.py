"""The service's state: its jobs and their events, behind :class:`ServiceStore`.

The job's own record stays in the engine's :class:`controller.jobs.store.JobStore`; the
service keeps who asked for it (the tenant), its request and its state as the service sees
it (``queued``, then the engine's states), the events a client streams, and the git bundles
tenants uploaded. The service's job id is the engine's.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, NotRequired, Protocol, TypedDict, final

from pydantic import BaseModel, ConfigDict

from controller.config.task import TaskSpec
from controller.jobs.records import ACTIVE
from controller.providers.scripted import CallsFile
from controller.repo.pin import PinRecord

QUEUED = "queued"
"""A job accepted by the service that no worker has started yet."""
RUNNING_STATES = ACTIVE
"""A job a worker holds (the engine's active states)."""
PENDING_STATES = RUNNING_STATES | {QUEUED}
"""What counts against a tenant's ``max_queued_jobs``; a bundle's file is kept while a job
in one of these states needs it."""


class StoredRequest(BaseModel):
    """A tenant's job request as the service keeps it with the job: what it sent (its task,
    its calls, its options) and what the service resolved (the repository's pin, or the
    bundle and its HEAD)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    task: TaskSpec
    calls: CallsFile | None = None
    """The scripted provider's calls; without them the operator's model is used."""
    include_local_changes: bool = False
    repo: str | None = None
    """The repository's real path (a job on a tenant's repository)."""
    pin: PinRecord | None = None
    """The repository as resolved at submit (absent in requests kept by older versions)."""
    bundle: str | None = None
    """The uploaded bundle's id (a job on a bundle)."""
    bundle_head: str | None = None
    rebase_of: str | None = None
    """The job whose diff this one carries onto the repository as it is now (a rebase)."""
    follow_of: str | None = None
    """The job whose result this one starts from (a follow-up)."""


@dataclass(frozen=True)
class JobRow:
    job_id: str
    tenant: str
    repo: str
    request: StoredRequest
    state: str
    created: float


@dataclass(frozen=True)
class Bundle:
    """A git bundle a tenant uploaded (``POST /v1/bundles``); its file is under the
    tenant's folder of the service's ``data_dir``."""

    bundle_id: str
    tenant: str
    head: str
    size: int
    created: float


@final
class ErrorData(TypedDict):
    """Why a job could not start (the event of its end state)."""

    code: str
    message: str


@final
class StateData(TypedDict):
    """A ``state`` event: the job's new state, why (``INTERRUPTED``), or its error."""

    state: str
    reason: NotRequired[str]
    error: NotRequired[ErrorData]


@final
class ToolCallData(TypedDict):
    """A ``tool_call`` event: one call of the job's tool loop."""

    turn: int
    id: str
    name: str
    ok: bool
    error_code: str | None
    verdict: NotRequired[str]
    """A ``run_check`` call's check verdict (``tests: failed, exit 1``)."""


@final
class CheckData(TypedDict):
    """A ``check`` event: one required check's result."""

    id: str
    status: str
    exit_code: int | None
    duration_ms: int


@final
class CheckOutputData(TypedDict):
    """A ``check_output`` event: lines of a running check's output, as they came."""

    check_id: str
    handle: str
    lines: list[str]
    dropped: int
    """Lines that came since the last such event and were not kept (the newest are)."""


EventData = StateData | ToolCallData | CheckData | CheckOutputData


@dataclass(frozen=True)
class Event:
    job_id: str
    seq: int
    type: str
    data: EventData

    def error(self) -> ErrorData | None:
        """The error of a ``state`` event that has one."""
        data = self.data
        # .get on a union of TypedDicts loses the type; ``in`` narrows it to StateData
        return data["error"] if "error" in data else None  # noqa: SIM401


class ServiceStore(Protocol):
    """The operations the service needs from its state."""

    def insert_job(self, row: JobRow) -> None: ...

    def update_state(self, job_id: str, state: str) -> None: ...

    def get_job(self, job_id: str) -> JobRow | None: ...

    def list_jobs(self, tenant: str) -> list[JobRow]: ...

    def jobs_in(self, states: frozenset[str]) -> list[JobRow]: ...

    def insert_job_within(self, row: JobRow, max_pending: int) -> bool: ...

    def next_queued(
        self, tenant: str, busy_repos: frozenset[str], *, bundles: bool = True
    ) -> JobRow | None: ...

    def append_event(self, job_id: str, type_: str, data: EventData) -> Event: ...

    def events_after(self, job_id: str, seq: int) -> list[Event]: ...

    def insert_bundle(self, bundle: Bundle) -> None: ...

    def get_bundle(self, bundle_id: str) -> Bundle | None: ...

    def delete_bundle(self, bundle_id: str) -> None: ...

    def bundles_before(self, created: float) -> list[Bundle]: ...

    def claim(self, job_id: str, owner: str, lease_until: float, quota: Quota) -> bool: ...

    def renew(self, owner: str, lease_until: float) -> list[str]: ...

    def register(self, replica: ReplicaInfo) -> None: ...

    def replicas(self) -> list[ReplicaInfo]: ...

    def leases(self) -> list[Lease]: ...

    def take_over(self, job_id: str, old_owner: str | None, owner: str) -> bool: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Quota:
    """A tenant's limits that a claim holds across replicas (``max_concurrent_jobs``,
    ``max_sandboxes``, ``max_clones``), and what the job takes of them: its containers
    (its sandbox and its services) and whether it holds a clone (a bundle's job)."""

    max_running: int
    containers: int = 1
    max_containers: int | None = None
    clone: bool = False
    max_clones: int | None = None

    def allows(self, running: int, containers: int, clones: int) -> bool:
        """Whether the job may start beside the tenant's ``running`` jobs, which hold
        ``containers`` containers and ``clones`` clones."""
        if running >= self.max_running:
            return False
        if self.max_containers is not None and containers + self.containers > self.max_containers:
            return False
        return not (self.clone and self.max_clones is not None and clones >= self.max_clones)


@dataclass(frozen=True)
class Lease:
    """Who runs a job (a replica's ``HOST TOKEN``; None: a job started by a version without
    leases) and until when it has said so."""

    job_id: str
    owner: str | None
    until: float | None


@dataclass(frozen=True)
class ReplicaInfo:
    """What a replica tells the store each heartbeat: its name (``HOST TOKEN``), the
    repository roots it can see, its Docker engine and whether that answered, and until
    when this holds."""

    name: str
    roots: tuple[str, ...]
    engine: str
    engine_ok: bool
    until: float


COLUMNS = "id, tenant, repo, request, state, created"


def job_values(row: JobRow, state: str | None = None) -> tuple[str, str, str, str, str, float]:
    """``row`` as the ``jobs`` table's :data:`COLUMNS` hold it (with ``state`` when given)."""
    request = row.request.model_dump_json(exclude_none=True)
    return (row.job_id, row.tenant, row.repo, request, state or row.state, row.created)


def first_startable(
    queued: list[JobRow], busy_repos: frozenset[str], *, bundles: bool
) -> JobRow | None:
    """The first of ``queued`` (oldest first) on a repository no running job holds; without
    ``bundles``, not a job on an uploaded bundle."""
    for row in queued:
        if row.repo not in busy_repos and (bundles or not row.request.bundle):
            return row
    return None


def row_of(values: tuple[Any, ...]) -> JobRow:
    """A job read back from the ``jobs`` table's :data:`COLUMNS`."""
    job_id, tenant, repo, request, state, created = values
    return JobRow(
        job_id, tenant, repo, StoredRequest.model_validate_json(request), state, float(created)
    )


def replica_of(values: tuple[Any, ...]) -> ReplicaInfo:
    """A replica read back from the ``replicas`` table."""
    name, roots, engine, engine_ok, until = values
    return ReplicaInfo(name, tuple(json.loads(roots)), engine, bool(engine_ok), float(until))


def now() -> float:
    return time.time()
