"""The baseline tree as the validator sees it.

:class:`BaselineTree` is the Protocol the rules of :mod:`controller.changes.rules` read
through: entries looked up by path (with the first ancestor that is not a folder), folder
listings and blob contents. :class:`MemoryTree` is the in-memory tree for tests and callers
without git; :class:`controller.changes.gittree.GitTree` reads the private git dir. A
:data:`PatchCheck` is the optional second opinion of git on the same diff.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Final, NamedTuple, Protocol

from patchbox_agent import diffs

MODE_FILE: Final = "100644"
MODE_EXEC: Final = "100755"
MODE_SYMLINK = "120000"
MODE_GITLINK = "160000"
MODE_TREE = "040000"
MESSAGE_LIMIT = 300
"""How many characters a refusal's message, or git's verdict in it, may have."""


class TreeEntry(NamedTuple):
    mode: str
    """``100644``, ``100755``, ``120000`` (symlink), ``160000`` (submodule), ``040000``."""
    oid: str


class Lookup(NamedTuple):
    entry: TreeEntry | None
    """The entry at the path, None when there is none."""
    blocker: tuple[str, TreeEntry] | None
    """The first ancestor that is not a folder (a file, symlink or submodule)."""


class BaselineTree(Protocol):
    """Read access to one baseline tree."""

    @property
    def object_format(self) -> str: ...

    def lookup(self, path: str) -> Lookup: ...

    def names(self, folder: str) -> Collection[str]:
        """Entry names of a folder (``""`` is the root); empty when it is not a folder."""
        ...

    def read(self, entry: TreeEntry) -> bytes: ...

    def prefetch(self, paths: Sequence[str]) -> None:
        """A hint that these paths may be looked up and read (they may be wrong: only what
        :meth:`lookup` then returns counts)."""
        ...

    def read_all(self, entries: Sequence[TreeEntry]) -> list[bytes]: ...


class IndexEntry(NamedTuple):
    mode: str
    oid: str
    path: str


class CheckOutcome(NamedTuple):
    ok: bool
    message: str
    numstat: list[tuple[str, int, int]]
    """(path, added, removed) per file as git read the diff (the new name of a rename)."""


PatchCheck = Callable[[bytes, Sequence[IndexEntry]], Callable[[], CheckOutcome]]
"""Starts a patch check of the diff on an index of the given baseline entries and returns
the function that waits for its outcome (the check may run while the caller works)."""


def parents(path: str) -> list[str]:
    """The folders above ``path``, outermost first."""
    parts = path.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


class MemoryTree:
    """A baseline tree in memory (for tests and callers without git). ``files`` maps a path
    to its content (mode ``100644``) or to ``(mode, content)``; a symlink's content is its
    target."""

    def __init__(
        self, files: Mapping[str, bytes | tuple[str, bytes]], object_format: str = "sha1"
    ) -> None:
        self._format = object_format
        self._files: dict[str, TreeEntry] = {}
        self._blobs: dict[str, bytes] = {}
        self._folders: dict[str, list[str]] = {"": []}
        for path, value in sorted(files.items()):
            mode, data = value if isinstance(value, tuple) else (MODE_FILE, value)
            entry = TreeEntry(mode, diffs.blob_id(data, object_format))
            self._files[path] = entry
            self._blobs[entry.oid] = data
            parts = path.split("/")
            for i, name in enumerate(parts):
                siblings = self._folders.setdefault("/".join(parts[:i]), [])
                if name not in siblings:
                    siblings.append(name)

    @property
    def object_format(self) -> str:
        return self._format

    def lookup(self, path: str) -> Lookup:
        for parent in parents(path):
            if parent in self._files:
                return Lookup(None, (parent, self._files[parent]))
            if parent not in self._folders:
                return Lookup(None, None)
        if path in self._files:
            return Lookup(self._files[path], None)
        if path in self._folders:
            return Lookup(TreeEntry(MODE_TREE, ""), None)
        return Lookup(None, None)

    def names(self, folder: str) -> Collection[str]:
        return self._folders.get(folder, [])

    def read(self, entry: TreeEntry) -> bytes:
        return self._blobs[entry.oid]

    def prefetch(self, paths: Sequence[str]) -> None:
        pass

    def read_all(self, entries: Sequence[TreeEntry]) -> list[bytes]:
        return [self._blobs[e.oid] for e in entries]
