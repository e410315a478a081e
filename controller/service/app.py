"""The Starlette application of ``patchbox serve``: the ``/v1`` API, health, metrics and the
OpenAPI document. Every error body is ``{"error": {"code", "message"}}``."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import os
import re
import secrets
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio.to_thread
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from controller import api, strictjson
from controller.api.views import BundleRef, JobView, job_diff, job_view
from controller.config.host import HostConfig
from controller.config.task import TaskSpec
from controller.errors import ErrorCode, Hint, PatchboxError, ServiceError
from controller.jobs.evidence import relative_to_home
from controller.jobs.records import JobStore
from controller.jobs.settle import settled
from controller.logs import Scrubber
from controller.providers.base import MAX_JSON_DEPTH
from controller.providers.scripted import CallsFile, parse_calls
from controller.repo.pin import RepoPin, pin_repo
from controller.sandbox.labels import new_job_id
from controller.service.bundles import (
    BUNDLE_ID,
    TreeLimits,
    bundle_path,
    clone_path,
    sweep,
    verify_bundle,
)
from controller.service.config import ServiceConfig, TenantConfig
from controller.service.hints import hint_data
from controller.service.metrics import Metrics, metrics_text
from controller.service.openapi import OPENAPI
from controller.service.policy import check_task
from controller.service.runner import Runner, pin_of
from controller.service.store import (
    PENDING_STATES,
    QUEUED,
    Bundle,
    JobRow,
    ServiceStore,
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


def refused(status: int, code: str, message: str) -> ServiceError:
    """The error answer of a refused request: ``code`` (an :class:`ErrorCode`) with its HTTP
    ``status``; the same error a client of the service raises for it."""
    return ServiceError(message, code=ErrorCode(code), status=status)


def error_response(status: int, code: str, message: str, hint: Hint | None = None) -> JSONResponse:
    """The error answer ``{"error": {"code", "message"}}``, with ``hint`` (the remedy in the
    API's words) when there is one."""
    error: dict[str, Any] = {"code": code, "message": message}
    if (data := hint_data(hint)) is not None:
        error["hint"] = data
    return JSONResponse({"error": error}, status_code=status)


class Service:
    """The application's state: configuration, store, runner and metrics."""

    def __init__(
        self, store: ServiceStore, host: HostConfig, service: ServiceConfig, runner: Runner
    ) -> None:
        self.store = store
        self.host = host
        self.config = service
        self.runner = runner
        self.metrics = Metrics()
        self.stopping = threading.Event()

    # -- who and what ---------------------------------------------------------------------

    def tenant_of(self, request: Request) -> TenantConfig:
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise refused(401, "UNAUTHORIZED", "a bearer token is required")
        digest = hashlib.sha256(token.strip().encode("utf-8", "surrogatepass")).hexdigest()
        found = None
        for tenant in self.config.tenants:
            if hmac.compare_digest(digest, tenant.token_sha256):
                found = tenant
        if found is None:
            raise refused(401, "UNAUTHORIZED", "the bearer token is not valid")
        return found

    def metrics_operator(self, request: Request) -> bool:
        """Whether ``request`` has the operator's metrics token (False without a token;
        401 for any other token, a tenant's included)."""
        header = request.headers.get("authorization", "")
        if not header:
            return False
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise refused(401, "UNAUTHORIZED", "the metrics token is sent as a bearer token")
        expected = self.config.metrics_token_sha256
        if expected is None:
            msg = "no metrics token is configured (metrics_token_sha256): ask without a token"
            raise refused(401, "UNAUTHORIZED", msg)
        digest = hashlib.sha256(token.strip().encode("utf-8", "surrogatepass")).hexdigest()
        if not hmac.compare_digest(digest, expected):
            raise refused(401, "UNAUTHORIZED", "the bearer token is not the metrics token")
        return True

    def own_job(self, tenant: TenantConfig, job_id: str) -> JobRow:
        row = self.store.get_job(job_id)
        if row is None or row.tenant != tenant.name:
            raise refused(404, "NOT_FOUND", f"no job {job_id[:64]!r}")
        return row

    def own_bundle(self, tenant: TenantConfig, bundle_id: str) -> Bundle:
        found = self.store.get_bundle(bundle_id) if BUNDLE_ID.match(bundle_id) else None
        if found is None or found.tenant != tenant.name:
            raise refused(404, "NOT_FOUND", f"no bundle {bundle_id[:64]!r}")
        return found

    def allowed_repo(self, tenant: TenantConfig, repo: str) -> RepoPin:
        """The repository, resolved below one of the tenant's roots and pinned, its git data
        checked (:mod:`controller.repo.pin`): ``REPO_NOT_ALLOWED`` (403) otherwise."""
        pin = pin_repo(self.runner.confinements[tenant.name], repo)
        pin.verify()
        return pin

    def pin_of(self, row: JobRow) -> RepoPin | None:
        """A job's pin (None for a bundle job): what apply, revert and discard check."""
        return pin_of(self.runner.confinements[row.tenant], row)

    # -- views ----------------------------------------------------------------------------

    def view(self, row: JobRow) -> JobView:
        """The job's view (the object ``run --json`` prints), settled from the journal
        through the job's pin; before a worker made its record, its state and the error
        it could not start with."""
        store = JobStore()
        bundle = bundle_of(row)
        try:
            record = settled(store, store.load(row.job_id), pin=self.pin_of(row))
        except PatchboxError:
            errors = [
                e.data["error"] for e in self.store.events_after(row.job_id, 0) if "error" in e.data
            ]
            return JobView(
                job_id=row.job_id,
                status=row.state,
                error=errors[-1] if errors else None,
                files=[],
                control_characters=[],
                checks=[],
                tool_calls=[],
                evidence="",
                decision=None,
                diff="",
                bundle=bundle,
            )
        evidence = store.folder(row.job_id) / "evidence.json"
        where = relative_to_home(evidence) if evidence.is_file() else ""
        view = job_view(record, job_diff(store, row.job_id), where)
        if bundle is not None:  # the clone's path is the service's, not the tenant's
            shown = Scrubber(row.repo).value(view.model_dump(mode="json", exclude={"diff"}))
            view = JobView.model_validate({**shown, "diff": view.diff})
        return view.model_copy(update={"bundle": bundle})

    def clone_of(self, tenant: str, job_id: str) -> str:
        """Where a bundle job's clone will be (its worker checks the bundle out there)."""
        return os.path.realpath(clone_path(self.config, tenant, job_id))

    def hide_paths(self, message: str) -> str:
        """``message`` without the service's own folder (``data_dir``): a tenant never
        learns where the service keeps bundles and clones."""
        data = self.config.data_path()
        for path in sorted({str(data), os.path.realpath(data)}, key=len, reverse=True):
            message = message.replace(path, "<data_dir>")
        return message


def bundle_of(row: JobRow) -> BundleRef | None:
    """The bundle a job ran on (None for a job on a tenant's repository)."""
    bundle = row.request.bundle
    return BundleRef(id=bundle, head=row.request.bundle_head or "") if bundle else None


def repo_of(row: JobRow) -> str:
    """The ``repo`` a tenant sees: its repository's path, or ``bundle:ID`` for a job on an
    uploaded bundle (whose clone is in the service's own folder)."""
    bundle = row.request.bundle
    return f"bundle:{bundle}" if bundle else row.repo


def diff_of(job_id: str) -> str:
    return job_diff(JobStore(), job_id) or ""


Handler = Callable[[Service, Request], Awaitable[Response]]


def endpoint(route: str, handler: Handler, *, auth: bool = True) -> Callable[..., Any]:
    """Wraps a handler: the service from the app state, errors as JSON, request counts."""

    async def wrapped(request: Request) -> Response:
        service: Service = request.app.state.service
        try:
            if auth:
                request.state.tenant = service.tenant_of(request)
            response = await handler(service, request)
        except ServiceError as exc:
            response = error_response(exc.status, exc.code, service.hide_paths(exc.message))
        except PatchboxError as exc:
            status = STATUS_OF.get(exc.code, 400)
            message = service.hide_paths(Scrubber("", paths=False).text(exc.message))
            response = error_response(status, str(exc.code), message, exc.hint)
        except Exception as exc:  # never a bare 500: the error shape and a crash report
            from controller.crash import internal_message, write_report

            report = write_report(exc, context=f"service {request.method} {route}")
            message = internal_message(exc, report)
            response = error_response(500, str(ErrorCode.INTERNAL_ERROR), message)
        service.metrics.count(request.method, route, response.status_code)
        return response

    return wrapped


STATUS_OF = {
    ErrorCode.USAGE_ERROR: 409,
    ErrorCode.APPLY_CONFLICT: 409,
    ErrorCode.REVERT_CONFLICT: 409,
    ErrorCode.JOB_ALREADY_RUNNING: 409,
    ErrorCode.ENVIRONMENT_NOT_READY: 503,
    ErrorCode.INTERNAL_ERROR: 500,
    ErrorCode.REPO_NOT_ALLOWED: 403,
    ErrorCode.BUNDLE_TREE_TOO_LARGE: 413,
}
"""The HTTP status of an engine error raised by an action on a job (400 for the others): a
job in the wrong state, a changed work tree or a busy repository is a conflict; a
repository that is no longer the one submitted is refused."""


async def body_of(request: Request) -> dict[str, Any]:
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


# -- handlers ----------------------------------------------------------------------------

SUBMIT_KEYS = frozenset({"repo", "bundle", "task", "calls", "include_local_changes"})


async def submit(service: Service, request: Request) -> Response:
    tenant: TenantConfig = request.state.tenant
    body = await body_of(request)
    unknown = sorted(set(body) - SUBMIT_KEYS)
    if unknown:
        raise refused(400, "BAD_REQUEST", f"unknown fields: {', '.join(unknown)[:200]}")
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
    row = JobRow(job_id, tenant.name, real, stored, QUEUED, now())
    if not service.store.insert_job_within(row, tenant.max_queued_jobs):
        msg = (
            f"tenant {tenant.name!r} has {tenant.max_queued_jobs} jobs queued or running "
            f"(max_queued_jobs = {tenant.max_queued_jobs})"
        )
        raise refused(429, "QUOTA_EXCEEDED", msg)
    await anyio.to_thread.run_sync(service.runner.dispatch)
    current = service.store.get_job(row.job_id)
    status = current.state if current is not None else QUEUED
    return JSONResponse({"job_id": row.job_id, "status": status}, status_code=202)


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


async def list_jobs(service: Service, request: Request) -> Response:
    tenant: TenantConfig = request.state.tenant
    rows = service.store.list_jobs(tenant.name)
    jobs = []
    for r in rows:
        item: dict[str, Any] = {
            "job_id": r.job_id,
            "status": r.state,
            "repo": repo_of(r),
            "created": r.created,
        }
        bundle = bundle_of(r)
        if bundle is not None:
            item["bundle"] = bundle.model_dump()
        jobs.append(item)
    return JSONResponse({"jobs": jobs})


async def get_job(service: Service, request: Request) -> Response:
    row = service.own_job(request.state.tenant, request.path_params["job_id"])
    view = await anyio.to_thread.run_sync(service.view, row)
    return JSONResponse(view.data())


async def get_diff(service: Service, request: Request) -> Response:
    row = service.own_job(request.state.tenant, request.path_params["job_id"])
    return Response(diff_of(row.job_id), media_type="text/x-diff")


async def get_evidence(service: Service, request: Request) -> Response:
    row = service.own_job(request.state.tenant, request.path_params["job_id"])
    path = JobStore().folder(row.job_id) / "evidence.json"
    try:
        data = json.loads(path.read_text("utf-8"))
    except FileNotFoundError:
        msg = f"job {row.job_id} has no evidence yet ({row.state})"
        raise refused(409, "JOB_NOT_FINISHED", msg) from None
    return JSONResponse(data)


async def cancel(service: Service, request: Request) -> Response:
    row = service.own_job(request.state.tenant, request.path_params["job_id"])
    state = await anyio.to_thread.run_sync(service.runner.cancel, row.job_id)
    if state is None:
        current = service.store.get_job(row.job_id)
        status = current.state if current is not None else row.state
        return JSONResponse({"job_id": row.job_id, "status": status})
    return JSONResponse({"job_id": row.job_id, "status": state}, status_code=202)


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
        data = await anyio.to_thread.run_sync(_act, service, name, row)
        service.store.append_event(row.job_id, "state", {"state": data["status"]})
        service.store.update_state(row.job_id, data["status"])
        return JSONResponse(data)

    return handler


def _act(service: Service, name: str, row: JobRow) -> dict[str, Any]:
    """Applies, reverts or discards the job; its repository must still be the folder the
    tenant submitted, its git data inside the tenant's roots (``REPO_NOT_ALLOWED``)."""
    from controller import api

    job_id, pin = row.job_id, service.pin_of(row)
    if name == "apply":
        record, applied = api.apply_job(job_id, config=service.host, pin=pin)
        files = [f.model_dump(mode="json") for f in applied.files]
        return {"job_id": job_id, "status": record.state, "files": files, "merged": applied.merged}
    if name == "revert":
        record, reverted = api.revert_job(job_id, pin=pin)
        files = [f.model_dump(mode="json") for f in reverted.files]
        return {"job_id": job_id, "status": record.state, "files": files}
    record = api.discard_job(job_id, pin=pin)
    return {"job_id": job_id, "status": record.state}


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


# -- the application ---------------------------------------------------------------------

JOB = "/v1/jobs/{job_id}"
ROUTES: list[tuple[str, str, Handler, bool]] = [
    ("/healthz", "GET", healthz, False),
    ("/metrics", "GET", metrics, False),
    ("/openapi.json", "GET", openapi, False),
    ("/v1/jobs", "POST", submit, True),
    ("/v1/jobs", "GET", list_jobs, True),
    ("/v1/bundles", "POST", upload_bundle, True),
    (JOB, "GET", get_job, True),
    (JOB + "/diff", "GET", get_diff, True),
    (JOB + "/evidence", "GET", get_evidence, True),
    (JOB + "/events", "GET", events, True),
    (JOB + "/cancel", "POST", cancel, True),
    (JOB + "/apply", "POST", action("apply"), True),
    (JOB + "/revert", "POST", action("revert"), True),
    (JOB + "/discard", "POST", action("discard"), True),
]


async def _http_error(request: Request, exc: Exception) -> Response:
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    code = {404: "NOT_FOUND", 405: "METHOD_NOT_ALLOWED"}.get(status, "BAD_REQUEST")
    service: Service = request.app.state.service
    service.metrics.count(request.method, "unmatched", status)
    return error_response(status, code, f"{request.method} {request.url.path[:200]}: {code}")


def create_app(service: Service, *, shutdown_timeout: float = 60.0) -> Starlette:
    """The application; its lifespan starts the runner and, at shutdown, cancels the
    running jobs and waits up to ``shutdown_timeout`` seconds for them."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        app.state.service = service
        await anyio.to_thread.run_sync(service.runner.start)
        try:
            yield
        finally:
            service.stopping.set()
            await anyio.to_thread.run_sync(service.runner.shutdown, shutdown_timeout)
            service.store.close()

    routes = [
        Route(path, endpoint(path, handler, auth=auth), methods=[method])
        for path, method, handler, auth in ROUTES
    ]
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={HTTPException: _http_error},
    )
    app.state.service = service
    return app


def build(
    config_path: Path | None = None, *, shutdown_timeout: float = 60.0
) -> tuple[Starlette, Service]:
    """The application for a configuration file (``--config``, default
    ``$PATCHBOX_HOME/config.toml``)."""
    from controller.service.config import load_service_config
    from controller.service.store import SqliteStore

    host, config = load_service_config(config_path)
    store = SqliteStore(config.database_path())
    service = Service(store, host, config, Runner(store, host, config))
    return create_app(service, shutdown_timeout=shutdown_timeout), service


def serve(config_path: Path | None, host: str, port: int) -> None:
    """Runs the service with uvicorn until SIGINT or SIGTERM."""
    import uvicorn

    from controller.service.server import server_config

    app, service = build(config_path)

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            service.stopping.set()  # event streams end now, not at the graceful timeout
            super().handle_exit(sig, frame)

    config = server_config(
        app, service.config, host=host, port=port, log_level="info", timeout_graceful_shutdown=10
    )
    Server(config).run()
