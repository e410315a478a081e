"""The agent operations, shared by every sandbox implementation.

A subclass provides ``_call``; results are validated with the strict models of ``base``
before anyone uses them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Self, TypeVar

from pydantic import BaseModel, ValidationError

from controller.errors import ProtocolError
from controller.sandbox.base import (
    DEFAULT_OUTPUT_LIMIT,
    ApplyPatchResult,
    ChangesResult,
    CheckPathsResult,
    ListFilesResult,
    PutArchiveResult,
    RawChunk,
    ReadFileResult,
    ReplaceTextResult,
    RunPoll,
    RunResult,
    RunStarted,
    SearchTextResult,
)
from controller.sandbox.protocol import ArgValue, CallArgs
from patchbox_agent import bounds

M = TypeVar("M", bound=BaseModel)

DEFAULT_CALL_TIMEOUT = 60.0
ARCHIVE_TIMEOUT = 600.0
RAW_CHUNK = bounds.RAW_CHUNK
POLL_GRACE = 10.0
"""Seconds the controller waits beyond a poll's own wait for the agent's answer."""
MAX_POLL_WAIT = 60.0
"""The longest wait one ``run_poll`` asks of the agent."""
RUN_GRACE = 10.0
"""Seconds the controller waits beyond a process timeout for the agent's answer."""


class AgentCalls:
    """The operations of :class:`controller.sandbox.base.Sandbox` (``hello`` and ``close``
    are the implementation's), defined once: an implementation provides ``_call`` and may
    hook ``_protocol_violation``, ``_before_run`` and ``_after_run``."""

    run_env: dict[str, str] = {}  # noqa: RUF012 - replaced, never changed in place
    """Variables every run gets on top of its own (the job's proxy, when it has one)."""

    def _call(
        self,
        op: str,
        args: CallArgs,
        timeout: float = DEFAULT_CALL_TIMEOUT,
        binary: bytes | Iterable[bytes] | None = None,
    ) -> dict[str, object]:
        raise NotImplementedError

    def close(self) -> None:
        """Ends the sandbox and everything it holds; idempotent, never raises."""
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _protocol_violation(self, error: ProtocolError) -> ProtocolError:
        """Called when a result breaks its schema; implementations discard the sandbox."""
        return error

    def _before_run(self) -> None:
        """Called before a process is started; an implementation may refuse by raising."""

    def _after_run(self, result: RunResult) -> RunResult:
        """Called with a run's result before the caller sees it; may raise instead."""
        return result

    def _validate(self, model: type[M], data: dict[str, object]) -> M:
        try:
            return model.model_validate(data)
        except ValidationError as exc:
            error = ProtocolError(f"a {model.__name__} from the sandbox does not match its schema")
            raise self._protocol_violation(error) from exc

    def list_files(
        self, glob: str | None = None, max_results: int | None = None
    ) -> ListFilesResult:
        args: dict[str, ArgValue] = {}
        if glob is not None:
            args["glob"] = glob
        if max_results is not None:
            args["maxResults"] = max_results
        return self._validate(ListFilesResult, self._call("list_files", args))

    def search_text(
        self,
        query: str,
        *,
        glob: str | None = None,
        max_results: int | None = None,
        regex: bool = False,
    ) -> SearchTextResult:
        args: dict[str, ArgValue] = {"query": query, "regex": regex}
        if glob is not None:
            args["glob"] = glob
        if max_results is not None:
            args["maxResults"] = max_results
        return self._validate(SearchTextResult, self._call("search_text", args))

    def read_file(
        self, path: str, start: int | None = None, end: int | None = None
    ) -> ReadFileResult:
        args: dict[str, ArgValue] = {"path": path}
        if start is not None:
            args["startLine"] = start
        if end is not None:
            args["endLine"] = end
        return self._validate(ReadFileResult, self._call("read_file", args))

    def replace_text(self, path: str, old_text: str, new_text: str) -> ReplaceTextResult:
        """Replaces the one exact occurrence of ``old_text`` (PATCH_REJECTED otherwise)."""
        args = {"path": path, "oldText": old_text, "newText": new_text}
        return self._validate(ReplaceTextResult, self._call("replace_text", args))

    def apply_patch(self, patch: str) -> ApplyPatchResult:
        """Applies one canonical diff, all or nothing (PATCH_REJECTED when it does not apply)."""
        return self._validate(ApplyPatchResult, self._call("apply_patch", {"patch": patch}))

    def changes(self) -> ChangesResult:
        """Files added, removed or modified since the baseline was loaded."""
        return self._validate(ChangesResult, self._call("changes", {}))

    def read_raw(self, path: str, offset: int = 0, length: int = RAW_CHUNK) -> RawChunk:
        """One chunk of a file's bytes (or a symlink's target), nothing followed."""
        args: CallArgs = {"path": path, "offset": offset, "length": length}
        return self._validate(RawChunk, self._call("read_raw", args))

    def check_paths(self, paths: list[str]) -> CheckPathsResult:
        """What each path names in the workspace (a file, a folder), or why the tools may not
        use it, under the jail's rules (at most ``bounds.MAX_CHECK_PATHS``)."""
        result = self._validate(CheckPathsResult, self._call("check_paths", {"paths": paths}))
        if len(result.paths) != len(paths):
            raise self._protocol_violation(ProtocolError("check_paths answered another count"))
        return result

    def put_archive(self, data: bytes) -> PutArchiveResult:
        """Unpacks a tar archive made by the controller into /workspace."""
        result = self._call("put_archive", {"size": len(data)}, ARCHIVE_TIMEOUT, data)
        return self._validate(PutArchiveResult, result)

    def put_archive_stream(self, chunks: Iterable[bytes]) -> PutArchiveResult:
        """Unpacks a tar stream of unknown length (sent as the producer yields it)."""
        result = self._call("put_archive", {"stream": True}, ARCHIVE_TIMEOUT, chunks)
        return self._validate(PutArchiveResult, result)

    def _run_args(
        self,
        argv: list[str],
        timeout: float,
        env: dict[str, str] | None,
        output_limit: int,
        *,
        track_changes: bool,
    ) -> CallArgs:
        """A run's arguments: the process's own variables and :attr:`run_env` over them."""
        return {
            "argv": argv,
            "env": {**(env or {}), **self.run_env},
            "timeoutSeconds": timeout,
            "outputLimit": output_limit,
            "trackChanges": track_changes,
        }

    def run(
        self,
        argv: list[str],
        *,
        timeout: float,
        env: dict[str, str] | None = None,
        output_limit: int = DEFAULT_OUTPUT_LIMIT,
        track_changes: bool = False,
    ) -> RunResult:
        """Runs one process in /workspace; its whole process group dies at ``timeout``.

        With ``track_changes`` the result lists the visible files the process changed."""
        self._before_run()
        args = self._run_args(argv, timeout, env, output_limit, track_changes=track_changes)
        result = self._validate(RunResult, self._call("run", args, timeout + RUN_GRACE))
        return self._after_run(result)

    def start_run(
        self,
        argv: list[str],
        *,
        timeout: float,
        env: dict[str, str] | None = None,
        output_limit: int = DEFAULT_OUTPUT_LIMIT,
        track_changes: bool = False,
    ) -> int:
        """Starts a process as :meth:`run` does and returns at once with its handle: the
        process runs on (its whole process group dies at ``timeout``) while other calls are
        made; :meth:`poll_run` gives its output and its result, :meth:`stop_run` kills it."""
        self._before_run()
        args = self._run_args(argv, timeout, env, output_limit, track_changes=track_changes)
        return self._validate(RunStarted, self._call("run_start", args)).handle

    def poll_run(self, handle: int, wait: float) -> RunPoll:
        """Waits up to ``wait`` seconds (at most :data:`MAX_POLL_WAIT`) for output of the
        run ``handle`` or its end; returns the output since the last poll and, once it
        ended, its result (then the handle is gone)."""
        wait = max(0.0, min(wait, MAX_POLL_WAIT))
        args: CallArgs = {"handle": handle, "waitSeconds": wait}
        poll = self._validate(RunPoll, self._call("run_poll", args, wait + POLL_GRACE))
        if poll.done and poll.result is None:
            raise self._protocol_violation(ProtocolError("a run ended without its result"))
        if poll.result is not None:
            self._after_run(poll.result)
        return poll

    def stop_run(self, handle: int) -> None:
        """Kills the process group of run ``handle`` (its result then comes at a poll)."""
        self._call("cancel", {"target": handle})
