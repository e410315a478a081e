"""The MCP server: the model loop's six tools, ``propose`` and the task as resources, each MCP
session one job (a :class:`controller.api.Session`).

The tools are the loop's own: their names, descriptions and JSON Schemas are those of
:func:`controller.tools.schemas.tool_schemas` (what the providers send a model), and every
call goes through :meth:`controller.api.Session.call`, so arguments, limits, error codes,
ledger and transcript are exactly a model's. The MCP request id is the call's ``request_id``:
a request id seen before gets the first call's answer and is not run again.

A session's job is opened at its first tool call (:class:`Slot`; a failed opening is tried
again at the next one), ended by ``propose``, and closed (cancelled, its containers removed)
when the MCP session ends, when its wall clock runs out, or when the server stops. A tool
error is a tool result with ``isError``; its structured content is ``{"error": {"code",
"message"}}``. Every result's text is the JSON of its structured content.
"""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

import anyio.to_thread
import mcp_types as types
from mcp.server.lowlevel import Server
from mcp.server.streamable_http import MCP_SESSION_ID_HEADER
from mcp.shared.exceptions import MCPError
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from pydantic import BaseModel, ConfigDict, StringConstraints, ValidationError

from controller import api
from controller.api.session import Proposal
from controller.config.checks import job_checks
from controller.errormap import describe_validation
from controller.errors import ErrorCode, PatchboxError, UsageError
from controller.jobs.loop import FINAL_MESSAGE_CHARS
from controller.logs import Scrubber, write_line
from controller.tools.schemas import tool_schemas

if TYPE_CHECKING:
    from pathlib import Path

    import docker
    from mcp.server.context import ServerRequestContext

    from controller.config.host import HostConfig
    from controller.config.task import TaskSpec
    from controller.sandbox.base import Runtime

Progress = Callable[[str], None]

PROMPT_URI = "patchbox://task/prompt"
CHECKS_URI = "patchbox://task/checks"
PROPOSE = "propose"
WALL_CLOCK_GRACE_SECONDS = 5.0
"""A session idle past its task's ``wall_seconds`` (plus this) is closed: its job is cancelled.
A call that runs into the wall clock fails ``LIMIT_EXCEEDED`` on its own, a little earlier."""
READ_ONLY = frozenset({"list_files", "search_text", "read_file"})
STDIO = "stdio"
"""The one session of a stdio server."""
SESSIONLESS = (
    "this server keeps one sandbox per MCP session, and this request belongs to none: over "
    "HTTP, connect with the initialize handshake (a Streamable HTTP session with an "
    "Mcp-Session-Id), not the sessionless 2026-07-28 protocol"
)
NOTHING_TO_PROPOSE = "nothing to propose: no tool call has been made in this session"
INSTRUCTIONS = (
    "The tools work on a private copy of the repository in a locked-down sandbox (no network)."
    " Find and read with list_files, search_text and read_file; change files with replace_text"
    " or apply_patch; run the configured checks with run_check (the resource "
    f"{CHECKS_URI} lists them). When the change is done, call propose once: the diff is"
    " validated, the required checks run again in a fresh sandbox, and the job id, its status"
    " and the diff come back. The user reviews and applies it on the host with"
    " `patchbox apply JOB`. After propose the session takes no more calls."
)


@dataclass(frozen=True)
class Options:
    """What ``patchbox mcp`` was started with: one repository, its task, the trust choices."""

    repo: Path
    task: TaskSpec
    config: HostConfig
    task_given: bool = False
    """A task file was given (its prompt is in the server's instructions)."""
    include_local_changes: bool = False
    trust_repo_config: bool = False
    runtime: Runtime | None = None
    version: str = ""


class ProposeArgs(BaseModel):
    """End the session's tool calls and propose the change: the diff is collected and
    validated, the required checks run in a fresh sandbox, and the job is decided. Returns the
    job id, its status, the diff, the files, the checks and the command that applies it."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, strict=True, use_attribute_docstrings=True
    )

    message: Annotated[str, StringConstraints(max_length=FINAL_MESSAGE_CHARS)] = ""
    """What the change does, in a sentence or two (kept in the job's record)."""


def propose_schema() -> dict[str, Any]:
    """``propose``'s JSON Schema, made like the loop's tools' (no titles, no extra fields)."""
    schema = ProposeArgs.model_json_schema(by_alias=True)
    schema.pop("title", None)
    for prop in schema.get("properties", {}).values():
        prop.pop("title", None)
    schema["additionalProperties"] = False
    return schema


def tools() -> list[types.Tool]:
    """The loop's six tools as the providers define them, and ``propose``."""
    out = []
    for spec in tool_schemas():
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


@dataclass(frozen=True)
class Outcome:
    """One tool call's answer: structured content, and whether it is a tool error."""

    data: dict[str, Any]
    error: bool = False

    def result(self) -> types.CallToolResult:
        text = json.dumps(self.data, ensure_ascii=False)
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=text)],
            structured_content=self.data,
            is_error=self.error,
        )


def failure(code: str, message: str, **extra: Any) -> Outcome:
    return Outcome({"error": {"code": code, "message": message}, **extra}, error=True)


def declared_checks(options: Options) -> dict[str, Any]:
    """The checks the session's job declares, resolved as the job resolves them: the task's
    (or the host configuration's), the repository's with ``--trust-repo-config``, and the
    environment's variables."""
    checks, _environment = job_checks(
        options.task,
        options.config,
        options.repo,
        trust_repo_config=options.trust_repo_config,
    )
    return {"checks": {cid: spec.model_dump(mode="json") for cid, spec in checks.items()}}


class Slot:
    """One MCP session's job. Opened at the first tool call (a failed opening is tried again
    at the next call), ended by ``propose``, by a call that ends the job, or by its wall
    clock, and closed once. Thread-safe: the handlers call it from worker threads."""

    def __init__(self, options: Options, progress: Progress) -> None:
        self.options = options
        self._progress = progress
        self._scrub = Scrubber(str(options.repo.resolve()), paths=False)
        self._lock = threading.Lock()
        """Held while the job opens, and for every change of state."""
        self._session: api.Session | None = None
        self._client: docker.DockerClient | None = None
        self._timer: threading.Timer | None = None
        self._ended: str | None = None
        """Why the session takes no more calls (None while it does)."""
        self._proposing = False
        self._answers: dict[str, Outcome] = {}
        """``propose``'s answer by request id (the session keeps the other tools')."""
        self._answered: set[str] = set()
        """The request ids of the calls the session answered."""
        self.opened = False
        self.failure: PatchboxError | None = None
        """The last opening that failed, until one succeeds."""

    @property
    def job_id(self) -> str | None:
        session = self._session
        return None if session is None else session.job_id

    # -- calls ----------------------------------------------------------------------------

    def call(self, tool: str, arguments: dict[str, Any], request_id: str | None) -> Outcome:
        """One tool call (``propose`` included), as a model's; never raises a
        :class:`PatchboxError`. A request id seen before gets the first answer again."""
        if tool == PROPOSE:
            return self.propose(arguments, request_id)
        try:
            session = self._open(request_id)
            result = session.call(tool, arguments, request_id=request_id)
            if request_id is not None:
                self._answered.add(request_id)
        except UsageError as exc:  # the job has ended: say why
            ended = self._ended
            return self._error(exc if ended is None else UsageError(ended))
        except PatchboxError as exc:
            return self._error(exc)
        if result.ok:
            return Outcome(dict(result.result or {}))
        return Outcome({"error": dict(result.error or {})}, error=True)

    def propose(self, arguments: dict[str, Any], request_id: str | None = None) -> Outcome:
        """Ends the job's calls (:meth:`controller.api.Session.propose`); the view of
        ``run --json``, ``apply`` and ``show``. Once per session."""
        try:
            args = ProposeArgs.model_validate(arguments)
        except ValidationError as exc:
            detail = describe_validation(exc, subject="arguments")
            return failure(str(ErrorCode.TOOL_ARGUMENTS_INVALID), f"{PROPOSE}: {detail}")
        session = self._claim_propose(request_id)
        if isinstance(session, Outcome):
            return session
        try:
            proposal = session.propose(args.message)
        except PatchboxError as exc:
            with self._lock:
                self._proposing = False
            return self._error(exc)
        outcome = Outcome(proposal_view(proposal))
        with self._lock:
            if request_id is not None:
                self._answers[request_id] = outcome
        self._end(
            f"the session's job {proposal.job_id} was proposed and has ended ({proposal.status});"
            f" see `patchbox show {proposal.job_id} --diff`. A new job needs a new MCP session"
        )
        self._progress(f"job {proposal.job_id} proposed: {proposal.status}")
        return outcome

    def _claim_propose(self, request_id: str | None) -> api.Session | Outcome:
        """The session to propose, now marked as proposing; or the answer instead (the
        first answer to this request id, or a refusal)."""
        with self._lock:
            if request_id is not None and request_id in self._answers:
                return self._answers[request_id]
            if self._ended is not None:
                return failure(str(ErrorCode.USAGE_ERROR), self._ended)
            if self._session is None:
                return failure(str(ErrorCode.USAGE_ERROR), NOTHING_TO_PROPOSE)
            if self._proposing:
                return failure(str(ErrorCode.USAGE_ERROR), "the session's job is being proposed")
            self._proposing = True
            return self._session

    def _error(self, exc: PatchboxError) -> Outcome:
        """A refused or failed call; when it ended the job, the job's id and state too."""
        extra: dict[str, Any] = {}
        session = self._session
        if session is not None and not session.active:
            state = session.record.state
            extra["job"] = {"job_id": session.job_id, "status": state}
            self._end(
                f"the session's job {session.job_id} has ended ({state}); "
                f"see `patchbox show {session.job_id}`"
            )
        return failure(str(exc.code), self._scrub.text(exc.message), **extra)

    # -- the job's life -------------------------------------------------------------------

    def _open(self, request_id: str | None) -> api.Session:
        """The session's job, opened now if it is not yet. Once the session has ended, only
        a request id it answered before gets it (to answer that again)."""
        with self._lock:
            if self._ended is not None and (
                self._session is None or request_id not in self._answered
            ):
                raise UsageError(self._ended)
            if self._session is not None:
                return self._session
            self._session = self._start()
            return self._session

    def _start(self) -> api.Session:
        """Opens the job (health gate, baseline, environment, sandbox); under the lock."""
        from controller.sandbox.dockerclient import connect

        o = self.options
        client: docker.DockerClient | None = None
        try:
            client = connect()
            session = api.open_session(
                o.repo,
                task=o.task,
                config=o.config,
                include_local_changes=o.include_local_changes,
                trust_repo_config=o.trust_repo_config,
                runtime=o.runtime,
                client=client,
                progress=self._progress,
            )
        except PatchboxError as exc:
            if client is not None:
                client.close()
            self.failure = exc
            write_line(f"patchbox: error {exc.code}: {self._scrub.text(exc.message)}")
            raise
        except BaseException:
            if client is not None:
                client.close()
            raise
        self._client, self.failure, self.opened = client, None, True
        self._progress(f"session opened: job {session.job_id}")
        timer = threading.Timer(o.task.limits.wall_seconds + WALL_CLOCK_GRACE_SECONDS, self._expire)
        timer.daemon = True
        timer.start()
        self._timer = timer
        return session

    def _expire(self) -> None:
        seconds = f"{self.options.task.limits.wall_seconds:g}"
        self._end(
            f"the session's job {self.job_id} was cancelled: its wall clock of {seconds} s "
            "ran out (the task's limits.wall_seconds)"
        )
        self.close()

    def _end(self, why: str) -> None:
        """No more calls from now on (the first reason stays)."""
        with self._lock:
            if self._ended is None:
                self._ended = why
            timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()

    def close(self) -> None:
        """Cancels the job unless it ended (its containers are removed) and waits for an
        opening in progress first; nothing is left running. Idempotent."""
        self._end("the MCP session was closed")
        with self._lock:
            session = self._session
            client, self._client = self._client, None
        if session is not None:
            active = session.active
            session.close()
            if active:
                self._progress(f"session closed: job {session.job_id} {session.record.state}")
        if client is not None:
            client.close()


class Sessions:
    """The slots of one server, by MCP session: one for stdio, one per session id over
    HTTP. A slot whose MCP session ended is closed on a thread of its own."""

    def __init__(self, make: Callable[[], Slot]) -> None:
        self._make = make
        self._lock = threading.Lock()
        self._open: dict[str, Slot] = {}
        self._all: list[Slot] = []
        self._closing: list[threading.Thread] = []

    def get(self, key: str) -> Slot:
        with self._lock:
            slot = self._open.get(key)
            if slot is None:
                slot = self._open[key] = self._make()
                self._all.append(slot)
            return slot

    def end(self, key: str) -> None:
        """The MCP session ``key`` is over: its job is cancelled (without blocking)."""
        with self._lock:
            slot = self._open.pop(key, None)
            if slot is None:
                return
            thread = threading.Thread(target=slot.close, name=f"mcp-close-{key[:16]}")
            self._closing.append(thread)
        thread.start()

    def close_all(self) -> None:
        """Every session's job cancelled and its containers removed; returns when they are."""
        with self._lock:
            slots, self._open = list(self._open.values()), {}
            closing = list(self._closing)
        for slot in slots:
            slot.close()
        for thread in closing:
            thread.join()

    def exit_code(self) -> int:
        """0, unless no session ever opened and the last opening failed: its exit status."""
        from controller.errors import exit_code_for_error

        with self._lock:
            slots = list(self._all)
        if any(s.opened for s in slots):
            return 0
        failures = [s.failure for s in slots if s.failure is not None]
        return int(exit_code_for_error(str(failures[-1].code))) if failures else 0


def _internal(exc: Exception, options: Options) -> Outcome:
    """An unexpected exception in a call: the error contract and a crash report."""
    from controller.crash import internal_message, write_report

    report = write_report(exc, context="mcp tool call", repo=str(options.repo.resolve()))
    message = internal_message(exc, report)
    write_line(f"patchbox: error INTERNAL_ERROR: {message}")
    return failure(str(ErrorCode.INTERNAL_ERROR), message)


class _Handlers:
    """The request handlers of one server (see :func:`build_server`)."""

    HOOKED = "patchbox.session_end"

    def __init__(self, options: Options, sessions: Sessions, *, http: bool) -> None:
        self.options = options
        self.sessions = sessions
        self.http = http
        self.listed = tools()
        self.instructions = INSTRUCTIONS
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
        return types.ListToolsResult(tools=self.listed)

    async def call_tool(
        self, ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        key = self.session_key(ctx)
        if key is None:
            return failure(str(ErrorCode.USAGE_ERROR), SESSIONLESS).result()
        slot = self.sessions.get(key)
        request_id = None if ctx.request_id is None else str(ctx.request_id)
        run = functools.partial(slot.call, params.name, dict(params.arguments or {}), request_id)
        try:
            outcome = await anyio.to_thread.run_sync(run, abandon_on_cancel=True)
        except Exception as exc:  # a bug: never a bare traceback to the client
            outcome = _internal(exc, self.options)
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
                checks = await anyio.to_thread.run_sync(declared_checks, self.options)
            except PatchboxError as exc:
                raise MCPError(
                    code=types.INTERNAL_ERROR, message=f"{exc.code}: {exc.message}"
                ) from exc
            text = json.dumps(Scrubber("", paths=False).value(checks), indent=2, sort_keys=True)
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


def build_server(
    options: Options, sessions: Sessions, *, http: bool = False
) -> Server[dict[str, Any]]:
    """The MCP server of one repository. Over stdio it has one session; over HTTP one per MCP
    session id, its job cancelled when that session ends (deleted, timed out, server stops)."""
    handlers = _Handlers(options, sessions, http=http)
    server: Server[dict[str, Any]] = Server(
        "patchbox",
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


PROPOSAL_KEYS = ("job_id", "status", "diff", "files", "checks", "error", "decision")
"""What ``propose`` answers of the job's view (plus the commands that look at it and apply
it on the host, and why an auto mode stopped for review)."""


def proposal_view(proposal: Proposal) -> dict[str, Any]:
    data = proposal.view.data()
    view = {key: data[key] for key in PROPOSAL_KEYS}
    job_id = proposal.job_id
    view["apply"] = f"patchbox apply {job_id}" if proposal.status == "awaiting_review" else None
    view["show"] = f"patchbox show {job_id} --diff"
    if proposal.view.review_fallback is not None:
        view["review_fallback"] = proposal.view.review_fallback
    return view
