"""The six tools a model may call: strict argument models and their JSON Schemas.

Every argument object is validated here, on the controller, before anything reaches the
sandbox: unknown, missing or mistyped fields and out-of-range values are
``TOOL_ARGUMENTS_INVALID`` (retryable, no side effect). Arguments that are not a JSON object,
or are larger than :data:`MAX_ARGUMENT_BYTES`, end the job.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Annotated, Any, Self, TypedDict

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    model_validator,
)

from controller.config.task import CheckId
from controller.errormap import describe_validation
from controller.errors import ArgumentsNotAnObjectError, ErrorCode, ProtocolError, ToolError
from controller.sandbox.protocol import decode_json
from patchbox_agent import diffs, globs, jail, ops

MAX_ARGUMENT_BYTES = diffs.MAX_BYTES + 4096
"""The largest arguments object accepted (an 8 MiB patch plus its envelope)."""

WorkspacePath = Annotated[str, StringConstraints(min_length=1, max_length=jail.MAX_PATH_BYTES)]
Glob = Annotated[str, StringConstraints(min_length=1, max_length=globs.MAX_PATTERN)]
LineNumber = Annotated[int, Field(ge=1, le=ops.MAX_LINE_NUMBER)]


class _Args(BaseModel):
    """A tool's arguments: snake_case attributes, camelCase names in the JSON Schema the model
    sees and in what it sends. Only those names validate (``validate_by_name`` stays off: the
    model may not send ``start_line`` for ``startLine``)."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        strict=True,
        use_attribute_docstrings=True,
        validate_by_alias=True,
        validate_by_name=False,
        serialize_by_alias=True,
    )


class ListFilesArgs(_Args):
    """List the files of the workspace that the model may see."""

    glob: Glob | None = None
    """Only paths matching this glob (``*`` stays within a folder, ``**`` crosses folders)."""
    max_results: int | None = Field(default=None, ge=1, le=ops.MAX_LIST_RESULTS, alias="maxResults")
    """At most this many paths (default 1000)."""


class SearchTextArgs(_Args):
    """Search the text files of the workspace; returns path, line number and line."""

    query: Annotated[str, StringConstraints(min_length=1, max_length=ops.MAX_QUERY)]
    """A literal string, or a regular expression when ``regex`` is true."""
    glob: Glob | None = None
    """Only files whose path matches this glob."""
    max_results: int | None = Field(
        default=None, ge=1, le=ops.MAX_SEARCH_RESULTS, alias="maxResults"
    )
    """At most this many hits (default 100)."""
    regex: bool = False
    """Treat ``query`` as a regular expression (run with a time bound)."""


class ReadFileArgs(_Args):
    """Read a range of lines of one text file."""

    path: WorkspacePath
    """A relative POSIX path inside the workspace."""
    start_line: LineNumber | None = Field(default=None, alias="startLine")
    """First line, 1-based (default 1)."""
    end_line: LineNumber | None = Field(default=None, alias="endLine")
    """Last line, inclusive (default: a bounded window)."""

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if (
            self.start_line is not None
            and self.end_line is not None
            and self.end_line < self.start_line
        ):
            msg = "endLine must not be before startLine"
            raise ValueError(msg)
        return self


class ReplaceTextArgs(_Args):
    """Replace the one exact occurrence of ``oldText`` in a file with ``newText``."""

    path: WorkspacePath
    old_text: Annotated[str, StringConstraints(min_length=1, max_length=1024 * 1024)] = Field(
        alias="oldText"
    )
    """Text that occurs exactly once in the file."""
    new_text: Annotated[str, StringConstraints(max_length=1024 * 1024)] = Field(alias="newText")
    """Its replacement; must differ from ``oldText``."""

    @model_validator(mode="after")
    def _differs(self) -> Self:
        if self.old_text == self.new_text:
            msg = "newText must differ from oldText"
            raise ValueError(msg)
        return self


class ApplyPatchArgs(_Args):
    """Apply one canonical unified git diff (``diff --git a/P b/P`` sections) to the workspace."""

    patch: Annotated[str, StringConstraints(min_length=1, max_length=diffs.MAX_BYTES)]


class RunCheckArgs(_Args):
    """Run one check of the trusted configuration (by id) and get its result."""

    check_id: CheckId = Field(alias="checkId")


ARGUMENT_MODELS: dict[str, type[_Args]] = {
    "list_files": ListFilesArgs,
    "search_text": SearchTextArgs,
    "read_file": ReadFileArgs,
    "replace_text": ReplaceTextArgs,
    "apply_patch": ApplyPatchArgs,
    "run_check": RunCheckArgs,
}


def parse_arguments(tool: str, raw: str | Mapping[str, object]) -> _Args:
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


class ToolSchema(TypedDict):
    """A tool as a function definition for a model."""

    name: str
    description: str
    parameters: dict[str, Any]
    """The arguments' JSON Schema document."""


def tool_schemas() -> list[ToolSchema]:
    """The tools as function definitions for a model: name, description, JSON Schema."""
    out: list[ToolSchema] = []
    for name, model in ARGUMENT_MODELS.items():
        schema = model.model_json_schema(by_alias=True)
        schema.pop("title", None)
        for prop in schema.get("properties", {}).values():
            prop.pop("title", None)
        schema["additionalProperties"] = False
        out.append(
            {"name": name, "description": (model.__doc__ or "").strip(), "parameters": schema}
        )
    return out
