"""The one change set a job yields, as data: how large it may be, what each file becomes,
and what a validated diff carries on to apply (every touched path's contents).

A diff that passes the rules (:mod:`controller.changes.rules`) may still be flagged:
:attr:`ChangeSet.control_characters` names each added line holding a character a terminal
would act on or hide (:data:`controller.text.HIDDEN`: escape sequences, a carriage return,
bidirectional and other invisible format characters), so a reviewer is told before reading
the diff.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from patchbox_agent import diffs

FileMode = Literal["100644", "100755"]
Kind = Literal["create", "modify", "delete", "rename"]


class ChangesetLimits(BaseModel):
    """How large a change set may be."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    max_files: int = Field(default=diffs.MAX_FILES, ge=1, le=10_000)
    """File sections in the diff."""
    max_diff_bytes: int = Field(default=diffs.MAX_BYTES, ge=1, le=1 << 30)
    """The whole diff, UTF-8 bytes."""
    max_file_diff_bytes: int = Field(default=2 * 1024 * 1024, ge=1, le=1 << 30)
    """One file's section of the diff."""
    max_file_bytes: int = Field(default=16 * 1024 * 1024, ge=0, le=1 << 32)
    """One file's content, before or after the change."""


class FileChange(BaseModel):
    """One file of a change set. Hashes are SHA-256 of the content; modes are git modes."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str
    """The file's name after the change (the new name of a rename)."""
    old_path: str | None = None
    """The old name of a rename."""
    kind: Kind
    added: int
    removed: int
    sha256_before: str | None
    sha256_after: str | None
    mode_before: FileMode | None
    mode_after: FileMode | None


MAX_CONTROL_LINES = 100
"""Lines :func:`control_lines` names at most (the first ones, in diff order)."""


class ControlLine(BaseModel):
    """An added line that holds characters a terminal acts on or hides (a flag, not a
    refusal): the file, the line's number in the file after the change (from 1), and each
    such character once, written as :func:`controller.text.escape` writes it
    (``\\x1b``, ``\\u202e``). A carriage return that ends the line (a CR LF line ending) does
    not count."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str
    line: int
    characters: list[str]


class ChangeSet(BaseModel):
    """The machine-readable summary of a validated diff."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    files: list[FileChange]
    added: int
    removed: int
    diff_sha256: str
    """SHA-256 of the diff's UTF-8 bytes."""
    baseline_tree: str | None = None
    """The baseline tree it was validated on (None for an in-memory tree)."""
    control_characters: list[ControlLine] = Field(default_factory=list)
    """The added lines with control, format or bidi characters (:func:`control_lines`)."""


@dataclass(frozen=True)
class PathChange:
    """What one path becomes: ``None`` content is an absent file; ``renamed_from`` names
    the source of a rename target."""

    path: str
    before: bytes | None
    after: bytes | None
    mode_before: FileMode | None
    mode_after: FileMode | None
    sha256_before: str | None
    sha256_after: str | None
    renamed_from: str | None = None


@dataclass(frozen=True)
class Prepared:
    """A validated change set with the contents it needs: one :class:`PathChange` per
    touched path (a rename gives two), in diff order."""

    changeset: ChangeSet
    changes: tuple[PathChange, ...]
    diff: bytes
