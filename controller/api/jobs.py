"""Jobs through the engine: making and running one from a typed request, the provider a
request's model comes from, settling what controllers that are gone left behind, and, after
the decision, apply, revert and discard (and a diff made elsewhere applied as a local job)."""

from __future__ import annotations

import contextlib
import hashlib
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict

from controller.api.views import job_diff
from controller.changes.apply import (
    ApplyResult,
    RevertResult,
    apply_changeset,
    revert_changeset,
)
from controller.changes.journal import Journal, fault_point
from controller.config.host import HostConfig, load_config
from controller.config.task import TaskSpec
from controller.errors import ApplyConflictError, NotReadyError, PatchboxError, UsageError
from controller.jobs.engine import Job, JobRequest
from controller.jobs.evidence import write_evidence
from controller.jobs.records import (
    ACTIVE,
    Decision,
    FileChange,
    JobRecord,
    JobStore,
    mark_interrupted,
    write_lock,
)
from controller.jobs.settle import held, settled
from controller.paths import patchbox_home
from controller.providers import ScriptedProvider, configured_provider, open_provider
from controller.repo.baseline import commit_baseline
from controller.sandbox.dockerclient import connect as connect_daemon
from controller.sandbox.labels import new_job_id
from controller.sandbox.reaper import reap

if TYPE_CHECKING:
    import docker

    from controller.providers.base import Provider
    from controller.providers.scripted import CallsFile
    from controller.repo.pin import RepoPin

Progress = Callable[[str], None]


# -- a job from a request ------------------------------------------------------------------


@dataclass(frozen=True)
class ProviderChoice:
    """The model a job talks to, and the values (its key) that must appear nowhere."""

    provider: Provider
    secrets: tuple[str, ...] = ()


def choose_provider(
    config: HostConfig, task: TaskSpec, calls: CallsFile | None = None
) -> ProviderChoice:
    """The scripted provider of ``calls``, else the operator's (the host configuration's
    ``[provider]`` table with the environment on top, or the environment alone); the caller
    closes it. ``USAGE_ERROR`` naming what is missing when none is configured."""
    if calls is not None:
        return ProviderChoice(ScriptedProvider(calls))
    provider_config = configured_provider(config.provider)
    key = provider_config.api_key
    secret = key.get_secret_value() if key is not None else ""
    return ProviderChoice(open_provider(provider_config, task.prompt), (secret,) if secret else ())


def check_provider(config: HostConfig) -> None:
    """That the operator configured a model provider (``USAGE_ERROR`` naming what is
    missing otherwise), without opening it."""
    configured_provider(config.provider)


def make_job(
    request: JobRequest,
    *,
    client: docker.DockerClient | None = None,
    progress: Progress | None = None,
) -> Job:
    """The job of ``request``, not started (the daemon's client made when not given)."""
    return Job(client or connect_daemon(), request, progress=progress)


def run_job(
    request: JobRequest,
    *,
    client: docker.DockerClient | None = None,
    progress: Progress | None = None,
) -> tuple[JobRecord, str | None]:
    """Runs one job to its end state; returns its record and its diff (None without one)."""
    job = make_job(request, client=client, progress=progress)
    return job.run(), job.diff


# -- what controllers that are gone left ----------------------------------------------------


def settle(client: docker.DockerClient | None, store: JobStore | None = None) -> None:
    """What controllers that are gone left behind: an apply or a revert they did not finish
    is settled from the journal and every record says what the work tree holds
    (:mod:`controller.jobs.settle`), their active jobs end ``failed`` with ``INTERRUPTED``,
    and (when the daemon answers, ``client``) their containers, claims and temp folders are
    removed. Every front door calls it before it starts work or reads jobs."""
    store = store or JobStore()
    records = store.all()
    journal: Journal | None = None
    journaled: set[str] = set()
    if (patchbox_home() / "journal").is_dir():  # else nothing was ever applied here
        journal = Journal()
        journaled = set(journal.jobs())
    for record in records:
        with contextlib.suppress(OSError, ValueError, PatchboxError):
            current = record
            if record.job_id in journaled:
                current = settled(store, record, journal)
            if current.state in ACTIVE:
                mark_interrupted(store, current)
    if client is not None:
        reap(client, patchbox_home() / "tmp")


def settle_leftovers(connect: Callable[[], docker.DockerClient] | None = None) -> None:
    """:func:`settle` with a client of the daemon (``connect``, default the environment's
    daemon), or without one (the job records only) when the daemon does not answer."""
    try:
        client = connect() if connect is not None else connect_daemon(timeout=30.0)
    except NotReadyError:
        settle(None)
        return
    try:
        settle(client)
    finally:
        client.close()


# -- after the decision ----------------------------------------------------------------------


def apply_job(
    job_id: str,
    *,
    merge: bool = False,
    config: HostConfig | None = None,
    pin: RepoPin | None = None,
) -> tuple[JobRecord, ApplyResult]:
    """Applies a job awaiting review to its work tree, all or nothing (``APPLY_CONFLICT``
    naming the files otherwise; with ``merge``, files changed meanwhile merge three-way).
    ``pin``: a service job's repository, verified first and written only as the folder
    pinned (``REPO_NOT_ALLOWED``, nothing written, otherwise)."""
    store = JobStore()
    with held(store, job_id, pin=pin) as record:
        if record.state != "awaiting_review":
            msg = f"job {record.job_id} is {record.state}; only a job awaiting review is applied"
            raise UsageError(msg)
        if record.baseline is None:
            msg = f"job {record.job_id} has no baseline"
            raise UsageError(msg)
        diff = job_diff(store, record.job_id) or ""
        with write_lock(record.repo):
            result = apply_changeset(
                record.baseline,
                diff,
                job_id=record.job_id,
                allowed_paths=record.allowed_paths,
                extra_protected=tuple((config or load_config()).protected),
                merge=merge,
                pin=pin,
            )
        record.move("applied")
        decision = record.decision or Decision(mode=record.mode, reason="no decision was recorded")
        record.decision = decision.model_copy(
            update={"applied_by": "user", "merged": result.merged}
        )
        store.save(record)
        fault_point("apply.recorded")
        write_evidence(record, diff, store)
    return record, result


class RemoteOrigin(BaseModel):
    """Where a diff applied with :func:`apply_remote_diff` came from (kept in the local
    job's ``diagnostics["remote"]``; shown, never trusted)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    server: str
    job_id: str
    bundle: str


def apply_remote_diff(  # noqa: PLR0913 - the diff, where it applies, keyword-only rules
    repo: Path,
    diff: str | bytes,
    commit: str,
    *,
    origin: RemoteOrigin,
    allowed_paths: list[str] | None = None,
    merge: bool = False,
    config: HostConfig | None = None,
) -> tuple[JobRecord, ApplyResult]:
    """Applies a diff made elsewhere on ``commit`` (a service's bundle job) to the work tree
    of ``repo`` as :func:`apply_job` applies a local job: the baseline is ``commit``'s tree
    (``APPLY_CONFLICT`` when the repository does not have it), then
    :func:`controller.changes.apply.apply_changeset` with every rule of a local job (the
    protected paths of ``config``, config paths only as ``allowed_paths`` names them,
    links, modes, sizes), the touched paths' check on the work tree and the journal.

    The apply is a local job of its own (a new id, ``diagnostics["remote"]`` says where it
    came from): ``patchbox jobs`` lists it, ``patchbox revert`` undoes it. It is recorded
    (``awaiting_review``, with its diff) before the apply starts; when the apply is refused
    before it wrote anything (``CHANGESET_INVALID``, ``APPLY_CONFLICT``, ...) the record is
    removed again, so a refused diff leaves nothing behind."""
    config = config or load_config()
    baseline = commit_baseline(repo, commit)
    if baseline is None:
        msg = (
            f"cannot apply: the diff was made on commit {commit[:12]}, which this repository "
            "does not have (fetch it, or apply in the repository the job was sent from); "
            "nothing was written"
        )
        raise ApplyConflictError([], msg)
    raw = diff.encode("utf-8", "surrogateescape") if isinstance(diff, str) else diff
    text = raw.decode("utf-8", "surrogateescape")
    store = JobStore()
    task: dict[str, list[str]] = {} if allowed_paths is None else {"allowed_paths": allowed_paths}
    record = JobRecord(
        job_id=new_job_id(),
        repo=baseline.repo,
        state="awaiting_review",
        task=task,
        baseline=baseline,
        diagnostics={"remote": origin.model_dump()},
        diff_sha256=hashlib.sha256(raw).hexdigest(),
    )
    record.history = [("awaiting_review", record.created_at)]
    store.save(record)
    write_evidence(record, text, store)
    try:
        with write_lock(record.repo):
            result = apply_changeset(
                baseline,
                raw,
                job_id=record.job_id,
                allowed_paths=record.allowed_paths,
                extra_protected=tuple(config.protected),
                merge=merge,
            )
    except BaseException:
        if Journal().phase(record.job_id) == "none":  # nothing was written: nothing kept
            shutil.rmtree(store.folder(record.job_id), ignore_errors=True)
        raise
    record.files = [
        FileChange.model_validate(f.model_dump(include=set(FileChange.model_fields)))
        for f in result.changeset.files
    ]
    record.move("applied")
    reason = f"the diff of job {origin.job_id} on {origin.server}"
    record.decision = Decision(
        mode=record.mode, reason=reason, applied_by="user", merged=result.merged
    )
    store.save(record)
    write_evidence(record, text, store)
    return record, result


def revert_job(job_id: str, *, pin: RepoPin | None = None) -> tuple[JobRecord, RevertResult]:
    """Undoes an applied job exactly (``REVERT_CONFLICT`` when a touched path changed);
    ``pin`` as for :func:`apply_job`."""
    store = JobStore()
    with held(store, job_id, pin=pin) as record:
        if record.state != "applied":
            msg = f"job {record.job_id} is {record.state}; only an applied job is reverted"
            raise UsageError(msg)
        with write_lock(record.repo):
            result = revert_changeset(record.job_id, pin=pin)
        record.move("reverted")
        store.save(record)
        fault_point("revert.recorded")
        write_evidence(record, job_diff(store, record.job_id), store)
    return record, result


DISCARDABLE = frozenset({"awaiting_review", "no_change", "failed", "cancelled"})


def discard_job(job_id: str, *, pin: RepoPin | None = None) -> JobRecord:
    """Drops a job awaiting review, with no change, failed or cancelled; the repository is
    not touched.
    ``pin``: a service job's repository path must still lead inside its tenant's roots, or
    nowhere (:meth:`~controller.repo.pin.RepoPin.check_roots`; ``REPO_NOT_ALLOWED``
    otherwise)."""
    store = JobStore()
    with held(store, job_id, pin=pin) as record:
        if record.state not in DISCARDABLE:
            msg = (
                f"job {record.job_id} is {record.state}; only a job awaiting review, with no "
                "change, failed or cancelled is discarded"
            )
            raise UsageError(msg)
        if pin is not None:
            pin.check_roots()
        record.move("discarded")
        store.save(record)
        write_evidence(record, job_diff(store, record.job_id), store)
    return record


def job(job_id: str) -> JobRecord:
    """A job's record (``USAGE_ERROR`` for an unknown id), settled with the journal first
    (:mod:`controller.jobs.settle`): its state says what the work tree holds."""
    store = JobStore()
    return settled(store, store.load(job_id))
