"""Jobs: the state machine (pure), their records on disk, and one write job per repository.

::

    created -> preparing -> running -> validating -> checking -> awaiting_review -> applied
       |           |           |           |             |    \\            \\-> discarded
       +-----------+-----------+-----------+-------------+-----+-> failed | cancelled
                                                          checking -> applied (gated auto)
                                           validating -> no_change -> discarded
    applied -> reverted -> applied (applied again)

A record is appended to its job's log (:mod:`controller.jobs.log`) at every transition,
durably, so ``jobs``, ``show``, ``apply`` and ``revert`` work from a later process.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import re
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_serializer, field_validator

from controller.errorinfo import ErrorInfo
from controller.errors import ErrorCode, InvalidTransitionError, PatchboxError, UsageError
from controller.jobs.junit import TestCase
from controller.jobs.log import RecordLog, Saved
from controller.paths import patchbox_home
from controller.repo.baseline import Baseline
from controller.sandbox.egress import Connection
from controller.sandbox.labels import controller_alive

JobState = Literal[
    "created",
    "preparing",
    "running",
    "validating",
    "checking",
    "awaiting_review",
    "applied",
    "reverted",
    "discarded",
    "no_change",
    "failed",
    "cancelled",
]

_ABORTABLE = frozenset({"failed", "cancelled"})
TRANSITIONS: dict[str, frozenset[str]] = {
    "created": frozenset({"preparing"}) | _ABORTABLE,
    "preparing": frozenset({"running"}) | _ABORTABLE,
    "running": frozenset({"validating"}) | _ABORTABLE,
    "validating": frozenset({"checking", "no_change"}) | _ABORTABLE,
    "checking": frozenset({"awaiting_review", "applied"}) | _ABORTABLE,
    "awaiting_review": frozenset({"applied", "discarded"}),
    "applied": frozenset({"reverted"}),
    "reverted": frozenset({"applied"}),
    "discarded": frozenset(),
    "no_change": frozenset({"discarded"}),
    "failed": frozenset({"discarded"}),
    "cancelled": frozenset({"discarded"}),
}
"""Every allowed move; anything else is a bug or a user asking for the impossible."""

ACTIVE = frozenset({"created", "preparing", "running", "validating", "checking"})
"""A job in one of these states has a controller working on it."""
FINAL = frozenset({"reverted", "discarded", "no_change", "failed", "cancelled"})
"""Nothing more happens to these by itself (a failed job may still be discarded)."""


def check_transition(current: str, new: str) -> None:
    if new not in TRANSITIONS.get(current, frozenset()):
        msg = f"a job that is {current} cannot become {new}"
        raise InvalidTransitionError(msg)


def _absent(value: object) -> bool:
    return value is None


_OMITTED = Field(default=None, exclude_if=_absent)
"""An optional key written only when it has a value (as the record has always been)."""


class _Value(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ToolCallRecord(_Value):
    """One tool call the model made, in the order made."""

    turn: int
    id: str
    name: str
    ok: bool
    error_code: str | None = None
    """The tool's error code when ``ok`` is false (``CANCELLED`` when the job was
    cancelled while it ran); None when it succeeded."""
    error_message: str | None = Field(default=None, exclude_if=lambda v: v is None)
    """The error's message, as the model got it (bounded)."""
    verdict: str | None = Field(default=None, exclude_if=lambda v: v is None)
    """A ``run_check`` call's check verdict (``tests: failed, exit 1``): ``ok`` says the
    call ran, this says how the check went."""


TRANSCRIPT_TEXT = 16 * 1024
"""Characters kept of each model message, tool arguments and tool result in the transcript."""


class TranscriptCall(_Value):
    """One tool call in the transcript: what the model asked and what it got back."""

    id: str
    name: str
    arguments: str
    """The raw arguments, cut at :data:`TRANSCRIPT_TEXT` characters."""
    ok: bool
    result: str
    """The JSON text the model got back (result or error), cleaned of control characters
    and cut at :data:`TRANSCRIPT_TEXT` characters."""
    verdict: str | None = Field(default=None, exclude_if=lambda v: v is None)
    """A ``run_check`` call's check verdict (``tests: failed, exit 1``)."""
    truncated: bool = False
    duration_ms: int = 0


class TranscriptTurn(_Value):
    """One model turn: its message, its cost where the provider says, and its calls."""

    turn: int
    text: str | None = None
    usage: dict[str, int] = Field(default_factory=dict)
    model_ms: int = 0
    """How long the model took to answer."""
    calls: list[TranscriptCall] = Field(default_factory=list)


EffectTool = Literal["replace_text", "apply_patch", "run_check"]
"""The tools that may change the workspace."""


class LedgerFile(_Value):
    path: str
    sha256: str | None = None
    """The content the call left; None when it removed the path (a patch) or does not
    say (a check)."""


class LedgerEntry(_Value):
    """One side-effecting call (an edit, a patch, a check run): its intent, the workspace
    version before it and the files it reports."""

    turn: int
    id: str
    tool: EffectTool
    intent: Literal["edit", "patch", "check"]
    version_before: int
    files: list[LedgerFile] = Field(default_factory=list)
    outcome: Literal["done", "rejected", "unknown"]
    """``unknown`` when the call raised: it may or may not have changed the workspace."""


class FileChange(_Value):
    """One file of the validated diff and the calls that account for it."""

    path: str
    old_path: str | None = None
    kind: str
    """As the validated change set names it: ``create``, ``modify``, ``delete``, ``rename``."""
    added: int
    removed: int
    sha256_before: str | None = None
    sha256_after: str | None = None
    calls: list[str] = Field(default_factory=list)
    """Ids of the ledger entries that name the path."""


class ControlLine(_Value):
    """An added line of the diff holding characters a terminal acts on or hides: the file,
    the line's number after the change and each such character as an escape (``\\x1b``,
    ``\\u202e``); :class:`controller.changes.changeset.ControlLine`."""

    path: str
    line: int
    characters: list[str]


class NetworkRequest(_Value):
    """One request a check made through the job's proxy: where to, what the proxy decided
    (and why it refused), bytes each way, when."""

    host: str
    port: int
    address: str | None = None
    """The address the proxy connected to (resolved by the proxy itself)."""
    allowed: bool
    reason: str | None = _OMITTED
    """Why it was refused: ``not_allowed`` (the pair is not in the check's egress),
    ``inward`` (the name resolves to a loopback, private, link-local, metadata, multicast or
    unspecified address), ``unresolved``, ``proxy``; absent when allowed."""
    status: int
    bytes_out: int
    bytes_in: int
    start: float
    end: float


def requests_of(connections: Iterable[Connection]) -> list[NetworkRequest]:
    """The proxy's connections as a record keeps them."""
    return [
        NetworkRequest(
            host=c.host,
            port=c.port,
            address=c.address,
            allowed=c.allowed,
            reason=c.reason or None,
            status=c.status,
            bytes_out=c.bytes_out,
            bytes_in=c.bytes_in,
            start=c.start,
            end=c.end,
        )
        for c in connections
    ]


class BuiltStep(_Value):
    """One step of an environment's build and the seconds it took."""

    name: str
    seconds: float


class EnvironmentRecord(_Value):
    """The project environment's image a job ran on: its tag and key, its base, whether
    this job built it, how long finding or building it took, the build's steps, and what
    its setup could reach and reached through its proxy (when this job built it)."""

    tag: str
    key: str
    base: str
    built: bool
    seconds: float
    steps: list[BuiltStep] = Field(default_factory=list)
    egress: list[str] = Field(default_factory=list, exclude_if=lambda v: not v)
    """The ``host:port`` pairs the setup could reach (absent: none)."""
    network: list[NetworkRequest] = Field(default_factory=list, exclude_if=lambda v: not v)
    """The requests the setup's proxy saw (absent: none, or the image was already there)."""


class CheckResult(_Value):
    """One check as run in the fresh check sandbox (or skipped), bound to the diff."""

    id: str
    status: Literal["passed", "failed", "timed_out", "skipped"]
    exit_code: int | None
    duration_ms: int
    output_tail: str
    diff_sha256: str
    required: bool
    reason: str | None = _OMITTED
    """Why it was skipped; absent for a check that ran."""
    source: Literal["docker-exec", "none"]
    """Where the status comes from: Docker's exit code for the exec, or nowhere."""
    tests: list[TestCase] | None = _OMITTED
    """The test cases of the JUnit XML the check wrote (its ``junit``), when it did."""
    junit_error: str | None = _OMITTED
    """Why the check's JUnit XML could not be used (missing, too large, not XML)."""
    network: list[NetworkRequest] | None = _OMITTED
    """Every request the check made through the job's proxy (a check with an ``egress``)."""


class BaselineCheck(_Value):
    """One required check as run once on the baseline, in the job's own sandbox, before the
    model's first turn (:mod:`controller.jobs.baselinechecks`)."""

    id: str
    status: Literal["passed", "failed", "timed_out", "cannot_run"]
    """``cannot_run``: the check could not start or collect (the rule is
    :func:`controller.jobs.baselinechecks.cannot_run`); the job stops ``CHECK_CANNOT_RUN``."""
    exit_code: int | None
    duration_ms: int
    output_tail: str
    reason: str | None = _OMITTED
    """Why it could not run; absent otherwise."""
    network: list[NetworkRequest] | None = _OMITTED
    """Every request the check made through the job's proxy (a check with an ``egress``)."""


CheckChangeKind = Literal["fixed", "still_failing", "newly_failing", "still_passing"]


class CheckChange(_Value):
    """One required check before the model's change (on the baseline) and after it (in the
    fresh check sandbox)."""

    id: str
    before: str
    """The baseline run's status: ``passed``, ``failed`` or ``timed_out``."""
    after: str
    """The check sandbox's status: ``passed``, ``failed`` or ``timed_out``."""
    change: CheckChangeKind


class Decision(_Value):
    """What was decided about the diff and why; the keys that do not apply are absent."""

    mode: str
    applied: bool = False
    gates: dict[str, bool] = Field(default_factory=dict)
    """The auto gates by name, each true when it holds (auto mode only)."""
    checks: str | None = _OMITTED
    """Trusted-auto only: that the checks were skipped and nothing is claimed of them."""
    apply_conflict: str | None = _OMITTED
    """Why applying failed although the rules said apply."""
    reason: str
    failed_checks: list[str] | None = _OMITTED
    """The required checks that did not pass after the change (they fail the job)."""
    still_failing: list[str] | None = _OMITTED
    """Those of :attr:`failed_checks` that failed on the baseline too: the change did not
    break them."""
    check_changes: list[CheckChange] | None = _OMITTED
    """Each required check before and after the change, when it ran on the baseline."""
    applied_by: str | None = _OMITTED
    """``user`` once ``patchbox apply`` applied the job."""
    merged: list[str] | None = _OMITTED
    """Paths ``patchbox apply --merge`` merged three-way."""


class JobRecord(BaseModel):
    """Everything a later process needs about a job. Paths of the user's machine live here
    (the job's own state), never in the evidence bundle."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    job_id: str
    repo: str
    state: JobState = "created"
    created_at: float = Field(default_factory=time.time)
    updated_at: float = Field(default_factory=time.time)
    history: list[tuple[str, float]] = Field(default_factory=list)
    task: dict[str, Any] = Field(default_factory=dict)
    """The task as the operator gave it (the evidence shows it as it is); read back only
    through :attr:`allowed_paths`."""
    mode: str = "review"
    consent: dict[str, bool] = Field(default_factory=dict)
    runtime: str = "runc"
    baseline: Baseline | None = None
    environment: EnvironmentRecord | None = Field(default=None, exclude_if=lambda v: v is None)
    """The project environment's image, when the task has one."""
    error: ErrorInfo | None = None
    """``{"code", "message"}``: an error as data, the shape every error has."""
    diagnostics: dict[str, Any] = Field(default_factory=dict)
    """What was found on the way (paths, reasons, where the baseline came from): shown and
    stored whole, never read back by the controller."""
    tool_calls: list[ToolCallRecord] = Field(default_factory=list)
    transcript: list[TranscriptTurn] = Field(default_factory=list, exclude_if=lambda v: not v)
    """The conversation: each turn's message, calls with their arguments and results."""
    ledger: list[LedgerEntry] = Field(default_factory=list)
    diff_sha256: str | None = None
    files: list[FileChange] = Field(default_factory=list)
    control_characters: list[ControlLine] = Field(default_factory=list, exclude_if=lambda v: not v)
    """The diff's added lines with control, format or bidi characters (a flag for the
    reviewer; at most 100), also for a diff the rules refused."""
    baseline_checks: list[BaselineCheck] = Field(default_factory=list, exclude_if=lambda v: not v)
    """The required checks as run on the baseline before the model's first turn (none when
    the task has no required check or sets ``baseline_checks`` false)."""
    checks: list[CheckResult] = Field(default_factory=list)
    decision: Decision | None = None
    """None until the job is decided (stored as ``{}``)."""
    timings_ms: dict[str, int] = Field(default_factory=dict)
    final_message: str | None = None
    controller: str = ""
    """The token of the controller running the job (see :mod:`controller.sandbox.labels`)."""
    controller_host: str = ""

    @field_validator("decision", mode="before")
    @classmethod
    def _undecided(cls, value: object) -> object:
        return None if value == {} else value

    @field_serializer("decision")
    def _decision_or_empty(self, value: Decision | None) -> object:
        return {} if value is None else value

    @property
    def allowed_paths(self) -> list[str] | None:
        """The task's ``allowed_paths`` (None: no limit beyond the protected list)."""
        paths = self.task.get("allowed_paths")
        return [str(p) for p in paths] if isinstance(paths, list) else None

    def move(self, new: JobState) -> None:
        check_transition(self.state, new)
        now = time.time()
        self.state = new
        self.updated_at = now
        self.history = [*self.history, (new, now)]


LOGGED = (
    "history",
    "tool_calls",
    "transcript",
    "ledger",
    "files",
    "control_characters",
    "checks",
)
"""The record's lists, appended to its log item by item (:mod:`controller.jobs.log`)."""

RECORDS = RecordLog(JobRecord, LOGGED)
LEGACY_FILE = "job.json"
"""A record of format 1, written whole at every save before the log: read, and replaced by
the log at its next save."""


LAST = "last"
"""The job id that names the job of a state folder created last."""
AMBIGUOUS_SHOWN = 10
"""The candidates an ambiguous id prefix names."""
CANCEL_REQUEST = "cancel.request"
"""A file in a job's folder asking its controller to cancel it."""


class JobStore:
    """Job records under ``$PATCHBOX_HOME/jobs/<id>/``: ``log.jsonl``
    (:mod:`controller.jobs.log`), the ``.patch``, the evidence bundle and the JUnit XML of
    the checks."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = root or patchbox_home() / "jobs"

    def folder(self, job_id: str) -> Path:
        if not job_id or "/" in job_id or job_id.startswith("."):
            msg = f"not a job id: {job_id[:64]!r}"
            raise UsageError(msg)
        return self.root / job_id

    def save(self, record: JobRecord, *, durable: bool = True) -> Saved:
        """Appends what the record has new since this process last loaded or saved it to
        its log, as one save: a reader sees the record of one save or of the next, never a
        mix. ``durable=False`` skips the fsyncs (as the tool loop's save after each turn,
        :meth:`save_turn`): a killed process loses nothing (the page cache has it), a
        machine that loses power may come back with the record of an earlier turn; every
        state change is written durably. A record read from a ``job.json`` goes whole into
        the log at its first save, and the ``job.json`` is removed."""
        folder = self.folder(record.job_id)
        if RECORDS.knows(record, folder):
            with contextlib.suppress(FileNotFoundError):  # else its folder went: made again
                return RECORDS.write(folder, record, durable=durable)
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        saved = RECORDS.write(folder, record, durable=durable)
        (folder / LEGACY_FILE).unlink(missing_ok=True)
        return saved

    def save_turn(self, record: JobRecord) -> Saved:
        """The tool loop's save after each turn, which changes only the record's lists (its
        tool calls, transcript and ledger): their new entries appended, not fsynced, as
        ``save(record, durable=False)`` would, without looking at the other fields."""
        folder = self.folder(record.job_id)
        if RECORDS.knows(record, folder):
            with contextlib.suppress(FileNotFoundError):
                return RECORDS.write(folder, record, durable=False, fields=False)
        return self.save(record, durable=False)

    def load(self, job_id: str) -> JobRecord:
        """The job's record as its last save left it: from its log, or from the
        ``job.json`` of a job saved before the log (``USAGE_ERROR`` for an unknown id, or a
        record of a format this version does not read)."""
        folder = self.folder(job_id)
        record = RECORDS.read(folder)
        if record is not None:
            return record
        try:
            data = (folder / LEGACY_FILE).read_bytes()
        except FileNotFoundError as exc:
            msg = f"no job {job_id[:64]!r} in {self.root}"
            raise UsageError(msg) from exc
        return JobRecord.model_validate_json(data)

    def resolve(self, ref: str) -> str:
        """The id of the job ``ref`` names: a whole id, a prefix only one job's id starts
        with, or ``last`` (the job of this state folder created last). ``USAGE_ERROR``
        naming the state folder when none matches, and listing the candidates when a
        prefix is ambiguous."""
        if ref == LAST:
            records = self.all()
            if not records:
                msg = f"no job in {self.root}: 'last' names the newest job there"
                raise UsageError(msg)
            return records[-1].job_id
        self.folder(ref)  # a name that can be an id at all
        names = self._names()
        if ref in names:
            return ref
        candidates = sorted(n for n in names if n.startswith(ref))
        if not candidates:
            msg = f"no job {ref[:64]!r} in {self.root}"
            raise UsageError(msg)
        if len(candidates) > 1:
            shown = ", ".join(candidates[:AMBIGUOUS_SHOWN])
            more = len(candidates) - AMBIGUOUS_SHOWN
            rest = f" and {more} more" if more > 0 else ""
            msg = (
                f"{ref[:64]!r} is the start of {len(candidates)} job ids: {shown}{rest}; "
                "give more of the id"
            )
            raise UsageError(msg)
        return candidates[0]

    def _names(self) -> set[str]:
        """The names of the job folders (each a job id)."""
        try:
            return {
                entry.name
                for entry in self.root.iterdir()
                if not entry.name.startswith(".") and entry.is_dir()
            }
        except FileNotFoundError:
            return set()

    def request_cancel(self, job_id: str) -> None:
        """Asks the controller running the job to cancel it: a file in the job's folder that
        its engine watches (:data:`CANCEL_REQUEST`), whichever process or host runs it."""
        path = self.folder(job_id) / CANCEL_REQUEST
        with contextlib.suppress(FileExistsError):
            path.touch(mode=0o600, exist_ok=False)

    def cancel_requested(self, job_id: str) -> bool:
        """Whether :meth:`request_cancel` asked for the job's end."""
        return (self.folder(job_id) / CANCEL_REQUEST).exists()

    def all(self, repo: str | None = None) -> list[JobRecord]:
        out = []
        if self.root.is_dir():
            for folder in self.root.iterdir():
                with contextlib.suppress(OSError, ValueError, UsageError):
                    record = self.load(folder.name)
                    if repo is None or record.repo == repo:
                        out.append(record)
        return sorted(out, key=lambda r: r.created_at)


INTERRUPTED_MESSAGE = (
    "the controller that ran this job is gone (killed or crashed); its sandboxes are removed"
)


def is_orphaned(record: JobRecord) -> bool:
    """Whether ``record`` is active but its controller is gone. A record without a
    controller token (written by an older version) is judged by its repository's write
    lock: free means nobody works on it."""
    if record.state not in ACTIVE:
        return False
    if record.controller:
        return not controller_alive(record.controller, record.controller_host)
    try:
        with write_lock(record.repo):
            return True
    except PatchboxError:
        return False


def mark_interrupted(store: JobStore, record: JobRecord) -> JobRecord:
    """Ends an orphaned job ``failed`` with ``INTERRUPTED`` (a no-op for any other job).
    Safe to race with another process doing the same."""
    if not is_orphaned(record):
        return record
    record.error = ErrorInfo(code=str(ErrorCode.INTERRUPTED), message=INTERRUPTED_MESSAGE)
    record.move("failed")
    store.save(record)
    return record


def repo_key(repo: str) -> str:
    return hashlib.sha256(repo.encode()).hexdigest()[:24]


_HOLDER = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
"""What a lock file may name as its holder: a job id."""


def lock_holder(handle: IO[bytes]) -> str | None:
    """The job id a repository's lock file names (its holder's), if it names one."""
    with contextlib.suppress(OSError):
        handle.seek(0)
        text = handle.read(256).decode("ascii", "replace").strip()
        if _HOLDER.fullmatch(text):
            return text
    return None


def already_running(holder: str | None) -> PatchboxError:
    """``JOB_ALREADY_RUNNING``, naming the job that holds the repository when it is known:
    the one message every front door shows for a repository another job writes."""
    if holder:
        msg = f"another job is already running on this repository: job {holder} holds it"
    else:
        msg = "another job is already running on this repository"
    return PatchboxError(msg, code=ErrorCode.JOB_ALREADY_RUNNING)


@contextlib.contextmanager
def write_lock(repo: str, root: Path | None = None, *, holder: str = "") -> Iterator[None]:
    """Held for the whole of a write job on ``repo``: a second one gets
    ``JOB_ALREADY_RUNNING`` at once (no queue), naming ``holder`` (the job id of the one
    that holds it) when it gave one. The kernel drops the lock if the process dies, so a
    crash never leaves a repository locked."""
    folder = root or patchbox_home() / "locks"
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    with (folder / f"{repo_key(repo)}.lock").open("a+b") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            raise already_running(lock_holder(handle)) from exc
        try:
            with contextlib.suppress(OSError):  # the name is a courtesy, the lock the rule
                handle.truncate(0)
                handle.write(holder.encode("ascii", "replace"))
                handle.flush()
            yield
        finally:
            with contextlib.suppress(OSError):
                handle.truncate(0)
            fcntl.flock(handle, fcntl.LOCK_UN)


def dumps(data: object) -> str:
    return json.dumps(data, indent=2, sort_keys=True, default=str)
