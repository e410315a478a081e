"""The six tools a model may call: strict argument models and their JSON Schemas.

Every argument object is validated here, on the controller, before anything reaches the
sandbox: unknown, missing or mistyped fields and out-of-range values are
``TOOL_ARGUMENTS_INVALID`` (retryable, no side effect). Arguments that are not a JSON object,
or are larger than :data:`MAX_ARGUMENT_BYTES`, end the job.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    model_validator,
)

from controller.errors import (
    ArgumentsNotAnObjectError,
    ErrorCode,
    ProtocolError,
    ToolError,
    describe_validation,
)
from controller.sandbox.protocol import decode_json

MAX_ARGUMENT_BYTES = 8 * 1024 * 1024 + 4096
"""The largest arguments object accepted (an 8 MiB patch plus its envelope)."""

WorkspacePath = Annotated[str, StringConstraints(min_length=1, max_length=4096)]
Glob = Annotated[str, StringConstraints(min_length=1, max_length=512)]


class _Args(BaseModel):
    model_config = ConfigDict(
        extra="forbid", frozen=True, strict=True, use_attribute_docstrings=True
    )


class ListFilesArgs(_Args):
    """List the files of the workspace that the model may see."""

    glob: Glob | None = None
    """Only paths matching this glob (``*`` stays within a folder, ``**`` crosses folders)."""
    maxResults: int | None = Field(default=None, ge=1, le=10000)  # noqa: N815 - wire name
    """At most this many paths (default 1000)."""


class SearchTextArgs(_Args):
    """Search the text files of the workspace; returns path, line number and line."""

    query: Annotated[str, StringConstraints(min_length=1, max_length=1000)]
    """A literal string, or a regular expression when ``regex`` is true."""
    glob: Glob | None = None
    """Only files whose path matches this glob."""
    maxResults: int | None = Field(default=None, ge=1, le=1000)  # noqa: N815 - wire name
    """At most this many hits (default 100)."""
    regex: bool = False
    """Treat ``query`` as a regular expression (run with a time bound)."""


class ReadFileArgs(_Args):
    """Read a range of lines of one text file."""

    path: WorkspacePath
    """A relative POSIX path inside the workspace."""
    startLine: int | None = Field(default=None, ge=1, le=10_000_000)  # noqa: N815 - wire name
    """First line, 1-based (default 1)."""
    endLine: int | None = Field(default=None, ge=1, le=10_000_000)  # noqa: N815 - wire name
    """Last line, inclusive (default: a bounded window)."""

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if (
            self.startLine is not None
            and self.endLine is not None
            and self.endLine < self.startLine
        ):
            msg = "endLine must not be before startLine"
            raise ValueError(msg)
        return self


class ReplaceTextArgs(_Args):
    """Replace the one exact occurrence of ``oldText`` in a file with ``newText``."""

    path: WorkspacePath
    oldText: Annotated[str, StringConstraints(min_length=1, max_length=1024 * 1024)]  # noqa: N815
    """Text that occurs exactly once in the file."""
    newText: Annotated[str, StringConstraints(max_length=1024 * 1024)]  # noqa: N815
    """Its replacement; must differ from ``oldText``."""

    @model_validator(mode="after")
    def _differs(self) -> Self:
        if self.oldText == self.newText:
            msg = "newText must differ from oldText"
            raise ValueError(msg)
        return self


class ApplyPatchArgs(_Args):
    """Apply one canonical unified git diff (``diff --git a/P b/P`` sections) to the workspace."""

    patch: Annotated[str, StringConstraints(min_length=1, max_length=8 * 1024 * 1024)]


class RunCheckArgs(_Args):
    """Run one check of the trusted configuration (by id) and get its result."""

    checkId: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")]  # noqa: N815


ARGUMENT_MODELS: dict[str, type[_Args]] = {
    "list_files": ListFilesArgs,
    "search_text": SearchTextArgs,
    "read_file": ReadFileArgs,
    "replace_text": ReplaceTextArgs,
    "apply_patch": ApplyPatchArgs,
    "run_check": RunCheckArgs,
}


def parse_arguments(tool: str, raw: str | dict[str, Any]) -> _Args:
    """Validates one tool call's arguments (a JSON text or an already decoded object)."""
    model = ARGUMENT_MODELS.get(tool)
    if model is None:
        raise ToolError(f"unknown tool {tool[:64]!r}", code=ErrorCode.TOOL_ARGUMENTS_INVALID)
    if isinstance(raw, str):
        if len(raw.encode("utf-8", "surrogatepass")) > MAX_ARGUMENT_BYTES:
            raise ArgumentsNotAnObjectError(
                "tool arguments too large", code=ErrorCode.TOOL_ARGUMENTS_INVALID
            )
        try:
            value: Any = decode_json(raw.encode("utf-8", "surrogatepass"))
        except ProtocolError as exc:
            if "not a JSON object" in exc.message:
                raise ArgumentsNotAnObjectError(
                    "tool arguments are not a JSON object", code=ErrorCode.TOOL_ARGUMENTS_INVALID
                ) from exc
            raise ToolError(
                "tool arguments are not valid JSON", code=ErrorCode.TOOL_ARGUMENTS_INVALID
            ) from exc
    else:
        value = raw
        if len(json.dumps(value, default=str)) > MAX_ARGUMENT_BYTES:
            raise ArgumentsNotAnObjectError(
                "tool arguments too large", code=ErrorCode.TOOL_ARGUMENTS_INVALID
            )
    if not isinstance(value, dict):
        raise ArgumentsNotAnObjectError(
            "tool arguments are not a JSON object", code=ErrorCode.TOOL_ARGUMENTS_INVALID
        )
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        detail = describe_validation(exc, subject="arguments")
        raise ToolError(f"{tool}: {detail}", code=ErrorCode.TOOL_ARGUMENTS_INVALID) from exc


def tool_schemas() -> list[dict[str, Any]]:
    """The tools as function definitions for a model: name, description, JSON Schema."""
    out = []
    for name, model in ARGUMENT_MODELS.items():
        schema = model.model_json_schema()
        schema.pop("title", None)
        for prop in schema.get("properties", {}).values():
            prop.pop("title", None)
        schema["additionalProperties"] = False
        out.append(
            {"name": name, "description": (model.__doc__ or "").strip(), "parameters": schema}
        )
    return out
