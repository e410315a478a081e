"""Jobs: the state machine (pure) and the record's typed parts (its store on disk, the log
and the write lock are :mod:`controller.jobs.store`).

::

    created -> preparing -> running -> validating -> checking -> awaiting_review -> applied
       |           |           |           |             |    \\            \\-> discarded
       +-----------+-----------+-----------+-------------+-----+-> failed | cancelled
                                                          checking -> applied (gated auto)
                                           validating -> no_change -> discarded
    applied -> reverted -> applied (applied again)
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_serializer, field_validator

from controller.errorinfo import ErrorInfo
from controller.errors import InvalidTransitionError
from controller.jobs.junit import TestCase
from controller.repo.baseline import Baseline

if TYPE_CHECKING:
    from controller.sandbox.egress import Connection

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


class ServiceRecord(_Value):
    """One service container of a job (a check's database, cache): its image, for which
    sandbox it ran (the tools' ``loop``, or the fresh ``checks`` one), how long it took to
    be ready, and how it was when it was removed."""

    name: str
    image: str
    image_id: str
    sandbox: Literal["loop", "checks"]
    ready_seconds: float | None
    """None: it never became ready."""
    exit: str
    """``running`` (removed while it ran), ``exited N``, ``oom`` or ``not ready``."""
    log_tail: str = Field(default="", exclude_if=lambda v: not v)
    """Its log's last lines, when it failed or exited."""


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


class ParentLink(_Value):
    """The job this one was made from: ``rebase`` carried its diff onto the repository as
    it is now; a ``follow-up`` started from its result (its baseline plus its diff)."""

    job_id: str
    diff_sha256: str | None
    relation: Literal["rebase", "follow-up"] = "rebase"


class AttemptLink(_Value):
    """One of N attempts of the same task from the same baseline (``run --attempts``):
    ``index`` from 1, and every attempt's job id in order (this one's included)."""

    index: int
    job_ids: list[str]


class StaleMark(_Value):
    """Why a job's decision and checks no longer hold: ``rebased`` as job ``by``, whose
    checks ran on the repository as it is now; or ``followed_up``: its change was applied
    with its follow-up ``by`` (the two in one apply)."""

    by: str
    reason: Literal["rebased", "followed_up"] = "rebased"
    at: float


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


class CheckFact(_Value):
    """A required check as the job ran it: what its attestation states."""

    argv: list[str]
    egress: list[str] = Field(default_factory=list)


class ProvenanceFacts(_Value):
    """What the job's signed provenance states beyond the rest of the record
    (:mod:`controller.jobs.attest`)."""

    result_tree: str
    """The git tree the diff makes of the baseline."""
    sandbox_image: str
    """The id of the sandbox image (empty when the job ran in a project environment)."""
    environment_image: str | None = None
    agent_digest: str
    rules_digest: str
    checks: dict[str, CheckFact] = Field(default_factory=dict)
    """The required checks."""
    setup_egress: list[str] = Field(default_factory=list)
    key_id: str | None = None
    """The signing key's id once the attestations are written."""


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
    services: list[ServiceRecord] = Field(default_factory=list, exclude_if=lambda v: not v)
    """The services the job's checks used, each container once (none without services)."""
    decision: Decision | None = None
    """None until the job is decided (stored as ``{}``)."""
    parent: ParentLink | None = _OMITTED
    """The job this one was made from (none for a job made by a model)."""
    attempt: AttemptLink | None = _OMITTED
    """Which of N attempts of one task this job is; applying one discards the others."""
    provenance: ProvenanceFacts | None = _OMITTED
    """What the job's attestations state (none until its change is collected)."""
    stale: StaleMark | None = _OMITTED
    """Set once the job was rebased: its decision and checks are kept, marked stale, and
    it is not applied (``JOB_REBASED``)."""
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
