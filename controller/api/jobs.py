"""Jobs through the engine: making and running one from a typed request, the provider a
request's model comes from, settling what controllers that are gone left behind, and, after
the decision, apply, revert and discard (and a diff made elsewhere applied as a local job)."""

from __future__ import annotations

import contextlib
import hashlib
import shutil
import time
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
from controller.jobs.carried import stale_error
from controller.jobs.engine import Job
from controller.jobs.evidence import write_evidence
from controller.jobs.lineage import apply_base
from controller.jobs.records import ACTIVE, Decision, FileChange, JobRecord, StaleMark
from controller.jobs.request import JobRequest
from controller.jobs.settle import held, settled
from controller.jobs.store import JobStore, is_orphaned, mark_interrupted, write_lock
from controller.paths import patchbox_home
from controller.providers import ScriptedProvider, configured_provider, open_provider
from controller.providers.scripted import CallsFile
from controller.repo.baseline import commit_baseline
from controller.sandbox.dockerclient import connect as connect_daemon
from controller.sandbox.labels import new_job_id
from controller.sandbox.reaper import reap
from controller.tools.watch import OutputListener

if TYPE_CHECKING:
    import docker

    from controller.providers.base import Provider
    from controller.providers.config import ProviderConfig
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
    closes it. ``USAGE_ERROR`` naming what is missing or refused when none is usable
    (:func:`check_provider`, the check ``doctor`` makes too)."""
    if calls is not None:
        return ProviderChoice(ScriptedProvider(calls))
    provider_config = check_provider(config)
    key = provider_config.api_key
    secret = key.get_secret_value() if key is not None else ""
    return ProviderChoice(open_provider(provider_config, task.prompt), (secret,) if secret else ())


def check_provider(config: HostConfig) -> ProviderConfig:
    """The operator's model provider as a job takes it, without opening it: the one check
    of ``run``, the service and ``doctor``. ``USAGE_ERROR`` naming what is missing or
    refused (a key over plain http to a host that is not loopback, a bad value)."""
    return configured_provider(config.provider)


def describe_provider(config: HostConfig) -> dict[str, str]:
    """The operator's provider as it may be shown: ``api``, ``endpoint`` (scheme, host and
    port of its base URL), ``model`` and ``key`` (``set`` or ``none``), never the key;
    ``USAGE_ERROR`` naming what is missing when none is configured."""
    return configured_provider(config.provider).public_view()


def make_job(
    request: JobRequest,
    *,
    client: docker.DockerClient | None = None,
    progress: Progress | None = None,
    output: OutputListener | None = None,
) -> Job:
    """The job of ``request``, not started (the daemon's client made when not given);
    ``output`` is told each line of a running check's output as it comes."""
    return Job(client or connect_daemon(), request, progress=progress, output=output)


def run_job(
    request: JobRequest,
    *,
    client: docker.DockerClient | None = None,
    progress: Progress | None = None,
    output: OutputListener | None = None,
) -> tuple[JobRecord, str | None]:
    """Runs one job to its end state; returns its record and its diff (None without one)."""
    job = make_job(request, client=client, progress=progress, output=output)
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


def remove_spares(client: docker.DockerClient | None = None) -> list[str]:
    """Removes this state directory's spare sandboxes that no job is claiming (the daemon's
    client made when not given); returns their short ids."""
    from controller.sandbox.labels import current_identity
    from controller.sandbox.spares import SparePool

    own = client is None
    daemon = client or connect_daemon()
    try:
        return SparePool(daemon).remove_all(current_identity())
    finally:
        if own:
            daemon.close()


# -- after the decision ----------------------------------------------------------------------


APPLICABLE = frozenset({"awaiting_review", "reverted"})
"""The states a job is applied from (a reverted job may be applied again)."""


def apply_job(
    job_id: str,
    *,
    merge: bool = False,
    config: HostConfig | None = None,
    pin: RepoPin | None = None,
) -> tuple[JobRecord, ApplyResult | None]:
    """Applies a job awaiting review (or reverted: applied again, with every check of a
    first apply) to its work tree, all or nothing (``APPLY_CONFLICT`` naming the files
    otherwise; with ``merge``, files changed meanwhile merge three-way). A follow-up is
    applied on what the work tree holds: the increment on its applied parent, else the
    combined change, its ancestors then stale (:mod:`controller.jobs.lineage`). A job that is
    applied already is left as it is: its record and None, nothing written. ``pin``: a
    service job's repository, verified first and written only as the folder pinned
    (``REPO_NOT_ALLOWED``, nothing written, otherwise)."""
    store = JobStore()
    with held(store, job_id, pin=pin) as record:
        if record.state == "applied":
            return record, None
        if record.stale is not None:
            raise stale_error(record, "applied")
        if record.state not in APPLICABLE:
            msg = (
                f"job {record.job_id} is {record.state}; only a job awaiting review or "
                "reverted is applied"
            )
            raise UsageError(msg)
        if record.baseline is None:
            msg = f"job {record.job_id} has no baseline"
            raise UsageError(msg)
        diff = job_diff(store, record.job_id) or ""
        base = apply_base(store, record, diff)  # a follow-up: on what the work tree holds
        with write_lock(record.repo, holder=record.job_id):
            result = apply_changeset(
                base.baseline,
                base.diff,
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
    for ancestor in base.ancestors:  # their change is applied, with this one's
        with held(store, ancestor.job_id) as parent:
            if parent.stale is None:
                parent.stale = StaleMark(by=record.job_id, reason="followed_up", at=time.time())
                store.save(parent)
    gone = discard_siblings(record)
    return record, result.model_copy(update={"discarded": gone}) if gone else result


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
        with write_lock(record.repo, holder=record.job_id):
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


def remote_applies(server: str, job_id: str, repo: Path | None = None) -> list[JobRecord]:
    """The local jobs :func:`apply_remote_diff` made of the diff of job ``job_id`` on
    ``server`` (in ``repo`` only, when given), oldest first, each settled with the journal
    (its state says what the work tree holds)."""
    store = JobStore()
    top = str(repo.resolve()) if repo is not None else None
    wanted = {"server": server, "job_id": job_id}
    found = []
    for record in store.all(top):
        origin = record.diagnostics.get("remote")
        if isinstance(origin, dict) and all(origin.get(k) == v for k, v in wanted.items()):
            found.append(settled(store, record))
    return found


def revert_job(job_id: str, *, pin: RepoPin | None = None) -> tuple[JobRecord, RevertResult]:
    """Undoes an applied job exactly (``REVERT_CONFLICT`` when a touched path changed);
    ``pin`` as for :func:`apply_job`."""
    store = JobStore()
    with held(store, job_id, pin=pin) as record:
        if record.state != "applied":
            msg = f"job {record.job_id} is {record.state}; only an applied job is reverted"
            raise UsageError(msg)
        with write_lock(record.repo, holder=record.job_id):
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


OPEN_ATTEMPT = frozenset({"awaiting_review", "no_change", "failed", "cancelled"})
"""The attempts a chosen one's apply discards (those no one applied or discarded)."""


def discard_siblings(record: JobRecord) -> list[str]:
    """After ``record`` (one of N attempts, ``run --attempts``) was applied: the other
    attempts still open are discarded (their repository is not touched); their ids."""
    if record.attempt is None:
        return []
    store, gone = JobStore(), []
    for job_id in record.attempt.job_ids:
        if job_id == record.job_id:
            continue
        with contextlib.suppress(PatchboxError):
            if store.load(job_id).state in OPEN_ATTEMPT:
                discard_job(job_id)
                gone.append(job_id)
    return gone


def resolve_job(ref: str) -> str:
    """The id of the job ``ref`` names in this state folder: a whole id, a prefix only one
    job's id starts with, or ``last`` (the job created last); ``USAGE_ERROR`` naming the
    state folder when there is none, or listing the candidates of an ambiguous prefix."""
    return JobStore().resolve(ref)


CANCEL_WAIT_SECONDS = 60.0
"""How long :func:`cancel_job` waits for the job to end by default."""


def cancel_job(job_id: str, *, wait: float = CANCEL_WAIT_SECONDS) -> JobRecord:
    """Cancels a running job of this state folder, whichever process runs it: a cancel
    request its engine watches (:meth:`JobStore.request_cancel`), then up to ``wait``
    seconds for it to end (``cancelled``, its sandboxes removed, the repository's lock
    released). Returns the record as it is then: still active if it did not end in time,
    or in the state it reached first (a job that finished meanwhile). ``USAGE_ERROR`` for a
    job that is not running; one whose controller is gone ends ``failed`` with
    ``INTERRUPTED`` and is refused too."""
    store = JobStore()
    record = mark_interrupted(store, settled(store, store.load(job_id)))
    if record.state not in ACTIVE:
        msg = f"job {record.job_id} is {record.state}; only a running job is cancelled"
        if record.error is not None and record.error.code == "INTERRUPTED":
            msg += " (its controller is gone)"
        raise UsageError(msg)
    store.request_cancel(record.job_id)
    deadline = time.monotonic() + wait
    while record.state in ACTIVE and time.monotonic() < deadline:
        time.sleep(0.1)
        record = store.load(record.job_id)
        if record.state in ACTIVE and is_orphaned(record):
            return mark_interrupted(store, record)
    return record


def job(job_id: str) -> JobRecord:
    """A job's record (``USAGE_ERROR`` for an unknown id), settled with the journal first
    (:mod:`controller.jobs.settle`): its state says what the work tree holds."""
    store = JobStore()
    return settled(store, store.load(job_id))
