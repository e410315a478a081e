"""The sandbox edge: what the rest of the controller may rely on, whatever runs the agent."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from controller.config.limits import Limits
from patchbox_agent import bounds, diffs, jail, search

Runtime = Literal["runc", "runsc"]


class SandboxSpec(BaseModel):
    """What to start: trusted configuration only."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    image: str
    """The sandbox image (built by ``patchbox image build``)."""
    limits: Limits = Field(default_factory=Limits)
    runtime: Runtime = "runc"
    """``runsc`` runs the container under gVisor."""
    job_id: str
    ready_timeout: float = 60.0
    """Seconds from create to a completed handshake."""
    protected: tuple[str, ...] = ()
    """The operator's protected globs: never listed, read or written."""
    agent_argv: tuple[str, ...] = ("python3", "-I", "-S", "-B", "/opt/patchbox/agent.py")
    """How the agent is started inside the image."""
    preload: str | None = None
    """Host path of a tar archive (a file, or a FIFO under runc) mounted read-only at
    :data:`PRELOAD_TARGET`; the agent unpacks it into /workspace before its handshake.
    Only for a daemon on this machine."""
    idle_exit: float | None = None
    """A spare: the agent exits (and Docker removes the container) when no controller
    attaches within this many seconds."""
    network: str | None = None
    """The Docker network the sandbox is on: the job's internal egress network, which
    reaches only the job's proxy; None (the default): no network at all."""
    networks: tuple[str, ...] = ()
    """Further networks the sandbox joins before it starts (the job's services network,
    when it is on the job's egress network too)."""
    docker_runtime: str | None = None
    """The Docker runtime's name when it is not ``runtime`` itself (a gVisor sandbox on an
    egress network runs under the runtime that gives gVisor a network)."""
    run_env: dict[str, str] = Field(default_factory=dict)
    """Variables every process run in the sandbox gets (the job's proxy)."""


PRELOAD_TARGET = "/run/patchbox/baseline.tar"


class WorkClock:
    """A job's wall clock (``limits.wall_seconds``): it counts working time, from its
    start, except while it is paused. A session's job pauses it while it waits for its
    caller's next call, so the time between calls is not counted; a model's job never
    pauses it (the model's turns are work). Thread-safe."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._lock = threading.Lock()
        self._used = 0.0
        """Working time before the current run (since the last resume)."""
        self._since: float | None = time.monotonic()
        """When the clock last started running; None while it is paused."""

    def used(self) -> float:
        """Working seconds counted so far."""
        with self._lock:
            since = self._since
            return self._used + (0.0 if since is None else time.monotonic() - since)

    def remaining(self) -> float:
        """Working seconds left (negative once it ran out)."""
        return self.seconds - self.used()

    def expired(self) -> bool:
        return self.remaining() <= 0

    @property
    def paused(self) -> bool:
        """Whether the clock is paused: work done now (the checks' run on the baseline) is
        bounded by its own timeouts, not by the clock."""
        with self._lock:
            return self._since is None

    def pause(self) -> None:
        """Stops counting (idempotent)."""
        with self._lock:
            if self._since is not None:
                self._used += time.monotonic() - self._since
                self._since = None

    def resume(self) -> None:
        """Counts again (idempotent)."""
        with self._lock:
            if self._since is None:
                self._since = time.monotonic()


DEFAULT_OUTPUT_LIMIT = bounds.DEFAULT_RUN_OUTPUT
"""Bytes of a process's output kept by ``run`` unless the caller says otherwise."""

_MAX_PATH = jail.MAX_PATH_BYTES


class _Result(BaseModel):
    """An agent result: snake_case attributes, the agent's camelCase keys on the wire (also
    what ``model_dump`` and the JSON Schema give, so what reaches the model and the evidence
    keeps the agent's names)."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        strict=True,
        alias_generator=to_camel,
        validate_by_alias=True,
        validate_by_name=True,
        serialize_by_alias=True,
    )


class PreloadResult(_Result):
    entries: int | None = Field(default=None, ge=0)
    bytes: int | None = Field(default=None, ge=0)
    ms: int | None = Field(default=None, ge=0)
    error: str | None = Field(default=None, max_length=1024)


class HelloResult(_Result):
    protocol: int
    agent: str = Field(max_length=64)
    python: str = Field(max_length=32)
    uid: int
    gid: int
    preload: PreloadResult | None = None
    """How the mounted baseline archive was unpacked, when the spec had one."""


class ListFilesResult(_Result):
    files: list[str] = Field(max_length=bounds.MAX_LIST_RESULTS)
    truncated: bool
    version: int = Field(ge=0)
    """The workspace version the listing belongs to."""


class SearchHit(_Result):
    path: str = Field(max_length=_MAX_PATH)
    line: int = Field(ge=1)
    text: str = Field(max_length=search.MAX_LINE_CHARS)


class SearchTextResult(_Result):
    hits: list[SearchHit] = Field(max_length=bounds.MAX_SEARCH_RESULTS)
    truncated: bool
    files_scanned: int = Field(ge=0)
    version: int = Field(ge=0)
    cached: bool
    """True when the answer came from the cache of this workspace version."""


class ReadFileResult(_Result):
    path: str = Field(max_length=_MAX_PATH)
    start_line: int = Field(ge=1)
    end_line: int = Field(ge=0)
    total_lines: int = Field(ge=0)
    content: str = Field(max_length=1024 * 1024)
    truncated: bool


class ReplaceTextResult(_Result):
    path: str = Field(max_length=_MAX_PATH)
    line: int = Field(ge=1)
    """The first line of the replaced text."""
    removed_lines: int = Field(ge=0)
    added_lines: int = Field(ge=0)
    sha256_before: str = Field(pattern=r"^[0-9a-f]{64}$")
    sha256_after: str = Field(pattern=r"^[0-9a-f]{64}$")
    version: int = Field(ge=0)


class PatchedFile(_Result):
    path: str = Field(max_length=_MAX_PATH)
    old_path: str | None = Field(max_length=_MAX_PATH)
    kind: Literal["modify", "create", "delete", "rename"]
    added: int = Field(ge=0)
    removed: int = Field(ge=0)
    sha256_before: str | None = Field(pattern=r"^[0-9a-f]{64}$")
    sha256_after: str | None = Field(pattern=r"^[0-9a-f]{64}$")


class ApplyPatchResult(_Result):
    files: list[PatchedFile] = Field(max_length=diffs.MAX_FILES)
    version: int = Field(ge=0)


class PutArchiveResult(_Result):
    entries: int = Field(ge=0)
    bytes: int = Field(ge=0)


class FileChanges(_Result):
    """Visible files a process changed, as the agent observed them (bounded lists)."""

    added: list[str] = Field(max_length=bounds.MAX_CHANGE_PATHS)
    removed: list[str] = Field(max_length=bounds.MAX_CHANGE_PATHS)
    modified: list[str] = Field(max_length=bounds.MAX_CHANGE_PATHS)
    count: int = Field(ge=0)


class ChangesResult(_Result):
    """Visible files changed since the baseline, as the agent observed them."""

    added: list[str] = Field(max_length=bounds.MAX_EXPORT_PATHS)
    removed: list[str] = Field(max_length=bounds.MAX_EXPORT_PATHS)
    modified: list[str] = Field(max_length=bounds.MAX_EXPORT_PATHS)
    count: int = Field(ge=0)
    truncated: bool


class RawChunk(_Result):
    """Part of one workspace entry: file bytes or a symlink's target, base64."""

    kind: Literal["file", "symlink", "other"]
    size: int = Field(ge=0)
    offset: int = Field(ge=0)
    data: str = Field(max_length=3 * 1024 * 1024)
    executable: bool = False


class PathKind(_Result):
    """What one path names in the workspace (``kind``), or why a tool may not use it
    (``code``, ``message``: the jail's own words; a protected path is refused by name)."""

    kind: Literal["file", "folder"] | None = None
    code: Literal["TOOL_PATH_DENIED", "TOOL_PATH_INVALID", "TOOL_FILE_NOT_FOUND"] | None = None
    message: str | None = Field(default=None, max_length=1024)


class CheckPathsResult(_Result):
    """The answer of ``check_paths``: one :class:`PathKind` per path asked, in order."""

    paths: list[PathKind] = Field(max_length=bounds.MAX_CHECK_PATHS)


class RunResult(_Result):
    """The outcome of one process in the sandbox, as the agent reports it."""

    exit_code: int | None
    signal: int | None
    timed_out: bool
    cancelled: bool
    spawn_error: str | None = Field(max_length=256)
    output: str = Field(max_length=4 * 1024 * 1024)
    output_bytes: int = Field(ge=0)
    truncated: bool
    duration_ms: int = Field(ge=0)
    changes: FileChanges | None = None
    """Present when the run was asked to track changes."""
    oom_kills: int | None = Field(default=None, ge=0)
    """How many processes the kernel OOM-killed in the container during the run, as the
    agent read its memory cgroup (None where it cannot). Never a verdict on its own: the
    controller waits for Docker's own ``oom`` event when this is above zero."""


class RunStarted(_Result):
    """A run the agent started without waiting for it (``run_start``)."""

    handle: int = Field(ge=0)


class RunPoll(_Result):
    """A watched run's output since the last poll, and its result once it ended."""

    output: str = Field(max_length=4 * 1024 * 1024)
    dropped: int = Field(ge=0)
    """Bytes of output between the last poll and this one that were not kept (the newest
    are)."""
    done: bool
    result: RunResult | None = None


class Channel(Protocol):
    """A byte stream to and from the agent's stdin/stdout.

    ``recv`` returns agent stdout bytes, ``b""`` at end of stream, and raises
    ``TimeoutError`` when nothing arrived within ``timeout`` seconds.
    """

    def sendall(self, data: bytes) -> None: ...

    def recv(self, timeout: float) -> bytes: ...

    def stderr_tail(self) -> str: ...

    def close(self) -> None: ...


class Sandbox(Protocol):
    """A started sandbox with a greeted agent. ``close`` removes everything it created and
    never raises; errors of the job itself are raised by the calls."""

    @property
    def hello(self) -> HelloResult: ...

    def list_files(
        self, glob: str | None = None, max_results: int | None = None
    ) -> ListFilesResult: ...

    def read_file(
        self, path: str, start: int | None = None, end: int | None = None
    ) -> ReadFileResult: ...

    def put_archive(self, data: bytes) -> PutArchiveResult: ...

    def put_archive_stream(self, chunks: Iterable[bytes]) -> PutArchiveResult: ...

    def changes(self) -> ChangesResult: ...

    def read_raw(self, path: str, offset: int = 0, length: int = ...) -> RawChunk: ...

    def check_paths(self, paths: list[str]) -> CheckPathsResult: ...

    def run(
        self,
        argv: list[str],
        *,
        timeout: float,
        env: dict[str, str] | None = None,
        output_limit: int = DEFAULT_OUTPUT_LIMIT,
        track_changes: bool = False,
    ) -> RunResult: ...

    def start_run(
        self,
        argv: list[str],
        *,
        timeout: float,
        env: dict[str, str] | None = None,
        output_limit: int = DEFAULT_OUTPUT_LIMIT,
        track_changes: bool = False,
    ) -> int: ...

    def poll_run(self, handle: int, wait: float) -> RunPoll: ...

    def stop_run(self, handle: int) -> None: ...

    def search_text(
        self,
        query: str,
        *,
        glob: str | None = None,
        max_results: int | None = None,
        regex: bool = False,
    ) -> SearchTextResult: ...

    def replace_text(self, path: str, old_text: str, new_text: str) -> ReplaceTextResult: ...

    def apply_patch(self, patch: str) -> ApplyPatchResult: ...

    def close(self) -> None: ...
