"""The baseline tree in the controller's private git dir, and git's patch check on it.

:class:`GitTree` is the :class:`~controller.changes.tree.BaselineTree` of a job's baseline:
the entries of the paths a diff names from their folders' tree objects, their blobs from one
``git cat-file --batch``, any other folder through an interactive ``git cat-file --batch``.
:func:`git_patch_check` runs ``git apply --check --cached --numstat`` on a private temporary
index holding the baseline entries of the touched paths, with no work tree. Every command
goes through :mod:`controller.repo.git`; nothing of the user's repository is written, and its
work tree is read only when the caller asks (for baseline contents it holds unchanged, each
checked by its git blob id).
"""

from __future__ import annotations

import hashlib
import re
import shutil
import struct
import subprocess
import threading
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import IO, Self

from controller.changes.tree import (
    MESSAGE_LIMIT,
    MODE_EXEC,
    MODE_FILE,
    MODE_TREE,
    CheckOutcome,
    IndexEntry,
    Lookup,
    PatchCheck,
    TreeEntry,
    parents,
)
from controller.changes.worktree import WorkTree
from controller.errors import GitError
from controller.paths import owned_temp_dir
from controller.repo.git import GIT_TIMEOUT, GitContext, git_argv, run_git
from patchbox_agent import diffs

_TREE_ENTRY = re.compile(rb"([0-7]{5,6}) ([^\x00]*)\x00", re.DOTALL)


class GitTree:
    """A baseline tree read in the private git dir: the entries of known paths from their
    folders' tree objects (:meth:`prefetch`), blobs from one ``git cat-file --batch`` per batch
    (:meth:`read_all`), and any other folder through an interactive ``git cat-file
    --batch`` started when first needed. Use as a context manager; :meth:`close` ends it."""

    def __init__(
        self,
        git_dir: Path,
        tree: str,
        on_entries: Callable[[list[IndexEntry]], None] | None = None,
        work_tree: Path | None = None,
    ) -> None:
        """``on_entries``, when given, is called on the prefetch thread with the entries of
        the prefetched paths that are regular files, as soon as they are known (before
        their contents are read). ``work_tree``, when given, is read for the prefetched
        files' contents first (through :class:`~controller.changes.worktree.WorkTree`, no
        symlink followed): a file whose git blob id is the entry's id holds exactly its
        bytes; any other is read from git."""
        self._tree = tree
        self._on_entries = on_entries
        self._work_tree = work_tree
        self._format = "sha256" if len(tree) == 64 else "sha1"
        self._oid_len = 32 if self._format == "sha256" else 20
        self._ctx = GitContext(
            cwd=git_dir.parent, git_dir=git_dir, home=git_dir.parent, literal_pathspecs=True
        )
        self._folders: dict[str, dict[str, TreeEntry] | None] = {}
        self._entries: dict[str, TreeEntry] = {}
        self._fetched: dict[str, TreeEntry] = {}
        self._contents: dict[str, bytes] = {}
        self._prefetch: threading.Thread | None = None
        self._failure: BaseException | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._prefetch is not None:
            self._prefetch.join()
            self._prefetch = None
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.stdin is not None:
            try:
                proc.stdin.close()
            except OSError:
                pass
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()

    @property
    def object_format(self) -> str:
        return self._format

    def prefetch(self, paths: Sequence[str]) -> None:
        """Starts looking ``paths`` up on a thread: their entries from their folders' tree
        objects and the content of those that are blobs (from the work tree when it holds
        them unchanged), each from one ``git cat-file --batch``. Lookups wait for it; a
        path it did not find as a file, symlink or submodule is looked up folder by
        folder."""
        if self._prefetch is None and paths:
            self._prefetch = threading.Thread(target=self._fetch, args=(list(paths),))
            self._prefetch.start()

    def _fetch(self, paths: list[str]) -> None:
        try:
            self._find(paths)
            if self._on_entries is not None:
                self._on_entries(
                    [
                        IndexEntry(e.mode, e.oid, path)
                        for path, e in self._fetched.items()
                        if e.mode in (MODE_FILE, MODE_EXEC)
                    ]
                )
            files = {p: e for p, e in self._fetched.items() if e.mode in (MODE_FILE, MODE_EXEC)}
            if self._work_tree is not None:
                self._contents.update(self._in_work_tree(self._work_tree, files))
            blobs = sorted({e for e in files.values() if e.oid not in self._contents})
            self._contents.update(zip((e.oid for e in blobs), self._cat(blobs), strict=True))
        except BaseException as exc:  # re-raised by the thread that waits for it
            self._failure = exc

    def _in_work_tree(self, top: Path, files: dict[str, TreeEntry]) -> dict[str, bytes]:
        """The contents (by blob id) of those ``files`` that the work tree holds unchanged;
        any it cannot read, or that differ, are left out."""
        found: dict[str, bytes] = {}
        try:
            with WorkTree(top) as wt:
                for path, entry in files.items():
                    state = wt.state(path, with_data=True)
                    data = state.data
                    if data is not None and diffs.blob_id(data, self._format) == entry.oid:
                        found[entry.oid] = data
        except OSError:
            pass  # read from git
        return found

    def _find(self, paths: list[str]) -> None:
        """The entries of ``paths`` (those that are not folders) from the tree objects of
        their folders, read by one ``git cat-file --batch`` as ``<tree>:<folder>``. (``git
        ls-tree`` with one pathspec per path compares every entry it walks with every
        pathspec: several times slower on a large tree.) A name git's path syntax would
        read otherwise (``.`` or ``..`` components, empty ones) is left to the lookups."""
        folders: dict[str, dict[bytes, str]] = {}
        for path in paths:
            parts = path.split("/")
            if "\n" in path or "\0" in path or any(p in ("", ".", "..") for p in parts):
                continue
            folder, _, name = path.rpartition("/")
            folders.setdefault(folder, {})[name.encode("utf-8", "surrogateescape")] = path
        if not folders:
            return
        order = list(folders)
        requests = b"".join(
            (f"{self._tree}:{f}" if f else self._tree).encode("utf-8", "surrogateescape") + b"\n"
            for f in order
        )
        out = run_git(self._ctx, "cat-file", "--batch", stdin=requests, spool=True).stdout
        pos = 0
        for folder in order:
            end = out.find(b"\n", pos)
            if end < 0:
                raise GitError("git cat-file ended early")
            header = out[pos:end].split(b" ")
            pos = end + 1
            if len(header) != 3 or b":" in header[0] or not header[2].isdigit():
                continue  # "<tree>:<folder> missing": looked up folder by folder
            size = int(header[2])
            if header[1] == b"tree":
                self._pick(out[pos : pos + size], folders[folder])
            pos += size + 1

    def _pick(self, raw: bytes, wanted: dict[bytes, str]) -> None:
        """Adds the entries of ``wanted`` (name to path) found in the tree object ``raw``,
        folders left out."""
        pos, n, left = 0, self._oid_len, len(wanted)
        while pos < len(raw) and left:
            m = _TREE_ENTRY.match(raw, pos)
            if m is None or m.end() + n > len(raw):
                raise GitError("git cat-file: a malformed tree object")
            pos = m.end() + n
            path = wanted.get(m.group(2))
            if path is None:
                continue
            left -= 1
            mode = m.group(1).decode().rjust(6, "0")
            if mode != MODE_TREE:
                self._fetched[path] = TreeEntry(mode, raw[m.end() : pos].hex())

    def _wait(self) -> None:
        thread, self._prefetch = self._prefetch, None
        if thread is not None:
            thread.join()
            self._entries.update(self._fetched)
        if self._failure is not None:
            failure, self._failure = self._failure, None
            raise failure

    def read_all(self, entries: Sequence[TreeEntry]) -> list[bytes]:
        """The contents of the blobs, in order (those not prefetched from one ``git cat-file
        --batch``)."""
        self._wait()
        missing = sorted({e for e in entries if e.oid not in self._contents})
        self._contents.update(zip((e.oid for e in missing), self._cat(missing), strict=True))
        return [self._contents[e.oid] for e in entries]

    def _cat(self, entries: Sequence[TreeEntry]) -> list[bytes]:
        if not entries:
            return []
        requests = b"".join(e.oid.encode() + b"\n" for e in entries)
        out = run_git(self._ctx, "cat-file", "--batch", stdin=requests, spool=True).stdout
        pos, blobs = 0, []
        for entry in entries:
            end = out.find(b"\n", pos)
            header = out[pos:end].split() if end >= 0 else []
            if len(header) != 3 or header[1] != b"blob" or header[0] != entry.oid.encode():
                raise GitError(f"git cat-file: {entry.oid} is not a blob")
            size = int(header[2])
            blobs.append(out[end + 1 : end + 1 + size])
            pos = end + 2 + size
        return blobs

    def _process(self) -> subprocess.Popen[bytes]:
        if self._proc is None:
            self._proc = subprocess.Popen(
                git_argv("cat-file", "--batch"),
                cwd=self._ctx.cwd,
                env=self._ctx.env(),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
            )
        return self._proc

    def _object(self, oid: str, kind: str) -> bytes:
        proc = self._process()
        stdin, stdout = proc.stdin, proc.stdout
        if stdin is None or stdout is None:  # pragma: no cover - Popen contract
            raise GitError("git cat-file is not running")
        try:
            stdin.write(oid.encode() + b"\n")
            stdin.flush()
            header = stdout.readline().split()
            if len(header) != 3 or header[1] != kind.encode():
                raise GitError(f"git cat-file: {oid} is not a {kind}")
            size = int(header[2])
            data = _read_exactly(stdout, size + 1)
        except (OSError, ValueError) as exc:
            raise GitError("git cat-file failed") from exc
        return data[:size]

    def _folder(self, path: str) -> dict[str, TreeEntry] | None:
        if path in self._folders:
            return self._folders[path]
        if path:
            parent, _, name = path.rpartition("/")
            listing = self._folder(parent)
            entry = listing.get(name) if listing is not None else None
            oid = entry.oid if entry is not None and entry.mode == MODE_TREE else None
        else:
            oid = self._tree
        folder = None if oid is None else self._parse_tree(self._object(oid, "tree"))
        self._folders[path] = folder
        return folder

    def _parse_tree(self, raw: bytes) -> dict[str, TreeEntry]:
        out: dict[str, TreeEntry] = {}
        pos, n = 0, self._oid_len
        while pos < len(raw):
            m = _TREE_ENTRY.match(raw, pos)
            if m is None or m.end() + n > len(raw):
                raise GitError("git cat-file: a malformed tree object")
            mode = m.group(1).decode().rjust(6, "0")
            name = m.group(2).decode("utf-8", "surrogateescape")
            out[name] = TreeEntry(mode, raw[m.end() : m.end() + n].hex())
            pos = m.end() + n
        return out

    def lookup(self, path: str) -> Lookup:
        self._wait()
        known = self._entries.get(path)
        if known is not None:
            return Lookup(known, None)
        folder = ""
        for parent in parents(path):
            listing = self._folder(folder)
            entry = listing.get(parent.rsplit("/", 1)[-1]) if listing is not None else None
            if entry is None:
                return Lookup(None, None)
            if entry.mode != MODE_TREE:
                return Lookup(None, (parent, entry))
            folder = parent
        listing = self._folder(folder)
        return Lookup(listing.get(path.rsplit("/", 1)[-1]) if listing else None, None)

    def names(self, folder: str) -> Collection[str]:
        listing = self._folder(folder)
        return listing.keys() if listing is not None else ()

    def read(self, entry: TreeEntry) -> bytes:
        self._wait()
        known = self._contents.get(entry.oid)
        return known if known is not None else self._object(entry.oid, "blob")


def _read_exactly(stream: IO[bytes], size: int) -> bytes:
    data = stream.read(size)
    if data is None or len(data) != size:
        raise GitError("git cat-file ended early")
    return data


def _parse_numstat(out: bytes) -> list[tuple[str, int, int]]:
    """``git apply --numstat -z``: ``A\\tR\\tPATH\\0``, or ``A\\tR\\t\\0OLD\\0NEW\\0`` for a
    rename; binary files count ``-``."""
    fields = out.split(b"\0")
    stats: list[tuple[str, int, int]] = []
    i = 0
    while i < len(fields) and fields[i]:
        added, removed, name = fields[i].split(b"\t", 2)
        if not name:
            name = fields[i + 2]
            i += 2
        count = [int(v) if v.isdigit() else -1 for v in (added, removed)]
        stats.append((name.decode("utf-8", "surrogateescape"), count[0], count[1]))
        i += 1
    return stats


def index_file(entries: Sequence[IndexEntry]) -> bytes:
    """The index file that ``git update-index -z --index-info`` writes for these entries
    (distinct paths of one tree, stage 0): version 2, sorted by path, no stat data, and
    the checksum of the object format their ids are in. Written here, it saves starting
    one more git process on the way to the patch check."""
    width = len(entries[0].oid) // 2 if entries else 20
    algorithm = "sha256" if width == 32 else "sha1"
    items = sorted(
        (e.path.encode("utf-8", "surrogateescape"), int(e.mode, 8), bytes.fromhex(e.oid))
        for e in entries
    )
    parts = [b"DIRC", struct.pack(">II", 2, len(items))]
    for name, mode, oid in items:
        if len(oid) != width:
            raise GitError("index entries of two object formats")
        head = struct.pack(">10I", 0, 0, 0, 0, 0, 0, mode, 0, 0, 0) + oid
        head += struct.pack(">H", min(len(name), 0xFFF))
        parts.append(head + name + b"\0" * (8 - (len(head) + len(name)) % 8))
    body = b"".join(parts)
    return body + hashlib.new(algorithm, body).digest()


def git_patch_check(git_dir: Path) -> PatchCheck:
    """The patch check on the private git dir: a temporary index (in a controller-owned
    folder, :func:`index_file`) holding the baseline entries of the touched paths, then
    ``git apply --check --cached --numstat`` of the diff on it. Nothing of the user's
    repository is written. The diff and git's output go through files in that folder, so
    waiting for the check is one wait for the process (no thread feeding a pipe that needs
    the interpreter)."""

    def start(diff: bytes, entries: Sequence[IndexEntry]) -> Callable[[], CheckOutcome]:
        scratch = owned_temp_dir("check-")
        ctx = GitContext(cwd=scratch, git_dir=git_dir, index_file=scratch / "index", home=scratch)
        try:
            if entries:
                (scratch / "index").write_bytes(index_file(entries))
            (scratch / "diff").write_bytes(diff)
            with (
                (scratch / "diff").open("rb") as source,
                (scratch / "out").open("wb") as sink,
                (scratch / "err").open("wb") as errors,
            ):
                proc = subprocess.Popen(
                    git_argv(
                        "apply",
                        "--check",
                        "--cached",
                        "--numstat",
                        "-z",
                        "-p1",
                        "--whitespace=nowarn",
                        "-",
                    ),
                    cwd=ctx.cwd,
                    env=ctx.env(),
                    stdin=source,
                    stdout=sink,
                    stderr=errors,
                )
        except BaseException:
            shutil.rmtree(scratch, ignore_errors=True)
            raise

        def finish() -> CheckOutcome:
            try:
                try:
                    proc.wait(timeout=GIT_TIMEOUT)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                out, err = (scratch / "out").read_bytes(), (scratch / "err").read_bytes()
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
            if proc.returncode != 0:
                lines = err.decode("utf-8", "replace").strip().splitlines()
                detail = printable(lines[0] if lines else f"exit {proc.returncode}")
                return CheckOutcome(ok=False, message=f"git apply --check: {detail}", numstat=[])
            return CheckOutcome(ok=True, message="", numstat=_parse_numstat(out))

        return finish

    return start


def printable(text: str) -> str:
    """A line of git's output made safe to show: control characters dropped, bounded."""
    return "".join(ch for ch in text if ch.isprintable())[:MESSAGE_LIMIT]
