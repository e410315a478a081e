"""The Starlette application of ``patchbox serve``: the ``/v1`` routes, health, metrics and
the OpenAPI document (their handlers in :mod:`controller.service.handlers`), each through
:func:`endpoint`. Every error body is ``{"error": {"code", "message"}}``, made in one place
(:func:`error_answer`)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio.to_thread
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from controller.api.views import error_view
from controller.errorinfo import ErrorInfo
from controller.errors import ErrorCode, PatchboxError, ServiceError
from controller.logs import Scrubber
from controller.service.handlers import (
    Handler,
    action,
    cancel,
    events,
    get_attestations,
    get_diff,
    get_evidence,
    get_job,
    healthz,
    list_jobs,
    metrics,
    openapi,
    provenance_key,
    rebase,
    submit,
    upload_bundle,
)
from controller.service.hints import hint_data
from controller.service.runner import Runner
from controller.service.state import Service


def error_response(status: int, info: ErrorInfo) -> JSONResponse:
    """The error answer ``{"error": {"code", "message"}}`` with its HTTP ``status``, and its
    remedy in the API's words (``hint``) when it has one: the one place an error becomes the
    service's answer."""
    error: dict[str, object] = {"code": info.code, "message": info.message}
    if (hint := hint_data(info.hint)) is not None:
        error["hint"] = hint
    return JSONResponse({"error": error}, status_code=status)


def error_answer(service: Service, exc: PatchboxError) -> JSONResponse:
    """The answer of a request refused (a :class:`ServiceError`, its own status) or failed
    (an engine error, its status from :data:`STATUS_OF`): the message without a secret or
    the service's own folder."""
    if isinstance(exc, ServiceError):
        return error_response(exc.status, error_view(exc, service.hide_paths))
    scrub = Scrubber("", paths=False)
    info = error_view(exc, lambda message: service.hide_paths(scrub.text(message)))
    return error_response(STATUS_OF.get(exc.code, 400), info)


def endpoint(route: str, handler: Handler, *, auth: bool = True) -> Callable[..., Any]:
    """Wraps a handler: the service from the app state, errors as JSON, request counts."""

    async def wrapped(request: Request) -> Response:
        service: Service = request.app.state.service
        try:
            if auth:
                request.state.tenant = service.tenant_of(request)
            response = await handler(service, request)
        except PatchboxError as exc:
            response = error_answer(service, exc)
        except Exception as exc:  # never a bare 500: the error shape and a crash report
            from controller.crash import internal_error

            error = internal_error(exc, context=f"service {request.method} {route}")
            response = error_response(500, error.info())
        service.metrics.count(request.method, route, response.status_code)
        return response

    return wrapped


STATUS_OF = {
    ErrorCode.USAGE_ERROR: 409,
    ErrorCode.APPLY_CONFLICT: 409,
    ErrorCode.REVERT_CONFLICT: 409,
    ErrorCode.JOB_REBASED: 409,
    ErrorCode.JOB_SUPERSEDED: 409,
    ErrorCode.JOB_ALREADY_RUNNING: 409,
    ErrorCode.ENVIRONMENT_NOT_READY: 503,
    ErrorCode.INTERNAL_ERROR: 500,
    ErrorCode.REPO_NOT_ALLOWED: 403,
    ErrorCode.BUNDLE_TREE_TOO_LARGE: 413,
}
"""The HTTP status of an engine error raised by an action on a job (400 for the others): a
job in the wrong state, a changed work tree or a busy repository is a conflict; a
repository that is no longer the one submitted is refused."""


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
    (JOB + "/attestations", "GET", get_attestations, True),
    ("/v1/provenance/key", "GET", provenance_key, False),
    (JOB + "/events", "GET", events, True),
    (JOB + "/cancel", "POST", cancel, True),
    (JOB + "/apply", "POST", action("apply"), True),
    (JOB + "/revert", "POST", action("revert"), True),
    (JOB + "/discard", "POST", action("discard"), True),
    (JOB + "/rebase", "POST", rebase, True),
]


async def _http_error(request: Request, exc: Exception) -> Response:
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    code = {404: "NOT_FOUND", 405: "METHOD_NOT_ALLOWED"}.get(status, "BAD_REQUEST")
    service: Service = request.app.state.service
    service.metrics.count(request.method, "unmatched", status)
    message = f"{request.method} {request.url.path[:200]}: {code}"
    return error_response(status, ErrorInfo(code=code, message=message))


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
    from controller.service.config import load_service_config, with_service_key
    from controller.service.sqlitestore import SqliteStore
    from controller.service.store import ServiceStore

    host, config = load_service_config(config_path)
    host = with_service_key(host, config)
    store: ServiceStore
    if config.state == "postgres":
        from controller.service.pgstore import PostgresStore

        store = PostgresStore(config.database or "")
    else:
        store = SqliteStore(config.database_path())
    service = Service(store, host, config, Runner(store, host, config))
    return create_app(service, shutdown_timeout=shutdown_timeout), service


def serve(config_path: Path | None, host: str, port: int) -> None:
    """Runs the service with uvicorn until SIGINT or SIGTERM."""
    import uvicorn

    from controller.service.server import server_config
    from controller.service.startup import PREFIX, startup_lines
    from controller.text import visible

    app, service = build(config_path)
    summary = startup_lines(config_path, service.host, service.config)
    with contextlib.suppress(OSError):
        sys.stderr.write("".join(f"{PREFIX}{visible(line)}\n" for line in summary))
        sys.stderr.flush()

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            service.stopping.set()  # event streams end now, not at the graceful timeout
            super().handle_exit(sig, frame)

    config = server_config(
        app, service.config, host=host, port=port, log_level="info", timeout_graceful_shutdown=10
    )
    Server(config).run()
