"""A project's environment: the base image, the setup steps that install its toolchain and
test dependencies (run once, reaching only the hosts of its ``egress`` through the job's
proxy), the repository files they may read, and the variables every check gets. Named in
the host configuration (``[environments.NAME]``) or given inline in the task; trusted
configuration, validated strictly."""

from __future__ import annotations

from typing import Annotated, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    StringConstraints,
    Tag,
    model_validator,
)

from controller.config.fields import ImageRef, check_env_names
from controller.config.network import EgressList
from controller.config.services import MAX_SERVICES, ServiceName, ServiceSpec
from patchbox_agent.globs import Glob, GlobError

EnvironmentName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")]
MAX_SETUP_STEPS = 32
MAX_INPUT_PATTERNS = 256
MAX_INPUT_FILES = 2000
"""Files the inputs may select from the baseline."""
MAX_INPUT_BYTES = 64 * 1024 * 1024
"""Bytes the inputs may select from the baseline, all files together."""


def check_input_pattern(pattern: str) -> None:
    """An input is a repository path or glob: relative, ``/``-separated, no ``..`` or ``.``
    component, no backslash, no NUL."""
    if pattern.startswith("/") or "\\" in pattern or "\x00" in pattern:
        msg = f"input {pattern[:200]!r} must be a relative repository path or glob"
        raise ValueError(msg)
    parts = pattern.removesuffix("/").split("/")
    if any(part in {"", ".", ".."} for part in parts):
        msg = f"input {pattern[:200]!r} leaves the repository or has an empty component"
        raise ValueError(msg)
    if parts[0] == ".git":
        msg = f"input {pattern[:200]!r} names the git directory"
        raise ValueError(msg)
    try:
        Glob(pattern)
    except GlobError as exc:
        msg = f"input {pattern[:200]!r} is not a valid glob: {exc}"
        raise ValueError(msg) from None


class EnvironmentSpec(BaseModel):
    """How a project's environment image is made. Every field is optional."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    base: ImageRef | None = None
    """The base image; by default the default sandbox base."""
    setup: list[
        Annotated[
            list[Annotated[str, StringConstraints(min_length=1, max_length=8192)]],
            Field(min_length=1, max_length=256),
        ]
    ] = Field(default_factory=list, max_length=MAX_SETUP_STEPS)
    """Commands (argv lists, no shell unless the argv names one), run in order as root in
    /workspace, reaching only the hosts of ``egress``."""
    inputs: list[Annotated[str, StringConstraints(min_length=1, max_length=1024)]] = Field(
        default_factory=list, max_length=MAX_INPUT_PATTERNS
    )
    """Repository paths or globs copied from the job's baseline into /workspace for the setup:
    the only repository files it sees."""
    env: dict[str, Annotated[str, StringConstraints(max_length=4096)]] = Field(
        default_factory=dict, max_length=128
    )
    """Variables of the setup steps and of every check (a check's own ``env`` wins)."""
    egress: EgressList | None = None
    """``host:port`` pairs (or ``preset:NAME``) the setup steps may reach through a proxy
    (:mod:`controller.config.network`); unset: the host configuration's
    ``network.setup_default``; empty: no network at all."""
    setup_timeout_seconds: float = Field(default=1800.0, gt=0, le=6 * 3600)
    """Wall-clock bound of the whole build."""
    setup_memory_mb: int = Field(default=4096, ge=128, le=65536)
    """Memory bound of each build step."""
    services: dict[ServiceName, ServiceSpec] = Field(default_factory=dict, max_length=MAX_SERVICES)
    """Services the checks reach by name on a network of the job's own
    (:mod:`controller.config.services`); none by default."""

    @model_validator(mode="after")
    def _valid(self) -> Self:
        check_env_names(self.env)
        for pattern in self.inputs:
            check_input_pattern(pattern)
        for step in self.setup:
            if any("\x00" in arg for arg in step):
                msg = "a setup step contains NUL"
                raise ValueError(msg)
        return self


def _kind(value: object) -> str:
    return "name" if isinstance(value, str) else "inline"


EnvironmentRef = Annotated[
    Annotated[EnvironmentName, Tag("name")] | Annotated[EnvironmentSpec, Tag("inline")],
    Discriminator(_kind),
]
"""A task's ``environment``: a name from the host configuration, or the block itself."""
