"""An error as data: its stable code, its message and a remedy (:class:`Hint`) when there is
one. What a job's record keeps, what the views show and what crosses a process boundary;
:meth:`controller.errors.PatchboxError.info` makes one of an exception."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

HintOption = Literal[
    "include_local_changes", "merge", "allow_insecure_http", "allow_insecure_http_hosts"
]
"""A request option that changes the outcome, by the engine's name for it."""
HintAction = Literal["build_image", "list_environments", "use_environment", "use_rebased"]
"""An operation that remedies the error, by the engine's name for it."""


class Hint(BaseModel):
    """A remedy as data: the option to set or the operation to run (on ``job_id`` where it
    takes one). Each front door says it in its own words: a CLI flag or command, an MCP
    argument, an HTTP field; the engine never names them."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    option: HintOption | None = Field(default=None, exclude_if=lambda v: v is None)
    action: HintAction | None = Field(default=None, exclude_if=lambda v: v is None)
    job_id: str | None = Field(default=None, exclude_if=lambda v: v is None)


class ErrorInfo(BaseModel):
    """An error as data: its stable code, its message (no secret, no host path where it
    leaves the host) and a remedy when there is one."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    code: str
    message: str
    hint: Hint | None = Field(default=None, exclude_if=lambda v: v is None)
