"""The handlers of the service's routes: submit, upload a bundle, list, view, diff,
evidence, events (server-sent), cancel, apply, revert, discard; health, metrics and the
OpenAPI document. Each takes the :class:`controller.service.state.Service` and the request;
a refusal is raised (:func:`controller.service.state.refused`) and answered by the
application's one error answer."""

from __future__ import annotations

import asyncio
import json
import re
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path

import anyio.to_thread
from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from controller import api, strictjson
from controller.api.views import ApplyView, BundleRef, DiscardView, RevertView, job_diff
from controller.config.host import HostConfig
from controller.config.task import TaskSpec
from controller.errors import ErrorCode, PatchboxError
from controller.jobs.store import ATTESTATIONS, JobStore
from controller.provenance.keys import public_pem
from controller.providers.base import MAX_JSON_DEPTH
from controller.providers.scripted import CallsFile, parse_calls
from controller.repo.pin import RepoPin
from controller.sandbox.labels import new_job_id
from controller.service.bundles import TreeLimits, bundle_path, sweep, verify_bundle
from controller.service.config import TenantConfig
from controller.service.metrics import metrics_text
from controller.service.openapi import OPENAPI
from controller.service.policy import check_containers, check_egress_of, check_task
from controller.service.state import Service, bundle_of, refused, repo_of
from controller.service.store import (
    PENDING_STATES,
    QUEUED,
    Bundle,
    JobRow,
    StoredRequest,
    now,
)

MAX_BODY_BYTES = 2 * 1024 * 1024
"""The largest request body: a task (1 MiB at most) and a calls file."""
MAX_BODY_DEPTH = MAX_JSON_DEPTH + 1
"""The deepest nesting of a request body: a calls file's (in the body's ``calls``)."""
EVENT_ID = re.compile(r"[0-9]{1,18}")
"""A ``Last-Event-ID``: ASCII digits only (``str.isdigit`` also takes ``²`` and ``٣``)."""
SSE_POLL_SECONDS = 0.2
SSE_KEEPALIVE_SECONDS = 15.0


Handler = Callable[[Service, Request], Awaitable[Response]]


async def body_of(request: Request) -> dict[str, object]:
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():  # read no more than the limit
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            msg = f"the body is larger than {MAX_BODY_BYTES} bytes"
            raise refused(413, "BAD_REQUEST", msg)
        chunks.append(chunk)
    raw = b"".join(chunks)
    try:  # the one strict decoder: bounded nesting, so no RecursionError on any later step
        data = strictjson.loads(raw or b"null", max_depth=MAX_BODY_DEPTH)
    except strictjson.StrictJSONError as exc:
        raise refused(400, "BAD_REQUEST", f"the body is refused: {exc}") from None
    except ValueError:
        raise refused(400, "BAD_REQUEST", "the body is not valid JSON") from None
    if not isinstance(data, dict):
        raise refused(400, "BAD_REQUEST", "the body must be a JSON object")
    return data


SUBMIT_KEYS = frozenset({"repo", "bundle", "task", "calls", "include_local_changes", "from"})


async def submit(service: Service, request: Request) -> Response:
    """``POST /v1/jobs``: a new job on a repository or a bundle, or a follow-up (``from``)."""
    tenant: TenantConfig = request.state.tenant
    body = await body_of(request)
    unknown = sorted(set(body) - SUBMIT_KEYS)
    if unknown:
        raise refused(400, "BAD_REQUEST", f"unknown fields: {', '.join(unknown)[:200]}")
    if "from" in body:
        return await _follow_up(service, tenant, body)
    return await _submit_new(service, tenant, body)


async def _submit_new(
    service: Service, tenant: TenantConfig, body: Mapping[str, object]
) -> Response:
    repo, task, bundle_id = body.get("repo"), body.get("task"), body.get("bundle")
    if (repo is None) == (bundle_id is None) or not isinstance(task, dict):
        msg = (
            "repo (a path) or bundle (an uploaded bundle's id), and task (an object), are required"
        )
        raise refused(400, "BAD_REQUEST", msg)
    local = body.get("include_local_changes", False)
    if not isinstance(local, bool):
        raise refused(400, "BAD_REQUEST", "include_local_changes must be a boolean")
    bundle: Bundle | None = None
    pin: RepoPin | None = None
    if bundle_id is not None:
        if not isinstance(bundle_id, str) or local:
            msg = "bundle must be an uploaded bundle's id; a bundle job has no local changes"
            raise refused(400, "BAD_REQUEST", msg)
        bundle = service.own_bundle(tenant, bundle_id)
    else:
        if not isinstance(repo, str) or "\0" in repo or len(repo) > 4096:
            raise refused(400, "BAD_REQUEST", "repo must be an absolute path")
        if not Path(repo).is_absolute():
            raise refused(400, "BAD_REQUEST", "repo must be an absolute path")
        pin = await anyio.to_thread.run_sync(service.allowed_repo, tenant, repo)
    spec, calls = _validate_task(task, body.get("calls"), service.host, tenant)
    job_id = new_job_id()
    if pin is not None:
        real = pin.path
        stored = StoredRequest(
            task=spec,
            calls=calls,
            include_local_changes=local,
            repo=real,
            pin=pin.record(),
        )
    else:  # a bundle: checked out by the worker that starts the job
        assert bundle is not None  # noqa: S101 - a repo or a bundle, checked above
        real = service.clone_of(tenant.name, job_id)
        stored = StoredRequest(
            task=spec, calls=calls, bundle=bundle.bundle_id, bundle_head=bundle.head
        )
    return await _queue(service, tenant, JobRow(job_id, tenant.name, real, stored, QUEUED, now()))


async def _queue(
    service: Service, tenant: TenantConfig, row: JobRow, parent: str | None = None
) -> Response:
    """Queues ``row`` within the tenant's ``max_queued_jobs`` (429 ``QUOTA_EXCEEDED``
    otherwise) and starts it if a worker is free: 202 ``{"job_id", "status"}``, and
    ``parent`` for a rebase or a follow-up."""
    if not service.store.insert_job_within(row, tenant.max_queued_jobs):
        msg = (
            f"tenant {tenant.name!r} has {tenant.max_queued_jobs} jobs queued or running "
            f"(max_queued_jobs = {tenant.max_queued_jobs})"
        )
        raise refused(429, "QUOTA_EXCEEDED", msg)
    await anyio.to_thread.run_sync(service.runner.dispatch)
    current = service.store.get_job(row.job_id)
    body = {"job_id": row.job_id, "status": current.state if current is not None else QUEUED}
    if parent is not None:
        body["parent"] = parent
    return JSONResponse(body, status_code=202)


async def _follow_up(
    service: Service, tenant: TenantConfig, body: Mapping[str, object]
) -> Response:
    """``POST /v1/jobs`` with ``from``: a follow-up of one of the tenant's jobs (awaiting
    review or applied), on that job's repository; ``task`` holds the fields that change
    (its prompt at least), over the earlier job's task."""
    parent_id, task = body.get("from"), body.get("task")
    if not isinstance(parent_id, str) or not isinstance(task, dict):
        raise refused(400, "BAD_REQUEST", "from (a job id) and task (an object) are required")
    if "repo" in body or "bundle" in body or "include_local_changes" in body:
        msg = "a follow-up runs on its earlier job's repository: no repo, bundle or options"
        raise refused(400, "BAD_REQUEST", msg)
    parent = service.own_job(tenant, parent_id)
    if parent.request.bundle:
        msg = f"job {parent.job_id} ran on an uploaded bundle: it has no follow-up here"
        raise refused(409, "NO_WORK_TREE", msg)
    # refused now if it cannot be: not awaiting review or applied, stale
    await anyio.to_thread.run_sync(api.follow_up, parent.job_id)
    merged = {**parent.request.task.model_dump(mode="json"), **task}
    spec, calls = _validate_task(merged, body.get("calls"), service.host, tenant)
    stored = parent.request.model_copy(
        update={"task": spec, "calls": calls, "rebase_of": None, "follow_of": parent.job_id}
    )
    row = JobRow(new_job_id(), tenant.name, parent.repo, stored, QUEUED, now())
    return await _queue(service, tenant, row, parent.job_id)


async def upload_bundle(service: Service, request: Request) -> Response:
    """``POST /v1/bundles``: the raw output of ``git bundle create - HEAD``, at most
    ``bundle_max_bytes``; verified, kept ``bundle_keep_seconds`` for the tenant's jobs."""
    tenant: TenantConfig = request.state.tenant
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/octet-stream":
        msg = "a bundle is sent as application/octet-stream (the output of git bundle create)"
        raise refused(400, "BAD_REQUEST", msg)
    cap = service.config.bundle_max_bytes
    too_large = refused(
        413, "BUNDLE_TOO_LARGE", f"the bundle is larger than {cap} bytes (bundle_max_bytes)"
    )
    length = request.headers.get("content-length", "")
    if length.isascii() and length.isdigit() and int(length) > cap:
        raise too_large
    await anyio.to_thread.run_sync(sweep, service.store, service.config)
    bundle_id = "b" + secrets.token_hex(16)
    final = bundle_path(service.config, tenant.name, bundle_id)
    final.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    part = final.with_suffix(".part")
    size = 0
    try:
        with part.open("xb") as sink:
            async for chunk in request.stream():
                size += len(chunk)
                if size > cap:
                    raise too_large
                sink.write(chunk)
        if size == 0:
            raise refused(400, "BUNDLE_INVALID", "the body is empty: send a git bundle")
        scratch = final.parent / f"{bundle_id}.verify"
        limits = TreeLimits.of(service.config)
        try:
            head = await anyio.to_thread.run_sync(verify_bundle, part, scratch, limits)
        except PatchboxError as exc:
            if exc.code is ErrorCode.BUNDLE_TREE_TOO_LARGE:
                raise refused(413, str(exc.code), exc.message) from exc
            raise refused(400, "BUNDLE_INVALID", exc.message) from exc
        part.rename(final)
    finally:
        part.unlink(missing_ok=True)
    service.store.insert_bundle(Bundle(bundle_id, tenant.name, head, size, now()))
    return JSONResponse({"bundle_id": bundle_id, "head": head, "size": size}, status_code=201)


def _validate_task(
    task: object, calls: object, host: HostConfig, tenant: TenantConfig
) -> tuple[TaskSpec, CallsFile | None]:
    """The task (valid, within the tenant's policy: 403 ``TASK_NOT_ALLOWED`` otherwise) and
    its calls, or a usable provider of the operator's."""
    try:
        spec = api.task_from(task)
    except PatchboxError as exc:
        raise refused(400, str(exc.code), exc.message) from exc
    try:
        check_task(spec, tenant)
        check_containers(spec, host, tenant)
        check_egress_of(spec, host.network, tenant)
    except PatchboxError as exc:
        raise refused(403, str(exc.code), exc.message) from exc
    if calls is None:  # the host configuration's provider: it must be configured
        try:
            api.check_provider(host)
        except PatchboxError as exc:
            msg = f"no calls and no usable model provider: {exc.message}"
            raise refused(400, str(exc.code), msg[:1000]) from exc
        return spec, None
    if not isinstance(calls, dict):
        raise refused(400, str(ErrorCode.USAGE_ERROR), "calls must be an object")
    try:
        return spec, parse_calls(json.dumps(calls))
    except PatchboxError as exc:
        raise refused(400, str(exc.code), exc.message) from exc


class ListedJob(BaseModel):
    """One job of ``GET /v1/jobs``: the ``repo`` the tenant sees, the bundle it ran on."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    job_id: str
    status: str
    repo: str
    created: float
    bundle: BundleRef | None = Field(default=None, exclude_if=lambda v: v is None)


async def list_jobs(service: Service, request: Request) -> Response:
    tenant: TenantConfig = request.state.tenant
    jobs = [
        ListedJob(
            job_id=r.job_id, status=r.state, repo=repo_of(r), created=r.created, bundle=bundle_of(r)
        ).model_dump(mode="json")
        for r in service.store.list_jobs(tenant.name)
    ]
    return JSONResponse({"jobs": jobs})


async def get_job(service: Service, request: Request) -> Response:
    row = service.own_job(request.state.tenant, request.path_params["job_id"])
    view = await anyio.to_thread.run_sync(service.view, row)
    return JSONResponse(view.data())


async def get_diff(service: Service, request: Request) -> Response:
    row = service.own_job(request.state.tenant, request.path_params["job_id"])
    return Response(job_diff(JobStore(), row.job_id) or "", media_type="text/x-diff")


async def get_evidence(service: Service, request: Request) -> Response:
    row = service.own_job(request.state.tenant, request.path_params["job_id"])
    path = JobStore().folder(row.job_id) / "evidence.json"
    try:
        data = json.loads(path.read_text("utf-8"))
    except FileNotFoundError:
        msg = f"job {row.job_id} has no evidence yet ({row.state})"
        raise refused(409, "JOB_NOT_FINISHED", msg) from None
    return JSONResponse(data)


async def get_attestations(service: Service, request: Request) -> Response:
    row = service.own_job(request.state.tenant, request.path_params["job_id"])
    path = JobStore().folder(row.job_id) / ATTESTATIONS
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        msg = f"job {row.job_id} has no attestations ({row.state}): a job is signed once "
        msg += "it is decided with a diff"
        raise refused(409, "JOB_NOT_FINISHED", msg) from None
    return Response(data, media_type="application/jsonl")


async def provenance_key(service: Service, _request: Request) -> Response:
    key = service.host.provenance.key
    pem = await anyio.to_thread.run_sync(public_pem, Path(key)) if key else ""
    return Response(pem, media_type="application/x-pem-file")


async def cancel(service: Service, request: Request) -> Response:
    row = service.own_job(request.state.tenant, request.path_params["job_id"])
    state = await anyio.to_thread.run_sync(service.runner.cancel, row.job_id)
    if state is None:
        current = service.store.get_job(row.job_id)
        status = current.state if current is not None else row.state
        return JSONResponse({"job_id": row.job_id, "status": status})
    return JSONResponse({"job_id": row.job_id, "status": state}, status_code=202)


async def rebase(service: Service, request: Request) -> Response:
    """``POST /v1/jobs/{job_id}/rebase``: a new job, queued as any job, that carries this
    job's diff onto its repository as it is now (its ``parent`` is this job)."""
    tenant: TenantConfig = request.state.tenant
    row = service.own_job(tenant, request.path_params["job_id"])
    if row.request.bundle:
        msg = (
            f"job {row.job_id} ran on an uploaded bundle: the service has no repository to "
            "carry it onto; upload a new bundle and submit a new job"
        )
        raise refused(409, "NO_WORK_TREE", msg)
    # refused now if it cannot be: not awaiting review (USAGE_ERROR), rebased (JOB_REBASED)
    await anyio.to_thread.run_sync(lambda: api.rebase_request(row.job_id, config=service.host))
    stored = row.request.model_copy(
        update={"calls": None, "rebase_of": row.job_id, "follow_of": None}
    )
    new = JobRow(new_job_id(), tenant.name, row.repo, stored, QUEUED, now())
    return await _queue(service, tenant, new, row.job_id)


def action(name: str) -> Handler:
    async def handler(service: Service, request: Request) -> Response:
        tenant: TenantConfig = request.state.tenant
        row = service.own_job(tenant, request.path_params["job_id"])
        if name in {"apply", "revert"} and row.request.bundle:
            msg = (
                f"job {row.job_id} ran on an uploaded bundle: the service has no work tree to "
                f"{name} it in; apply its diff to your repository (patchbox remote apply)"
            )
            raise refused(409, "NO_WORK_TREE", msg)
        if name in {"apply", "revert"} and not tenant.allow_apply:
            msg = f"tenant {tenant.name!r} may not {name} jobs (allow_apply = false)"
            raise refused(403, "APPLY_NOT_ALLOWED", msg)
        view = await anyio.to_thread.run_sync(_act, service, name, row)
        if not (isinstance(view, ApplyView) and view.already_applied):  # else no change
            service.store.append_event(row.job_id, "state", {"state": view.status})
            service.store.update_state(row.job_id, view.status)
        return JSONResponse(view.model_dump(mode="json"))

    return handler


def _act(service: Service, name: str, row: JobRow) -> ApplyView | RevertView | DiscardView:
    """Applies, reverts or discards the job; its repository must still be the folder the
    tenant submitted, its git data inside the tenant's roots (``REPO_NOT_ALLOWED``)."""
    job_id, pin = row.job_id, service.pin_of(row)
    if name == "apply":
        return ApplyView.of(*api.apply_job(job_id, config=service.host, pin=pin))
    if name == "revert":
        return RevertView.of(*api.revert_job(job_id, pin=pin))
    return DiscardView.of(api.discard_job(job_id, pin=pin))


async def events(service: Service, request: Request) -> Response:
    row = service.own_job(request.state.tenant, request.path_params["job_id"])
    header = request.headers.get("last-event-id", "0").strip() or "0"
    if not EVENT_ID.fullmatch(header):
        raise refused(400, "BAD_REQUEST", "Last-Event-ID must be an event id")
    return StreamingResponse(
        _stream(service, row.job_id, int(header)),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


async def _stream(service: Service, job_id: str, last: int) -> AsyncIterator[str]:
    """Every event after ``last``, then new ones as they come; ends once the job no longer
    runs (or is queued) and every event was sent, or when the service stops."""
    quiet_since = time.monotonic()
    while True:
        # The state first: a job's events are stored before its state changes, so once the
        # state read here is final, the events read next include the last one.
        row = service.store.get_job(job_id)
        batch = service.store.events_after(job_id, last)
        for event in batch:
            last = event.seq
            data = json.dumps(event.data, sort_keys=True)
            yield f"id: {event.seq}\nevent: {event.type}\ndata: {data}\n\n"
        if batch:
            quiet_since = time.monotonic()
            continue
        if row is None or row.state not in PENDING_STATES or service.stopping.is_set():
            return
        if time.monotonic() - quiet_since > SSE_KEEPALIVE_SECONDS:
            quiet_since = time.monotonic()
            yield ": keep-alive\n\n"
        await asyncio.sleep(SSE_POLL_SECONDS)


async def healthz(service: Service, _request: Request) -> Response:
    return JSONResponse({"status": "stopping" if service.stopping.is_set() else "ok"})


async def metrics(service: Service, request: Request) -> Response:
    """Totals for anybody; the series per tenant (their names) only with the operator's
    ``metrics_token_sha256`` token. Any other token is 401."""
    operator = service.metrics_operator(request)
    tenants = [t.name for t in service.config.tenants]
    text = metrics_text(
        service.store,
        service.metrics,
        tenants,
        service.runner.running_count,
        per_tenant=operator,
    )
    return PlainTextResponse(text, media_type="text/plain; version=0.0.4")


async def openapi(_service: Service, _request: Request) -> Response:
    return JSONResponse(OPENAPI)
