"""The tool executor: the controller, not the model, authorises every effect.

It validates arguments (``tools.parse_arguments``), applies the write policy
(``policy.write_denial``) before anything reaches the sandbox, runs only checks of the trusted
configuration, and keeps the idempotency record: the key of a call is
``(turn, toolCallId)``; a replay in the same turn returns the recorded outcome without a second
effect, the same key with other arguments is refused, and a later turn may reuse an id.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel

from controller.config.checkargs import canonical, check_values, workspace_paths
from controller.config.task import CheckSpec
from controller.errors import (
    ArgumentsNotAnObjectError,
    CheckChangedFilesError,
    ErrorCode,
    ToolError,
)
from controller.sandbox.base import FileChanges, RunResult, Sandbox
from controller.sandbox.netgate import NetworkGate, refused_text
from controller.text import strip_control
from controller.tools.outcome import (
    CheckChanges,
    CheckOutput,
    ToolOutcome,
    numbered,
)
from controller.tools.policy import write_denial
from controller.tools.schemas import (
    ApplyPatchArgs,
    ListFilesArgs,
    ReadFileArgs,
    ReplaceTextArgs,
    RunCheckArgs,
    SearchTextArgs,
    parse_arguments,
)
from controller.tools.watch import CheckRunning, CheckWatch, OutputListener, Watched
from patchbox_agent import bounds, diffs, jail

OUTPUT_TAIL = 8 * 1024


@dataclass
class ToolExecutor:
    sandbox: Sandbox
    checks: Mapping[str, CheckSpec] = field(default_factory=dict)
    allowed_paths: list[str] | None = None
    extra_protected: Iterable[str] = ()
    on_output: OutputListener | None = None
    """Told every line of a running check's output as it comes."""
    gate: NetworkGate | None = None
    """The job's proxy, when its checks declare ``egress``."""
    _done: dict[tuple[int, str], tuple[str, str, ToolOutcome]] = field(default_factory=dict)
    _check_cache: dict[str, ToolOutcome] = field(default_factory=dict)
    _watch: CheckWatch | None = None

    @property
    def watch(self) -> CheckWatch:
        """The job's running check (:mod:`controller.tools.watch`)."""
        if self._watch is None:
            self._watch = CheckWatch(self.sandbox, gate=self.gate)
        self._watch.listener = self.on_output
        return self._watch

    def stop_check(self) -> None:
        """Kills the check that still runs, if any (the job's calls have ended)."""
        if self._watch is not None:
            self._watch.stop()

    def execute(
        self, turn: int, call_id: str, tool: str, raw: str | Mapping[str, object]
    ) -> ToolOutcome:
        """Runs one tool call. Raises only for job-ending conditions (arguments that are not
        an object, a broken sandbox, a check that changed files it should not have)."""
        key = (turn, call_id)
        if self._done and next(iter(self._done))[0] != turn:
            self._done.clear()  # an id is checked again within its turn only
        recorded = self._done.get(key)
        if recorded is not None:
            first_tool, first_raw, first = recorded
            if first_tool == tool and (
                first_raw == raw or _digest(tool, first_raw) == _digest(tool, raw)
            ):
                return first
            return self._refuse(
                turn,
                call_id,
                tool,
                ErrorCode.TOOL_ARGUMENTS_INVALID,
                "this toolCallId was already used in this turn with other arguments",
            )
        outcome = self._execute(turn, call_id, tool, raw)
        kept = raw if isinstance(raw, str) else json.dumps(raw, default=str)
        self._done[key] = (tool, kept, outcome)  # compared only if the id comes again
        return outcome

    def _refuse(
        self, turn: int, call_id: str, tool: str, code: ErrorCode, message: str
    ) -> ToolOutcome:
        return ToolOutcome(
            turn,
            call_id,
            tool,
            ok=False,
            error={"code": str(code), "message": message, "retryable": True},
        )

    def _execute(
        self, turn: int, call_id: str, tool: str, raw: str | Mapping[str, object]
    ) -> ToolOutcome:
        try:
            args = parse_arguments(tool, raw)
            if isinstance(args, RunCheckArgs):
                if args.handle is not None:
                    return self._poll_check(turn, call_id, args.handle, args.wait_seconds)
                assert args.check_id is not None  # noqa: S101 - one of the two
                return self._run_check(
                    turn, call_id, args.check_id, args.args, wait=args.wait_seconds
                )
            result, effect = self._dispatch(args)
        except ToolError as exc:
            if not _retryable(exc):
                raise
            message = exc.message
            if tool == "run_check" and "checkId" in message and "configured:" not in message:
                message += f"; configured: {', '.join(sorted(self.checks)) or 'none'}"
            return self._refuse(turn, call_id, tool, exc.code, message)
        data = result.model_dump()
        if isinstance(args, ReadFileArgs) and args.line_numbers:
            data["content"] = numbered(data["content"], data["startLine"])
        return ToolOutcome(
            turn,
            call_id,
            tool,
            ok=True,
            result=data,
            effect=effect,
            details=getattr(args, "details", False),
        )

    def _dispatch(self, args: object) -> tuple[BaseModel, str]:
        if isinstance(args, ListFilesArgs):
            return self.sandbox.list_files(args.glob, args.max_results), "none"
        if isinstance(args, SearchTextArgs):
            found = self.sandbox.search_text(
                args.query, glob=args.glob, max_results=args.max_results, regex=args.regex
            )
            return found, "none"
        if isinstance(args, ReadFileArgs):
            with _naming(args.path):
                return self.sandbox.read_file(args.path, args.start_line, args.end_line), "none"
        if isinstance(args, ApplyPatchArgs | ReplaceTextArgs):
            tool = "apply_patch" if isinstance(args, ApplyPatchArgs) else "replace_text"
            self.watch.refuse_while_running(f"{tool} is refused")
        if isinstance(args, ApplyPatchArgs):
            for path in _patch_paths(args.patch):
                self._check_write(path)
            done_patch = self.sandbox.apply_patch(args.patch)
            self._check_cache.clear()
            return done_patch, "write"
        if isinstance(args, ReplaceTextArgs):
            self._check_write(args.path)
            with _naming(args.path):
                done = self.sandbox.replace_text(args.path, args.old_text, args.new_text)
            self._check_cache.clear()
            return done, "write"
        raise ToolError("this tool is not available", code=ErrorCode.TOOL_ARGUMENTS_INVALID)

    def _check_write(self, path: str) -> None:
        try:  # not a repository path at all: said as the sandbox says it
            jail.split(path)
        except jail.PathInvalidError as exc:
            raise ToolError(f"{path[:200]}: {exc}", code=ErrorCode.TOOL_PATH_INVALID) from exc
        except jail.PathDeniedError:
            pass  # the write policy names why
        reason = write_denial(path, self.allowed_paths, self.extra_protected)
        if reason is not None:
            raise ToolError(f"{path[:200]}: {reason}", code=ErrorCode.TOOL_PATH_DENIED)

    def _run_check(
        self,
        turn: int,
        call_id: str,
        check_id: str,
        given: Mapping[str, object] | None = None,
        *,
        wait: float | None = None,
    ) -> ToolOutcome:
        spec = self.checks.get(check_id)
        if spec is None:
            known = ", ".join(sorted(self.checks)) or "none"
            raise ToolError(
                f"unknown checkId {check_id!r}; configured: {known}",
                code=ErrorCode.TOOL_ARGUMENTS_INVALID,
            )
        values = check_arguments(self.sandbox, check_id, spec, given)
        key = check_key(check_id, values)
        cached = self._check_cache.get(key)
        if cached is not None:
            result = dict(cached.result or {}, reused=True)
            result["verdict"] = f"{result['verdict']} (reused: nothing changed since it ran)"
            return ToolOutcome(turn, call_id, "run_check", ok=True, result=result, effect="none")
        argv = spec.argv_with(values)
        watched = self.watch.start(check_id, spec, argv, key=key)
        return self._waited(turn, call_id, watched, wait)

    def _poll_check(self, turn: int, call_id: str, handle: str, wait: float | None) -> ToolOutcome:
        """``run_check {"handle": H}``: waits again for the check that runs."""
        return self._waited(turn, call_id, self.watch.find(handle), wait)

    def _waited(self, turn: int, call_id: str, watched: Watched, wait: float | None) -> ToolOutcome:
        """The check after waiting up to ``wait`` seconds: still running, or its result."""
        run = self.watch.wait(watched, wait)
        if isinstance(run, RunResult):
            return self._checked(turn, call_id, watched, run)
        return _running_outcome(turn, call_id, run)

    def _checked(self, turn: int, call_id: str, watched: Watched, run: RunResult) -> ToolOutcome:
        """The outcome of a check run that ended (its result cached unless it wrote)."""
        check_id, spec = watched.check_id, watched.spec
        changes = run.changes
        changed = changes is not None and changes.count > 0
        if changed and not spec.mutates:
            assert changes is not None  # noqa: S101 - implied by changed
            sample = (changes.added + changes.modified + changes.removed)[:10]
            raise CheckChangedFilesError(
                f"check {check_id} changed {changes.count} file(s) it was not declared to change: "
                + ", ".join(sample)
            )
        output = check_result(check_id, run, watched.argv)
        if watched.network is not None:
            output["network"] = [c.as_dict() for c in watched.network]
            refused = refused_text(watched.network)
            if refused and output["status"] != "passed":
                output["verdict"] += f" (the proxy refused {refused})"
        outcome = ToolOutcome(
            turn,
            call_id,
            "run_check",
            ok=True,
            result=dict(output),
            effect="write" if changed else "process",
        )
        if changed:
            self._check_cache.clear()
        else:
            self._check_cache[watched.key] = outcome
        return outcome


def _running_outcome(turn: int, call_id: str, running: CheckRunning) -> ToolOutcome:
    return ToolOutcome(turn, call_id, "run_check", ok=True, result=dict(running))


def check_arguments(
    sandbox: Sandbox, check_id: str, spec: CheckSpec, given: Mapping[str, object] | None
) -> dict[str, tuple[str, ...]]:
    """The values a ``run_check`` call gives ``spec``'s declared arguments, checked: each on
    its own (:func:`controller.config.checkargs.check_values`), then every path in the
    sandbox, where the workspace is (:meth:`Sandbox.check_paths`: it exists, is not a link,
    is not protected). ``TOOL_ARGUMENTS_INVALID`` with the exact reason otherwise."""
    values = check_values(check_id, spec.args, given)
    wanted = workspace_paths(spec.args, values)
    if not wanted:
        return values
    paths = [path for _, path, _ in wanted]
    found = [
        kind
        for start in range(0, len(paths), bounds.MAX_CHECK_PATHS)
        for kind in sandbox.check_paths(paths[start : start + bounds.MAX_CHECK_PATHS]).paths
    ]
    for (where, _, needs_file), kind in zip(wanted, found, strict=True):
        if kind.kind is None:
            reason = kind.message or "not allowed"
        elif needs_file and kind.kind != "file":
            reason = "a folder, not a file: a test id names a file"
        else:
            continue
        raise ToolError(f"{where}: {reason}", code=ErrorCode.TOOL_ARGUMENTS_INVALID)
    return values


def check_key(check_id: str, values: Mapping[str, Sequence[str]]) -> str:
    """The reuse key of a check run: the check and its arguments (the run's workspace state
    is the cache's own: every write empties it)."""
    return json.dumps([check_id, canonical(values)])


def check_result(check_id: str, run: RunResult, argv: Sequence[str] = ()) -> CheckOutput:
    """The model-facing (and evidence) view of a check run: status, exit, bounded output,
    and the argv that ran (the values of secret variables taken out)."""
    status: Literal["passed", "failed", "timed_out"]
    if run.timed_out:
        status = "timed_out"
    elif run.exit_code == 0:
        status = "passed"
    else:
        status = "failed"
    output = strip_control(run.output)[-OUTPUT_TAIL:]
    return {
        "verdict": verdict(check_id, status, run.exit_code, run.signal),
        "checkId": check_id,
        "status": status,
        "exitCode": run.exit_code,
        "signal": run.signal,
        "durationMs": run.duration_ms,
        "output": output,
        "outputTruncated": run.truncated or len(run.output) > OUTPUT_TAIL,
        "changes": _changes(run.changes) if run.changes else None,
        "reused": False,
        "argv": _shown_argv(argv),
    }


def _shown_argv(argv: Sequence[str]) -> list[str]:
    """``argv`` as a result shows it: without controls or secret values."""
    from controller.logs import Scrubber  # the secrets of this process's environment

    scrub = Scrubber("", paths=False)
    return [scrub.text(a) for a in argv]


def verdict(check_id: str, status: str, exit_code: int | None, signal: int | None) -> str:
    """A check run in words, as the model and the transcript read it: ``tests: passed``,
    ``tests: failed, exit 1``, ``tests: failed, signal 9``, ``tests: timed out``."""
    if status == "passed":
        return f"{check_id}: passed"
    if status == "timed_out":
        return f"{check_id}: timed out"
    if exit_code is not None:
        return f"{check_id}: failed, exit {exit_code}"
    if signal is not None:
        return f"{check_id}: failed, signal {signal}"
    return f"{check_id}: failed"


def _changes(changes: FileChanges) -> CheckChanges:
    return {
        "added": changes.added,
        "removed": changes.removed,
        "modified": changes.modified,
        "count": changes.count,
    }


NOT_A_DIFF = frozenset({"garbage", "fence", "begin_patch"})
"""The reasons of a patch that is not (only) a diff."""
NOT_A_DIFF_HINT = (
    "; send only the diff: each file as a '--- a/PATH' line, a '+++ b/PATH' line and its"
    " '@@ -start,count +start,count @@' hunks (or git's 'diff --git' form), no other text"
)


def _patch_paths(text: str) -> list[str]:
    """Every path a patch touches, parsed strictly on the host (the container's parser is
    not trusted to have applied the policy)."""
    try:
        patches = diffs.parse_patch(text)
    except diffs.DiffError as exc:
        message = str(exc)[:1000]
        if exc.reason in NOT_A_DIFF:
            message += NOT_A_DIFF_HINT
        raise ToolError(message, code=ErrorCode.PATCH_REJECTED) from exc
    return sorted({p for patch in patches for p in (patch.old_path, patch.new_path) if p})


def _digest(tool: str, raw: str | Mapping[str, object]) -> str:
    """Identity of a call: the tool and its arguments as decoded (so the same call sent as a
    JSON text or as an object is the same call)."""
    value: Any = raw
    if isinstance(raw, str):
        try:
            value = json.loads(raw)
        except ValueError:
            value = raw
    return hashlib.sha256(
        json.dumps([tool, value], sort_keys=True, default=str).encode()
    ).hexdigest()


PATH_CODES = frozenset(
    {ErrorCode.TOOL_PATH_DENIED, ErrorCode.TOOL_PATH_INVALID, ErrorCode.TOOL_FILE_NOT_FOUND}
)


@contextlib.contextmanager
def _naming(path: str) -> Iterator[None]:
    """The agent's refusal of ``path`` with the path in front (``src/x.py: no such file``):
    the model's own argument, cut, and quoted when it holds a character that does not print."""
    try:
        yield
    except ToolError as exc:
        if exc.code not in PATH_CODES:
            raise
        shown = path[:200] if path.isprintable() else repr(path[:200])
        raise ToolError(f"{shown}: {exc.message}", code=exc.code) from exc


def _retryable(exc: ToolError) -> bool:
    return not isinstance(exc, ArgumentsNotAnObjectError)
