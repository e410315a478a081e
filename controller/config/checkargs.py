"""A check's declared arguments: the slots its ``argv`` names, and the values a model may give.

A check may declare argument slots (``args``), each named in its ``argv`` as one whole
element, ``{name}``: ``["python3", "-m", "pytest", "-q", "{tests}"]`` with
``{"tests": {"kind": "pytest_node", "max": 20, "default": ["tests"]}}``. A slot expands to
its values, one argv element each (none when it has no default and no value was given).
The values are plain argv elements: no shell ever sees them.

Everything here is pure: :func:`check_values` refuses what is wrong with a value on its own
(an option, a control character, the wrong kind, a path that leaves the repository or is
protected by name); whether a path names a file or a folder in the workspace, and is not a
link, is for the sandbox to say (the container's view is the truth), through the paths
:func:`workspace_paths` lists.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

from controller.errors import ErrorCode, ToolError
from patchbox_agent import jail

MAX_VALUE_BYTES = 1024
"""The longest value, in UTF-8 bytes."""
MAX_SLOT_VALUES = 100
"""The most values one slot may declare (``max``)."""
MAX_CHOICES = 64
SLOT_NAME = r"[A-Za-z][A-Za-z0-9_]{0,31}"
PLACEHOLDER = re.compile(r"\{(" + SLOT_NAME + r")\}")
"""``{name}``: a slot's place in ``argv``, always a whole element."""
GLOB_CHARACTERS = frozenset("*?[]")
_DIGITS = re.compile(r"[0-9]{1,18}")

ArgKind = Literal["path", "pytest_node", "choice", "int"]
SlotName = Annotated[str, StringConstraints(pattern=f"^{SLOT_NAME}$")]
Value = str | int


class ArgSlot(BaseModel):
    """One declared argument slot of a check."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    kind: ArgKind
    """``path``: a file or folder of the repository (relative, inside it, not protected, not
    a link); ``pytest_node``: such a path, then ``::`` names and an optional ``[...]``
    parameter id; ``choice``: one of ``choices``; ``int``: a whole number in ``range``."""
    max: int = Field(default=1, ge=1, le=MAX_SLOT_VALUES)
    """How many values the slot takes (each its own argv element)."""
    default: Value | list[Value] | None = None
    """The values used when none is given, and always by the required checks that decide
    the job; none: the slot expands to nothing."""
    choices: list[Annotated[str, StringConstraints(min_length=1)]] | None = Field(
        default=None, min_length=1, max_length=MAX_CHOICES
    )
    """The values a ``choice`` slot accepts."""
    range: list[int] | None = Field(default=None, min_length=2, max_length=2)
    """The lowest and highest value of an ``int`` slot (neither below 0)."""
    description: Annotated[str, StringConstraints(min_length=1, max_length=200)] | None = None
    """What the slot selects, in a few words, for the model."""

    @model_validator(mode="after")
    def _coherent(self) -> Self:
        problem = _kind_problem(self) or _default_problem(self)
        if problem is not None:
            raise ValueError(problem)
        return self

    def defaults_given(self) -> list[Value]:
        """The declared default as a list (empty when there is none)."""
        if self.default is None:
            return []
        return list(self.default) if isinstance(self.default, list) else [self.default]

    def summary(self) -> str:
        """The slot in words for the model: its kind, how many values, its default."""
        if self.kind == "choice":
            what = "one of " + ", ".join(self.choices or ())
        elif self.kind == "int":
            low, high = self.range or (0, 0)
            what = f"a whole number from {low} to {high}"
        elif self.kind == "path":
            what = "a file or folder path relative to the repository top"
        else:
            what = "a pytest node id (path, then ::name parts, like tests/test_x.py::test_y)"
        count = f"up to {self.max} values" if self.max > 1 else "one value"
        default = self.defaults_given()
        given = " ".join(str(v) for v in default) if default else "nothing"
        said = f"{self.description}: " if self.description else ""
        return f"{said}{what}; {count}; default {given}"


def _kind_problem(slot: ArgSlot) -> str | None:
    """What is wrong with ``choices`` and ``range`` for the slot's kind, or None."""
    if (slot.choices is not None) != (slot.kind == "choice"):
        return (
            "a choice slot needs choices"
            if slot.kind == "choice"
            else (f"choices are for a choice slot, not {slot.kind}")
        )
    if (slot.range is not None) != (slot.kind == "int"):
        return (
            "an int slot needs a range [lowest, highest]"
            if slot.kind == "int"
            else (f"range is for an int slot, not {slot.kind}")
        )
    if slot.choices is not None:
        if len(set(slot.choices)) != len(slot.choices):
            return "choices must differ"
        for n, choice in enumerate(slot.choices):
            problem = _text_problem(choice)
            if problem is not None:
                return f"choices[{n}]: {problem}"
    if slot.range is not None and not 0 <= slot.range[0] <= slot.range[1]:
        return "range must be [lowest, highest] with 0 <= lowest <= highest"
    return None


def _default_problem(slot: ArgSlot) -> str | None:
    """What is wrong with the slot's default, or None."""
    defaults = slot.defaults_given()
    if isinstance(slot.default, list) and not defaults:
        return "default must not be an empty list (leave it out for none)"
    if len(defaults) > slot.max:
        return f"default has {len(defaults)} values, more than max ({slot.max})"
    for n, value in enumerate(defaults):
        try:
            _value(slot, value)
        except _Refused as exc:
            where = f"default[{n}]" if isinstance(slot.default, list) else "default"
            return f"{where}: {exc.reason}"
    return None


def check_declaration(argv: Sequence[str], slots: Mapping[str, ArgSlot]) -> None:
    """Raises ``ValueError`` (a usage error at load) unless ``argv`` names each slot of
    ``slots`` exactly once, as a whole element, and names no slot that is not declared."""
    used: list[str] = []
    for n, element in enumerate(argv):
        whole = PLACEHOLDER.fullmatch(element)
        if whole is not None:
            name = whole.group(1)
            if name not in slots:
                msg = f"argv[{n}] names {{{name}}}, which args does not declare"
                raise ValueError(msg)
            if name in used:
                msg = f"argv names {{{name}}} more than once"
                raise ValueError(msg)
            used.append(name)
            continue
        for found in PLACEHOLDER.finditer(element):
            if found.group(1) in slots:
                msg = f"argv[{n}] holds {{{found.group(1)}}} inside other text: a slot must be a"
                msg += " whole argv element"
                raise ValueError(msg)
    unused = sorted(set(slots) - set(used))
    if unused:
        msg = "args declares " + ", ".join(unused) + ", which argv never names"
        raise ValueError(msg)


def expand_argv(
    argv: Sequence[str], slots: Mapping[str, ArgSlot], values: Mapping[str, Sequence[str]]
) -> list[str]:
    """``argv`` with each slot's placeholder replaced by its values (from ``values``, else the
    slot's default, else nothing). ``values`` must come from :func:`check_values`."""
    out: list[str] = []
    for element in argv:
        whole = PLACEHOLDER.fullmatch(element)
        slot = slots.get(whole.group(1)) if whole is not None else None
        if whole is None or slot is None:
            out.append(element)
            continue
        name = whole.group(1)
        given = values.get(name)
        out.extend(given if given is not None else [str(v) for v in slot.defaults_given()])
    return out


def check_values(
    check_id: str, slots: Mapping[str, ArgSlot], given: Mapping[str, object] | None
) -> dict[str, tuple[str, ...]]:
    """The values a call gives, each as the argv element it becomes, by slot name; a
    ``ToolError`` (``TOOL_ARGUMENTS_INVALID``) with the exact reason otherwise. The reason
    names where the value is (:func:`_where`), never the value itself."""
    out: dict[str, tuple[str, ...]] = {}
    for name, raw in (given or {}).items():
        slot = slots.get(name)
        if slot is None:
            declared = ", ".join(sorted(slots))
            msg = f"args.{name[:64]}: check {check_id} declares no such argument"
            msg += f" (it takes: {declared})" if declared else " (it takes none)"
            raise _error(msg)
        items = raw if isinstance(raw, list) else [raw]
        if isinstance(raw, list) and not raw:
            raise _error(f"args.{name}: an empty list (leave the argument out for its default)")
        if len(items) > slot.max:
            many = f"at most {slot.max} values" if slot.max > 1 else "one value"
            raise _error(f"args.{name}: {len(items)} values, but it takes {many}")
        values = []
        for n, item in enumerate(items):
            where = _where(name, slot, n)
            try:
                values.append(_value(slot, item))
            except _Refused as exc:
                raise _error(f"{where}: {exc.reason}") from None
        out[name] = tuple(values)
    return out


def workspace_paths(
    slots: Mapping[str, ArgSlot], values: Mapping[str, Sequence[str]]
) -> list[tuple[str, str, bool]]:
    """``(where, path, needs_file)`` for each value of a path or pytest_node slot whose path
    the sandbox must find: a file or folder, a file when a pytest node names a test in it."""
    out = []
    for name, given in values.items():
        slot = slots[name]
        if slot.kind not in ("path", "pytest_node"):
            continue
        for n, value in enumerate(given):
            path, sep, _ = value.partition("::")
            out.append((_where(name, slot, n), path, bool(sep)))
    return out


def canonical(values: Mapping[str, Sequence[str]]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The given values in one order: the same arguments are the same key."""
    return tuple(sorted((k, tuple(v)) for k, v in values.items()))


def _where(name: str, slot: ArgSlot, n: int) -> str:
    """Where a value is, as a refusal names it: ``args.tests[2]`` for a slot that takes a
    list, ``args.mode`` for one that takes one value."""
    return f"args.{name}[{n}]" if slot.max > 1 else f"args.{name}"


class _Refused(Exception):  # noqa: N818 - internal: carries a reason, never escapes
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _error(message: str) -> ToolError:
    return ToolError(message, code=ErrorCode.TOOL_ARGUMENTS_INVALID)


def _text_problem(value: str) -> str | None:
    """Why ``value`` may never be an argv element a model gives, or None (the first rule
    it breaks, in :data:`_TEXT_RULES` order)."""
    return next((reason for broken, reason in _TEXT_RULES if broken(value)), None)


_TEXT_RULES: tuple[tuple[Callable[[str], bool], str], ...] = (
    (lambda v: not v, "empty"),
    (
        lambda v: len(v.encode("utf-8", "surrogatepass")) > MAX_VALUE_BYTES,
        f"longer than {MAX_VALUE_BYTES} bytes",
    ),
    (lambda v: "\x00" in v, "holds NUL"),
    (lambda v: "\n" in v or "\r" in v, "holds a line break"),
    (
        lambda v: any(not ch.isprintable() and ch != " " for ch in v),
        "holds a control, format or separator character",
    ),
    (lambda v: v.startswith("-"), "starts with '-': an option is never a value"),
)


def _value(slot: ArgSlot, value: object) -> str:
    """``value`` as the argv element it becomes (raises :class:`_Refused`)."""
    if slot.kind == "int":
        return _int_value(slot, value)
    if not isinstance(value, str):
        raise _Refused(f"a {slot.kind} value must be a string")
    problem = _text_problem(value)
    if problem is not None:
        raise _Refused(problem)
    if slot.kind == "choice":
        if value not in (slot.choices or ()):
            raise _Refused("not one of: " + ", ".join(slot.choices or ()))
        return value
    if slot.kind == "path":
        _path(value)
        return value
    path, sep, names = value.partition("::")
    _path(path)
    if sep and not _node_names(names):
        raise _Refused(
            "not a pytest node id: after the path, '::' then names of letters, digits and _"
            " (the last may end with a [parameter id] of printable characters, no spaces)"
        )
    return value


def _int_value(slot: ArgSlot, value: object) -> str:
    if isinstance(value, str) and _DIGITS.fullmatch(value):
        value = int(value)
    if isinstance(value, str):
        problem = _text_problem(value)
        raise _Refused(problem or "not a whole number")
    if isinstance(value, bool) or not isinstance(value, int):
        raise _Refused("not a whole number")
    low, high = slot.range or (0, 0)
    if not low <= value <= high:
        raise _Refused(f"not in the range {low} to {high}")
    return str(value)


def _path(path: str) -> None:
    """Refuses a path that is not one relative, well-formed, unprotected repository path
    (the jail's own rules and words, checked here without looking anything up)."""
    if not path:
        raise _Refused("no path before '::'")
    if GLOB_CHARACTERS & set(path):
        raise _Refused("holds a glob character (* ? [ ]): name one path")
    try:
        jail.split(path)
    except jail.PathDeniedError as exc:
        raise _Refused(exc.message) from None


def _node_names(names: str) -> bool:
    """Whether ``names`` (what follows a node id's first ``::``) is ``::``-separated
    identifiers, the last of which may end with one ``[parameter id]``."""
    params = ""
    if names.endswith("]") and "[" in names:
        names, _, params = names[:-1].partition("[")
        if not params or any(ch.isspace() or not ch.isprintable() for ch in params):
            return False
    return all(part.isidentifier() for part in names.split("::"))
