"""A check that goes on between calls: ``run_check`` with ``waitSeconds`` and the handle form.

A check runs in the sandbox while the caller waits at most ``waitSeconds``; when it still
runs then, the call answers ``running`` with a handle and the output so far, and
``run_check {"handle": H}`` waits again and answers with the output since the last answer,
or with the check's result once it ended. The check's own ``timeout_seconds`` stays the
ceiling from its start (the agent kills its process group then). While it runs, one check
at most runs in the sandbox and the tools that write are refused (the check sees a stable
tree). Every piece of output is told, line by line, to a listener as it comes (the front
doors' live output).
"""

from __future__ import annotations

import contextlib
import math
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, TypedDict

from controller.config.task import CheckSpec
from controller.errors import ErrorCode, SandboxError, ServiceNotReadyError, ToolError
from controller.sandbox.base import RunResult, Sandbox
from controller.sandbox.calls import RUN_GRACE
from controller.sandbox.egress import Connection
from controller.sandbox.netgate import NetworkGate
from controller.text import strip_control

OUTPUT_TAIL = 8 * 1024
"""The most output one answer carries (its last bytes), as for a check's result."""
POLL_SLICE = 1.0
"""The longest wait of one poll of the agent: the job's wall clock and a cancel are seen at
least this often while a caller waits."""
LINE_CHARS = 1000
"""Characters of one output line told to a listener (the rest is cut)."""
PARTIAL_CHARS = 4096
"""A line without its end this long is told as it is."""


@dataclass(frozen=True)
class CheckLine:
    """One line of a running check's output, as it came."""

    check_id: str
    handle: str
    line: str


OutputListener = Callable[[CheckLine], object]


class CheckRunning(TypedDict):
    """A check still running when its caller's wait ended, as the model gets it."""

    verdict: str
    checkId: str
    status: Literal["running"]
    handle: str
    output: str
    """The output since the last answer (its last :data:`OUTPUT_TAIL` bytes)."""
    outputTruncated: bool
    elapsedSeconds: float


@dataclass
class Watched:
    """The check that runs now."""

    handle: str
    check_id: str
    spec: CheckSpec
    run: int
    """The agent's handle of the run."""
    started: float
    argv: tuple[str, ...] = ()
    """The argv that runs (its declared arguments filled in)."""
    key: str = ""
    """The run's reuse key: the check and its arguments."""
    unread: list[str] = field(default_factory=list)
    unread_chars: int = 0
    dropped: bool = False
    partial: str = ""
    network: list[Connection] | None = None
    """The requests it made through the job's proxy, once it ended (a job with a proxy)."""


@dataclass
class CheckWatch:
    """The job's running check, if any (one at a time), and the handles already answered."""

    sandbox: Sandbox
    listener: OutputListener | None = None
    gate: NetworkGate | None = None
    """The job's proxy: open for the running check's ``egress`` (a job with a proxy)."""
    current: Watched | None = None
    _ended: set[str] = field(default_factory=set)

    def refuse_while_running(self, what: str) -> None:
        """Raises ``TOOL_CHECK_RUNNING`` (``what``: "apply_patch is refused") while a check
        runs."""
        now = self.current
        if now is not None:
            raise ToolError(
                f"{what} while check {now.check_id} runs (handle {now.handle}): "
                f'wait for its end with run_check {{"handle": "{now.handle}"}}',
                code=ErrorCode.TOOL_CHECK_RUNNING,
            )

    def start(
        self, check_id: str, spec: CheckSpec, argv: Sequence[str], *, key: str = ""
    ) -> Watched:
        """Starts ``check_id`` (``argv``) in the sandbox; it then runs on. ``key`` is the
        run's reuse key (:func:`controller.tools.executor.check_key`)."""
        self.refuse_while_running(f"check {check_id} cannot start")
        if self.gate is not None:
            try:
                self.gate.open(check_id)
            except ServiceNotReadyError as exc:  # the model is told, as of any check
                self._close_gate()
                raise ToolError(exc.message, code=ErrorCode.SERVICE_NOT_READY) from exc
        try:
            run = self.sandbox.start_run(
                list(argv),
                timeout=spec.timeout_seconds,
                env=spec.environment(),
                output_limit=spec.output_limit,
                track_changes=True,
            )
        except BaseException:
            self._close_gate()
            raise
        handle = f"chk_{secrets.token_hex(6)}"
        self.current = Watched(
            handle, check_id, spec, run, time.monotonic(), argv=tuple(argv), key=key
        )
        return self.current

    def find(self, handle: str) -> Watched:
        """The running check of ``handle``; ``TOOL_HANDLE_UNKNOWN`` for any other."""
        now = self.current
        if now is not None and now.handle == handle:
            return now
        shown = handle[:40] if handle.isprintable() else repr(handle[:40])
        if handle in self._ended:
            why = "that check has ended and its result was answered"
        else:
            why = "no check of this job has that handle"
        raise ToolError(f"handle {shown}: {why}", code=ErrorCode.TOOL_HANDLE_UNKNOWN)

    def wait(self, watched: Watched, seconds: float | None) -> RunResult | CheckRunning:
        """Waits up to ``seconds`` (None: until the end) for the check; its result once it
        ended, else what the model gets of a check still running."""
        deadline = math.inf if seconds is None else time.monotonic() + seconds
        ceiling = watched.started + watched.spec.timeout_seconds + RUN_GRACE
        while True:
            now = time.monotonic()
            if now > ceiling:
                raise SandboxError(f"check {watched.check_id} outlived its time limit")
            slice_ = max(0.0, min(deadline - now, POLL_SLICE))
            poll = self.sandbox.poll_run(watched.run, slice_)
            if poll.output or poll.dropped:
                self._add(watched, poll.output, dropped=poll.dropped > 0)
            if poll.done:
                assert poll.result is not None  # noqa: S101 - poll_run's contract
                self._tell(watched, "", flush=True)
                self._ended.add(watched.handle)
                self.current = None
                watched.network = self._close_gate()
                return poll.result
            if time.monotonic() >= deadline:
                return self._running(watched)

    def stop(self) -> None:
        """Kills the running check, if any, and waits (briefly) for its end; its result is
        dropped. Never raises: the sandbox may be gone already."""
        watched, self.current = self.current, None
        if watched is None:
            return
        self._ended.add(watched.handle)
        with contextlib.suppress(Exception):
            self.sandbox.stop_run(watched.run)
            ends = time.monotonic() + RUN_GRACE
            while time.monotonic() < ends and not self.sandbox.poll_run(watched.run, 1.0).done:
                pass
        with contextlib.suppress(Exception):
            self._close_gate()

    def _close_gate(self) -> list[Connection] | None:
        """The proxy allows nothing again; the ended check's requests (None: no proxy)."""
        if self.gate is None:
            return None
        seen = self.gate.close()
        return seen if self.gate.records() else None

    def _add(self, watched: Watched, text: str, *, dropped: bool) -> None:
        watched.unread.append(text)
        watched.unread_chars += len(text)
        watched.dropped = watched.dropped or dropped
        while watched.unread_chars > OUTPUT_TAIL * 2 and len(watched.unread) > 1:
            watched.unread_chars -= len(watched.unread.pop(0))
            watched.dropped = True
        self._tell(watched, text, flush=False)

    def _tell(self, watched: Watched, text: str, *, flush: bool) -> None:
        """Tells the listener each whole line of ``text`` (with what came before it)."""
        if self.listener is None:
            return
        lines = (watched.partial + text).split("\n")
        watched.partial = lines.pop()
        if flush or len(watched.partial) > PARTIAL_CHARS:
            if watched.partial:
                lines.append(watched.partial)
            watched.partial = ""
        for line in lines:
            event = CheckLine(
                watched.check_id, watched.handle, strip_control(line.rstrip("\r"))[:LINE_CHARS]
            )
            with contextlib.suppress(Exception):  # a listener's fault never ends the job
                self.listener(event)

    def _running(self, watched: Watched) -> CheckRunning:
        text = strip_control("".join(watched.unread))
        cut = watched.dropped or len(text.encode()) > OUTPUT_TAIL
        output = text.encode()[-OUTPUT_TAIL:].decode("utf-8", "ignore")
        watched.unread, watched.unread_chars, watched.dropped = [], 0, False
        return {
            "verdict": f"{watched.check_id}: running",
            "checkId": watched.check_id,
            "status": "running",
            "handle": watched.handle,
            "output": output,
            "outputTruncated": cut,
            "elapsedSeconds": round(time.monotonic() - watched.started, 1),
        }
