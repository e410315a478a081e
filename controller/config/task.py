"""The operator's task file: trusted configuration, validated strictly."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Literal, Self

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    model_validator,
)

from controller.config.checkargs import ArgSlot, SlotName, check_declaration, expand_argv
from controller.config.environment import EnvironmentRef
from controller.config.fields import check_env_names
from controller.config.inputfile import read_input_file
from controller.config.limits import Limits
from controller.config.network import EgressList
from controller.config.services import MAX_SERVICES, ServiceName
from controller.errormap import describe_validation
from controller.errors import UsageError
from patchbox_agent import bounds

CheckId = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")]

CHECK_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": "/tmp",
    "LANG": "C.UTF-8",
    "TMPDIR": "/tmp",
    "PYTHONDONTWRITEBYTECODE": "1",
    "CI": "true",
}
"""The whole environment of a check, before the check's own (non-secret) additions."""


class CheckSpec(BaseModel):
    """One check: an argv (no shell), run in /workspace with a minimal environment."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    argv: list[Annotated[str, StringConstraints(min_length=1, max_length=4096)]] = Field(
        min_length=1, max_length=256
    )
    timeout_seconds: float = Field(default=300.0, gt=0, le=bounds.MAX_RUN_SECONDS)
    required: bool = True
    description: Annotated[str, StringConstraints(min_length=1, max_length=300)] | None = None
    """What the check checks, in a few words, for the model (``run_check`` lists it); its
    command is shown when there is none."""
    mutates: bool = False
    """A check that may change files (a formatter); its changes are recorded as its effects.
    Any other check that changes a file fails the job."""
    env: dict[str, Annotated[str, StringConstraints(max_length=4096)]] = Field(default_factory=dict)
    """Extra variables; names must not look like secrets or proxies."""
    output_limit: int = Field(default=bounds.DEFAULT_RUN_OUTPUT, ge=1024, le=bounds.MAX_RUN_OUTPUT)
    """Bytes of output kept (the agent's bounds: its default, at most its maximum)."""
    junit: Annotated[str, StringConstraints(min_length=1, max_length=1024)] | None = None
    """Where the check writes its own JUnit XML (``pytest --junitxml=/tmp/junit.xml``): an
    absolute path in the sandbox or one relative to /workspace. Its test cases go into the
    job's report instead of one case for the check."""
    egress: EgressList = Field(default_factory=list)
    """``host:port`` pairs (or ``preset:NAME``) the check may reach through the job's proxy
    (:mod:`controller.config.network`); none (the default): no network at all."""
    services: list[ServiceName] | None = Field(default=None, max_length=MAX_SERVICES)
    """The environment's services the check needs, started (and ready) before it runs;
    unset: every service of the environment; empty: none."""
    args: dict[SlotName, ArgSlot] = Field(default_factory=dict, max_length=16)
    """Argument slots a model may fill (:mod:`controller.config.checkargs`): each named in
    ``argv`` as one whole element, ``{name}``. The required checks that decide the job
    always run with the defaults."""

    @model_validator(mode="after")
    def _safe_env(self) -> Self:
        check_env_names(self.env)
        if any("\x00" in a for a in self.argv):
            msg = "argv contains NUL"
            raise ValueError(msg)
        check_declaration(self.argv, self.args)
        if self.junit is not None and ("\x00" in self.junit or self.junit.startswith("-")):
            msg = "junit must be a path"
            raise ValueError(msg)
        return self

    def environment(self) -> dict[str, str]:
        return {**CHECK_ENV, **self.env}

    def argv_with(self, values: Mapping[str, Sequence[str]] | None = None) -> list[str]:
        """The argv that runs: each slot's placeholder replaced by the given ``values``
        (validated by :func:`controller.config.checkargs.check_values`) or its default."""
        return expand_argv(self.argv, self.args, values or {})


def _allowed_path(text: str) -> str:
    """A path or folder relative to the repository's top, as ``allowed_paths`` matches them
    (by prefix, whole segments): a glob, an absolute path or ``..`` would match nothing."""
    if any(c in text for c in "*?["):
        msg = (
            f"allowed_paths entry {text[:200]!r} is a glob; name a file or a folder "
            "(a folder holds everything under it: 'src/')"
        )
        raise ValueError(msg)
    if text.startswith("/"):
        msg = f"allowed_paths entry {text[:200]!r}: use a path relative to the repository's top"
        raise ValueError(msg)
    if ".." in text.split("/") or "\x00" in text:
        msg = f"allowed_paths entry {text[:200]!r}: '..' and NUL are not allowed"
        raise ValueError(msg)
    return text


AllowedPath = Annotated[
    str, StringConstraints(min_length=1, max_length=4096), AfterValidator(_allowed_path)
]
"""One ``allowed_paths`` entry: a file or a folder relative to the repository's top."""


class TaskSpec(BaseModel):
    """A job's task. Every field but ``prompt`` is optional; unknown fields are errors."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    prompt: Annotated[str, StringConstraints(min_length=1, max_length=100_000)]
    allowed_paths: list[AllowedPath] | None = None
    checks: dict[CheckId, CheckSpec] = Field(default_factory=dict)
    mode: Literal["review", "auto", "trusted-auto"] = "review"
    limits: Limits = Field(default_factory=Limits)
    environment: EnvironmentRef | None = None
    """The project's environment: a name from the host configuration, or given here."""
    baseline_checks: bool = True
    """Whether the required checks run once on the baseline, in the job's sandbox, before
    the model's first turn (what passed and failed before the change)."""


MAX_TASK_FILE_BYTES = 1024 * 1024
"""The largest task file read: a prompt, a few checks and limits fit many times over."""


def task_from(data: bytes | str | object, *, what: str = "the task") -> TaskSpec:
    """A task from JSON text or from a parsed JSON object; :class:`UsageError` naming the
    fields that are wrong (never their values) otherwise."""
    try:
        if isinstance(data, bytes | str):
            return TaskSpec.model_validate_json(data)
        return TaskSpec.model_validate(data)
    except ValidationError as exc:
        fields = describe_validation(exc, subject="task", max_chars=1000, model=TaskSpec)
        msg = f"{what} is invalid: {fields}"
        raise UsageError(msg[:1000]) from exc


def load_task(path: Path) -> TaskSpec:
    """Reads and validates a task file. :class:`UsageError` (exit 2) when it is missing,
    not a regular file (a FIFO or a device never blocks: :mod:`controller.config.inputfile`),
    larger than :data:`MAX_TASK_FILE_BYTES`, or invalid."""
    raw = read_input_file(path, "task file", MAX_TASK_FILE_BYTES)
    return task_from(raw, what="the task file")
