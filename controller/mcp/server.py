"""The MCP server: the model loop's six tools, ``propose`` and the task as resources, each MCP
session one job (a :class:`controller.api.Session`).

The tools are the loop's own: their names, descriptions and JSON Schemas are those of
:func:`controller.tools.schemas.tool_schemas` (what the providers send a model), and every
call goes through :meth:`controller.api.Session.call`, so arguments, limits, error codes,
ledger and transcript are exactly a model's. The MCP request id is the call's ``request_id``:
a request id seen before gets the first call's answer and is not run again.

Each MCP session's job is a :class:`controller.mcp.slot.Slot`. A tool error is a tool result
with ``isError``; its structured content is ``{"error": {"code", "message"}}``. Every
result's text is the JSON of its structured content.
"""

from __future__ import annotations

import contextlib
import functools
import json
import queue
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any

import anyio.to_thread
import mcp_types as types
from mcp.server.lowlevel import Server
from mcp.server.streamable_http import MCP_SESSION_ID_HEADER
from mcp.shared.exceptions import MCPError
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

from controller.config.checks import job_checks
from controller.errors import ErrorCode, PatchboxError
from controller.logs import Scrubber, write_line
from controller.mcp.slot import (
    CHECKS_URI,
    PROPOSE,
    Options,
    Outcome,
    ProposeArgs,
    Sessions,
    error_outcome,
    failure,
)
from controller.tools.schemas import checks_text, tool_schemas

if TYPE_CHECKING:
    from mcp.server.context import ServerRequestContext

    from controller.config.task import CheckSpec

PROMPT_URI = "patchbox://task/prompt"
READ_ONLY = frozenset({"list_files", "search_text", "read_file"})
STDIO = "stdio"
"""The one session of a stdio server."""
SESSIONLESS = (
    "this server keeps one sandbox per MCP session, and this request belongs to none: over "
    "HTTP, connect with the initialize handshake (a Streamable HTTP session with an "
    "Mcp-Session-Id), not the sessionless 2026-07-28 protocol"
)
INSTRUCTIONS = (
    "The tools work on a private copy of the repository in a locked-down sandbox (no network)."
    " Find and read with list_files, search_text and read_file; change files with replace_text"
    " or apply_patch; run the configured checks with run_check (the resource "
    f"{CHECKS_URI} lists them). When the change is done, call propose once: the diff is"
    " validated, the required checks run again in a fresh sandbox, and the job id, its status"
    " and the diff come back. The user reviews and applies it on the host with"
    " patchbox apply JOB. A tool call after propose starts a new job on the repository's"
    " current state (its first result says so under job_started). A job with no call for the"
    " server's idle timeout ends by itself: proposed as it is when it changed something."
)


def propose_schema() -> dict[str, Any]:
    """``propose``'s JSON Schema, made like the loop's tools' (no titles, no extra fields,
    the description said once: in the tool's)."""
    schema = ProposeArgs.model_json_schema(by_alias=True)
    schema.pop("title", None)
    schema.pop("description", None)
    for prop in schema.get("properties", {}).values():
        prop.pop("title", None)
    schema["additionalProperties"] = False
    return schema


def tools(checks: Mapping[str, CheckSpec] | None = None) -> list[types.Tool]:
    """The loop's six tools as the providers define them for a job with ``checks`` (their
    ids an ``enum`` of ``run_check``'s ``checkId``), and ``propose``."""
    out = []
    for spec in tool_schemas(checks):
        read_only = spec["name"] in READ_ONLY
        out.append(
            types.Tool(
                name=spec["name"],
                description=spec["description"],
                input_schema=spec["parameters"],
                annotations=types.ToolAnnotations(
                    read_only_hint=read_only,
                    destructive_hint=None if read_only else False,
                    open_world_hint=False,
                ),
            )
        )
    out.append(
        types.Tool(
            name=PROPOSE,
            description=(ProposeArgs.__doc__ or "").strip().replace("\n    ", " "),
            input_schema=propose_schema(),
            annotations=types.ToolAnnotations(read_only_hint=False, open_world_hint=False),
        )
    )
    return out


def declared_checks(options: Options) -> dict[str, CheckSpec]:
    """The checks the session's job declares, resolved as the job resolves them: the task's
    (or the host configuration's), the repository's with ``--trust-repo-config``, and the
    environment's variables."""
    checks, _environment = job_checks(
        options.task,
        options.config,
        options.repo,
        trust_repo_config=options.trust_repo_config,
    )
    return checks


def _known_checks(options: Options) -> dict[str, CheckSpec] | None:
    """The session's checks for its tool list; None when they cannot be resolved now (the
    first call then fails with the reason, and the tool list says only their form)."""
    try:
        return declared_checks(options)
    except PatchboxError:
        return None


def _internal(exc: Exception, options: Options) -> Outcome:
    """An unexpected exception in a call: the error contract and a crash report."""
    from controller.crash import internal_error

    error = internal_error(exc, context="mcp tool call", repo=str(options.repo.resolve()))
    write_line(f"patchbox: error INTERNAL_ERROR: {error.message}")
    return error_outcome(error.info())


PROGRESS_EVERY = 0.2
"""Seconds between two progress notifications with a running check's output."""
PROGRESS_BEAT = 10.0
"""Seconds without output after which a progress notification says the check still runs
(a client whose request timeout resets on progress keeps the call)."""
PROGRESS_CHARS = 4000
"""Characters of output in one progress notification (its last lines)."""


async def _progress(ctx: ServerRequestContext[Any, Any], lines: queue.SimpleQueue[str]) -> None:
    """While ``run_check`` runs: its output lines as progress notifications of the request
    (the lines since the last one in each), and one every :data:`PROGRESS_BEAT` seconds
    without output. Nothing is sent when the client gave no progress token."""
    count, quiet = 0, 0.0
    while True:
        await anyio.sleep(PROGRESS_EVERY)
        batch: list[str] = []
        while True:
            try:
                batch.append(lines.get_nowait())
            except queue.Empty:
                break
        quiet = 0.0 if batch else quiet + PROGRESS_EVERY
        if not batch and quiet < PROGRESS_BEAT:
            continue
        quiet = 0.0
        count += 1
        message = "\n".join(batch)[-PROGRESS_CHARS:] if batch else "the check still runs"
        with contextlib.suppress(Exception):  # a client gone: the call's own end says it
            await ctx.session.report_progress(count, None, message)


class _Handlers:
    """The request handlers of one server (see :func:`build_server`)."""

    HOOKED = "patchbox.session_end"

    def __init__(self, options: Options, sessions: Sessions, *, http: bool) -> None:
        self.options = options
        self.sessions = sessions
        self.http = http
        checks = _known_checks(options)
        self.instructions = INSTRUCTIONS
        if checks is not None:
            self.instructions += f"\n\n{checks_text(checks)}"
        if options.task_given:
            self.instructions += f"\n\nThe task:\n{options.task.prompt}"
        self.capabilities: types.ServerCapabilities | None = None

    def session_key(self, ctx: ServerRequestContext[Any, Any]) -> str | None:
        """Which session a request belongs to: the one of stdio, an HTTP session's id, or
        None (a sessionless HTTP request)."""
        if not self.http:
            return STDIO
        # mcp 2.3 has no public accessor for a request's Connection (it holds the session id
        # and the exit stack the SDK unwinds when the session ends); the request's
        # Mcp-Session-Id header is the fallback, with the job closed at shutdown or wall clock.
        connection = getattr(ctx.session, "_connection", None)
        session_id = getattr(connection, "session_id", None)
        if connection is not None and isinstance(session_id, str):
            if not connection.state.get(self.HOOKED):
                connection.state[self.HOOKED] = True
                connection.exit_stack.callback(self.sessions.end, session_id)
            return session_id
        request = ctx.request
        header = request.headers.get(MCP_SESSION_ID_HEADER) if request is not None else None
        return header if isinstance(header, str) and header else None

    async def list_tools(
        self, _ctx: ServerRequestContext[Any, Any], _params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        """The tools with the checks as they resolve now (the repository's suggestions or
        a configuration that could not be read at start may have changed since)."""
        return types.ListToolsResult(tools=tools(_known_checks(self.options)))

    async def call_tool(
        self, ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        key = self.session_key(ctx)
        if key is None:
            return failure(str(ErrorCode.USAGE_ERROR), SESSIONLESS).result()
        slot = self.sessions.get(key)
        request_id = None if ctx.request_id is None else str(ctx.request_id)
        lines: queue.SimpleQueue[str] = queue.SimpleQueue()
        run = functools.partial(
            slot.call,
            params.name,
            dict(params.arguments or {}),
            request_id,
            (lambda line: lines.put(line.line)) if params.name == "run_check" else None,
        )
        async with anyio.create_task_group() as tasks:
            if params.name == "run_check":
                tasks.start_soon(_progress, ctx, lines)
            try:
                outcome = await anyio.to_thread.run_sync(run, abandon_on_cancel=True)
            except Exception as exc:  # a bug: never a bare traceback to the client
                outcome = _internal(exc, self.options)
            finally:
                tasks.cancel_scope.cancel()
        return outcome.result()

    async def list_resources(
        self, _ctx: ServerRequestContext[Any, Any], _params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        return types.ListResourcesResult(
            resources=[
                types.Resource(
                    name="task-prompt",
                    title="The task",
                    uri=PROMPT_URI,
                    mime_type="text/plain",
                    description="What the session's job is asked to do (its task's prompt).",
                ),
                types.Resource(
                    name="task-checks",
                    title="The checks",
                    uri=CHECKS_URI,
                    mime_type="application/json",
                    description="The checks run_check may run; the required ones run again "
                    "on the proposed diff.",
                ),
            ]
        )

    async def read_resource(
        self, _ctx: ServerRequestContext[Any, Any], params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult:
        if params.uri == PROMPT_URI:
            text, mime = self.options.task.prompt, "text/plain"
        elif params.uri == CHECKS_URI:
            try:
                declared = await anyio.to_thread.run_sync(declared_checks, self.options)
            except PatchboxError as exc:
                raise MCPError(
                    code=types.INTERNAL_ERROR, message=f"{exc.code}: {exc.message}"
                ) from exc
            checks = {cid: spec.model_dump(mode="json") for cid, spec in declared.items()}
            shown = Scrubber("", paths=False).value({"checks": checks})
            text = json.dumps(shown, indent=2, sort_keys=True)
            mime = "application/json"
        else:
            raise MCPError(code=types.INVALID_PARAMS, message=f"unknown resource {params.uri!r}")
        return types.ReadResourceResult(
            contents=[types.TextResourceContents(uri=params.uri, mime_type=mime, text=text)]
        )

    async def discover(
        self, _ctx: ServerRequestContext[Any, Any], _params: types.RequestParams
    ) -> types.DiscoverResult:
        """Over HTTP: only the handshake's versions, so a client on "auto" opens a session
        with the initialize handshake, and a session id is what a job is kept by."""
        return types.DiscoverResult(
            supported_versions=list(HANDSHAKE_PROTOCOL_VERSIONS),
            capabilities=self.capabilities or types.ServerCapabilities(),
            instructions=self.instructions,
        )


@contextlib.asynccontextmanager
async def _no_state(_server: Server[None]) -> AsyncIterator[None]:
    """The server's lifespan: it keeps no state of its own (the sessions hold the jobs)."""
    yield


def build_server(options: Options, sessions: Sessions, *, http: bool = False) -> Server[None]:
    """The MCP server of one repository. Over stdio it has one session; over HTTP one per MCP
    session id, its job cancelled when that session ends (deleted, timed out, server stops)."""
    handlers = _Handlers(options, sessions, http=http)
    server: Server[None] = Server(
        "patchbox",
        lifespan=_no_state,
        version=options.version,
        instructions=handlers.instructions,
        on_list_tools=handlers.list_tools,
        on_call_tool=handlers.call_tool,
        on_list_resources=handlers.list_resources,
        on_read_resource=handlers.read_resource,
    )
    if http:
        handlers.capabilities = server.get_capabilities()
        server.add_request_handler("server/discover", types.RequestParams, handlers.discover)
    return server
