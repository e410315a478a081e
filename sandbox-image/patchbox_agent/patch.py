"""The data of a parsed diff: one :class:`FilePatch` per file section, one :class:`Hunk` per
``@@`` block, and :class:`DiffError`, which every refused diff, name or patch raises.

The parser (:mod:`patchbox_agent.diffs`), the name rules (:mod:`patchbox_agent.names`) and the
applier (:mod:`patchbox_agent.patching`) all build on this module; it imports none of them.
Pure and standard-library only (python >= 3.9).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Literal

MODE_FILE = "100644"
MODE_EXEC = "100755"

Kind = Literal["modify", "create", "delete", "rename"]
Op = Literal[" ", "-", "+"]

op_of = operator.itemgetter(0)
"""The op (`` ``, ``-``, ``+``) of a hunk line."""


class DiffError(Exception):
    """A refused diff or name. ``reason`` is a stable code from
    :data:`patchbox_agent.diffs.REASONS`; ``message`` names a line number or a validated
    path, never an unvalidated name."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class Hunk:
    """One ``@@ -old_start,old_len +new_start,new_len @@`` block. ``lines`` hold the text
    without its newline; ``old_no_eol``/``new_no_eol`` mark a ``\\ No newline at end of
    file`` after the last line of that side."""

    old_start: int
    old_len: int
    new_start: int
    new_len: int
    lines: tuple[tuple[Op, str], ...]
    old_no_eol: bool = False
    new_no_eol: bool = False
    section: str = ""

    @property
    def added(self) -> int:
        return list(map(op_of, self.lines)).count("+")

    @property
    def removed(self) -> int:
        return list(map(op_of, self.lines)).count("-")


@dataclass(frozen=True)
class FilePatch:
    """One file section. ``old_path`` is None for a created file, ``new_path`` for a deleted
    one; modes are ``100644``/``100755`` or None when the diff does not state them; blob ids
    are as abbreviated in the ``index`` line, None when absent or all zeros."""

    old_path: str | None
    new_path: str | None
    kind: Kind
    old_mode: str | None
    new_mode: str | None
    index_old: str | None
    index_new: str | None
    hunks: tuple[Hunk, ...]
    similarity: int | None = None

    @property
    def path(self) -> str:
        name = self.new_path if self.new_path is not None else self.old_path
        if name is None:  # pragma: no cover - parse never builds this
            raise DiffError("bad_header", "file patch without a path")
        return name

    @property
    def added(self) -> int:
        return sum(h.added for h in self.hunks)

    @property
    def removed(self) -> int:
        return sum(h.removed for h in self.hunks)
