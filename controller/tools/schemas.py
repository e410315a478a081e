"""The six tools a model may call: strict argument models and their JSON Schemas.

Every argument object is validated here, on the controller, before anything reaches the
sandbox: unknown, missing or mistyped fields and out-of-range values are
``TOOL_ARGUMENTS_INVALID`` (retryable, no side effect). Arguments that are not a JSON object,
or are larger than :data:`MAX_ARGUMENT_BYTES`, end the job.
"""

from __future__ import annotations

import ast
import functools
import inspect
import json
import shlex
import sys
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

from controller.config.task import CheckId, CheckSpec
from controller.errormap import describe_validation
from controller.errors import ArgumentsNotAnObjectError, ErrorCode, ProtocolError, ToolError
from controller.sandbox.protocol import decode_json
from patchbox_agent import bounds, diffs, globs, jail

MAX_ARGUMENT_BYTES = diffs.MAX_BYTES + 4096
"""The largest arguments object accepted (an 8 MiB patch plus its envelope)."""

WorkspacePath = Annotated[str, StringConstraints(min_length=1, max_length=jail.MAX_PATH_BYTES)]
Glob = Annotated[str, StringConstraints(min_length=1, max_length=globs.MAX_PATTERN)]
LineNumber = Annotated[int, Field(ge=1, le=bounds.MAX_LINE_NUMBER)]


class _Args(BaseModel):
    """A tool's arguments: snake_case attributes, camelCase names in the JSON Schema the model
    sees and in what it sends. Only those names validate (``validate_by_name`` stays off: the
    model may not send ``start_line`` for ``startLine``). The attributes' docstrings are the
    descriptions the model reads: plain text, no markup (read by :func:`_attribute_docs` when
    a schema is made, not by pydantic's ``use_attribute_docstrings``, which looks the class's
    source up through every loaded module when the class is made: 30-45 ms of every
    command's start)."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        strict=True,
        validate_by_alias=True,
        validate_by_name=False,
        serialize_by_alias=True,
    )


class ListFilesArgs(_Args):
    """List the files of the repository copy that the tools can see (protected files such as
    .git, .env or keys are never shown). Returns the paths, relative to the repository top,
    and whether the list was cut at maxResults."""

    glob: Glob | None = None
    """Only paths matching this glob, relative to the repository top: * matches within one
    folder, ** across folders (for example src/**/*.py)."""
    max_results: int | None = Field(
        default=None, ge=1, le=bounds.MAX_LIST_RESULTS, alias="maxResults"
    )
    """At most this many paths (default 1000)."""
    details: bool = False
    """Also return the workspace version."""


class SearchTextArgs(_Args):
    """Search the text files of the repository copy for a string or a regular expression.
    Returns each hit's path, line number and line, and whether the hits were cut at
    maxResults."""

    query: Annotated[str, StringConstraints(min_length=1, max_length=bounds.MAX_QUERY)]
    """The text to find: a literal string, or a regular expression when regex is true."""
    glob: Glob | None = None
    """Only files whose path matches this glob (* within one folder, ** across folders)."""
    max_results: int | None = Field(
        default=None, ge=1, le=bounds.MAX_SEARCH_RESULTS, alias="maxResults"
    )
    """At most this many hits (default 100)."""
    regex: bool = False
    """Read query as a Python regular expression (run with a time bound)."""
    details: bool = False
    """Also return how many files were scanned, whether the answer was cached, and the
    workspace version."""


class ReadFileArgs(_Args):
    """Read lines of one text file (at most 2000 lines per call). Returns the text, the line
    range returned, the file's total line count, and whether the range was cut."""

    path: WorkspacePath
    """The file's path relative to the repository top, with / between names (for example
    src/app.py)."""
    start_line: LineNumber | None = Field(default=None, alias="startLine")
    """First line to return, counting from 1 (default 1)."""
    end_line: LineNumber | None = Field(default=None, alias="endLine")
    """Last line to return, inclusive (default: up to 2000 lines from startLine)."""
    line_numbers: bool = Field(default=False, alias="lineNumbers")
    """Start each returned line with its number and a tab (for example 12 then a tab then
    the line). The numbers are not part of the file: leave them out of oldText and patches."""

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
    """Replace text in one file: oldText must occur exactly once in the file, and becomes
    newText. Returns the path, the first line replaced, and the lines removed and added."""

    path: WorkspacePath
    """The file's path relative to the repository top (for example src/app.py)."""
    old_text: Annotated[str, StringConstraints(min_length=1, max_length=1024 * 1024)] = Field(
        alias="oldText"
    )
    """The exact text to replace, with its whitespace and line breaks; it must occur exactly
    once in the file (include surrounding lines to make it unique)."""
    new_text: Annotated[str, StringConstraints(max_length=1024 * 1024)] = Field(alias="newText")
    """The text that takes its place; it must differ from oldText (empty deletes it)."""
    details: bool = False
    """Also return the file's content hashes before and after, and the workspace version."""

    @model_validator(mode="after")
    def _differs(self) -> Self:
        if self.old_text == self.new_text:
            msg = "newText must differ from oldText"
            raise ValueError(msg)
        return self


PATCH_EXAMPLE = (
    "--- a/src/app.py\n"
    "+++ b/src/app.py\n"
    "@@ -1,3 +1,3 @@\n"
    " def greet():\n"
    '-    return "hello"\n'
    '+    return "Hello"\n'
    " greet()\n"
)
"""A complete patch the tool takes (one file, one hunk), shown in its description."""


class ApplyPatchArgs(_Args):
    """Apply a unified diff to the repository copy, all files or none. Paths are relative to
    the repository top, each file's section starts with --- and +++ lines (with a/ and b/
    prefixes or without, /dev/null for a new or a deleted file), or with a diff --git line
    as git writes it, followed by @@ hunks whose line numbers and context match the file
    exactly (no offset or fuzz). A rename needs the git form (rename from and rename to
    lines); binary files, links and mode changes are refused. Returns each file's path,
    kind (modify, create, delete, rename) and the lines added and removed."""

    patch: Annotated[str, StringConstraints(min_length=1, max_length=diffs.MAX_BYTES)]
    """The whole diff text, ending with a newline, and nothing else (no prose, no markdown
    fences): context lines start with a space, removed lines with -, added lines with +."""
    details: bool = False
    """Also return each file's content hashes before and after, and the workspace version."""


MAX_WAIT_SECONDS = 3600
"""The longest ``waitSeconds`` of one ``run_check`` call."""
CheckHandle = Annotated[str, StringConstraints(min_length=1, max_length=64)]


class RunCheckArgs(_Args):
    """Run one of the job's configured checks (tests, linters: the operator's commands, not
    yours) in the repository copy and get its verdict, exit code and the end of its output.
    With waitSeconds the call answers after that long at most: a check still running then
    answers status running, its output so far and a handle; call run_check again with that
    handle (and no checkId) to wait again and get the output since the last answer, then
    the result once the check ended. While a check runs, files can be read but not changed,
    and no other check can start."""

    check_id: CheckId | None = Field(default=None, alias="checkId")
    """The id of the check to run (leave it out when you give handle)."""
    handle: CheckHandle | None = None
    """The handle of a check still running, from an earlier run_check answer: wait for it
    again instead of starting a check."""
    wait_seconds: float | None = Field(default=None, ge=0, le=MAX_WAIT_SECONDS, alias="waitSeconds")
    """Answer after at most this many seconds, with status running when the check has not
    ended (default: wait until it ends)."""
    args: (
        dict[
            Annotated[str, StringConstraints(min_length=1, max_length=64)],
            str | int | list[str | int],
        ]
        | None
    ) = Field(default=None, max_length=16)
    """Values for the check's declared arguments, by name (only a check that declares
    arguments takes them; each is one value or a list of values): for example
    {"tests": ["tests/test_app.py::test_empty"]}. Left out, each argument has its default."""

    @model_validator(mode="after")
    def _one_target(self) -> Self:
        if (self.check_id is None) == (self.handle is None):
            msg = "give exactly one of checkId (start a check) and handle (wait for one)"
            raise ValueError(msg)
        if self.handle is not None and self.args is not None:
            msg = "args go with checkId: a handle waits for a check that already runs"
            raise ValueError(msg)
        return self


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


def _plain(text: str) -> str:
    """A docstring as one paragraph of plain text."""
    return " ".join(text.split())


def describe_check(check_id: str, spec: CheckSpec) -> str:
    """One check as the model reads it: its id, what it runs (control characters and the
    values of secret variables taken out), whether the proposed change must pass it, its
    time limit."""
    from controller.logs import Scrubber  # the secrets of this process's environment

    slots = {f"{{{name}}}" for name in spec.args}
    command = " ".join(a if a in slots else shlex.quote(a) for a in spec.argv)
    what = Scrubber("", paths=False).text(spec.description or command)
    if len(what) > CHECK_TEXT:
        what = what[: CHECK_TEXT - 3] + "..."
    need = "the change must pass it" if spec.required else "optional"
    line = f"{check_id}: {_plain(what)} ({need}; at most {spec.timeout_seconds:g} s)"
    for name, slot in sorted(spec.args.items()):
        line += f"; argument {name}: {_plain(slot.summary())}"
    return line


CHECK_TEXT = 300
"""Characters of a check's description or command shown to the model."""
NO_CHECKS = "This job has no configured checks, so run_check has nothing to run: do not call it."


def checks_text(checks: Mapping[str, CheckSpec]) -> str:
    """The job's checks in words, for the system prompt and run_check's description."""
    if not checks:
        return NO_CHECKS
    lines = [describe_check(cid, spec) for cid, spec in sorted(checks.items())]
    return "The checks run_check can run (checkId: what it runs):\n" + "\n".join(
        f"- {line}" for line in lines
    )


def _simplified(prop: dict[str, Any]) -> dict[str, Any]:
    """A property without a title, and an optional one (``X | None = None``) as plain ``X``:
    leaving it out is how the model says none."""
    prop.pop("title", None)
    branches = prop.get("anyOf")
    if prop.get("default", 0) is None and isinstance(branches, list):
        kept = [b for b in branches if b != {"type": "null"}]
        if len(kept) == 1:
            del prop["anyOf"], prop["default"]
            prop = {**kept[0], **prop}
    return prop


@functools.cache
def _attribute_docs() -> dict[str, dict[str, str]]:
    """Each class of this module: its attributes' docstrings (the string right after an
    annotated attribute), by attribute name; read from this module's source once."""
    tree = ast.parse(inspect.getsource(sys.modules[__name__]))
    out: dict[str, dict[str, str]] = {}
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        docs = out.setdefault(node.name, {})
        for stmt, after in zip(node.body, node.body[1:], strict=False):
            if (
                isinstance(stmt, ast.AnnAssign)
                and isinstance(stmt.target, ast.Name)
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                docs[stmt.target.id] = inspect.cleandoc(after.value.value)
    return out


def _schema(model: type[_Args]) -> dict[str, Any]:
    schema = model.model_json_schema(by_alias=True)
    for key in ("title", "description"):  # the description is the tool's, said once
        schema.pop(key, None)
    docs = _attribute_docs().get(model.__name__, {})
    said = {field.alias or name: docs.get(name, "") for name, field in model.model_fields.items()}
    properties = schema.get("properties", {})
    for name, prop in properties.items():
        properties[name] = _simplified(prop)
        properties[name]["description"] = _plain(said.get(name) or prop.get("description", ""))
    schema["additionalProperties"] = False
    return schema


ARG_VALUE: dict[str, Any] = {"anyOf": [{"type": "string"}, {"type": "integer"}]}
"""One argument value as the model sends it."""


def _args_schema(prop: dict[str, Any], checks: Mapping[str, CheckSpec] | None) -> dict[str, Any]:
    """run_check's ``args`` with only the keywords every function-calling dialect takes (the
    bounds on names and count stay the model's to check): with the job's checks known, an
    object of exactly the argument names they declare, each described."""
    value = {"anyOf": [*ARG_VALUE["anyOf"], {"type": "array", "items": ARG_VALUE}]}
    out: dict[str, Any] = {"type": "object", "description": prop["description"]}
    slots: dict[str, list[str]] = {}
    for check_id, spec in sorted((checks or {}).items()):
        for name in spec.args:
            slots.setdefault(name, []).append(check_id)
    if checks is None:
        out["additionalProperties"] = value
        return out
    if not slots:
        out["description"] = "No check of this job takes arguments: leave this out."
        out["properties"] = {}
    else:
        out["properties"] = {
            name: {**value, "description": f"Values for checks {', '.join(ids)} (see above)."}
            for name, ids in sorted(slots.items())
        }
    out["additionalProperties"] = False
    return out


def tool_schemas(checks: Mapping[str, CheckSpec] | None = None) -> list[ToolSchema]:
    """The tools as function definitions for a model: name, description, JSON Schema.

    With the job's ``checks``, run_check's checkId is an ``enum`` of their ids and its
    description lists them; a job without checks says so in run_check's description (the
    tool stays, so every job offers the same six tools). Without ``checks`` (None: not known
    yet) checkId is any id of the right form."""
    out: list[ToolSchema] = []
    for name, model in ARGUMENT_MODELS.items():
        schema = _schema(model)
        description = _plain(model.__doc__ or "")
        if model is ApplyPatchArgs:
            description += " Example of a whole patch:\n" + PATCH_EXAMPLE
        if model is RunCheckArgs and checks is not None:
            prop = schema["properties"]["checkId"]
            if checks:
                prop.pop("pattern", None)
                prop["enum"] = sorted(checks)
                prop["description"] = "The id of the check to run: " + ", ".join(sorted(checks))
            else:
                prop["description"] = "No check is configured for this job."
            description += "\n" + checks_text(checks)
        if model is RunCheckArgs:
            schema["properties"]["args"] = _args_schema(schema["properties"]["args"], checks)
        out.append({"name": name, "description": description, "parameters": schema})
    return out
