"""The one diff a job yields, computed on the host.

The sandbox only reports which visible files changed since the baseline and hands over their
bytes; the host stores those bytes as blobs in its private git dir, builds the new tree
from the baseline tree, and lets git diff the two trees. No git command runs in a folder
the sandbox wrote, and no content is converted, filtered or executed on the way.
"""

from __future__ import annotations

import base64
import hashlib
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from controller.errors import ErrorCode, GitError, PatchboxError
from controller.paths import owned_temp_dir
from controller.repo.baseline import Baseline, private_repo_of
from controller.repo.private import PrivateRepo
from controller.sandbox.base import Sandbox
from patchbox_agent import diffs, jail

DIFF_TREE = (
    "diff-tree",
    "-p",
    "-r",
    "--full-index",
    "--no-renames",
    "--no-ext-diff",
    "--no-textconv",
    "--no-color",
)
"""A job's diff between two trees: full index lines, no renames, no driver or conversion."""
MAX_CHANGED_FILES = 1000
MAX_CHANGED_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class ChangedFile:
    path: str
    kind: str
    """``added``, ``modified`` or ``removed``."""
    mode: str | None
    """``100644``, ``100755`` or ``120000`` for what the sandbox holds; None if removed."""
    sha256: str | None


@dataclass
class Collected:
    """The final diff (git's unified format, full index lines) and the files behind it."""

    diff: str
    tree: str
    files: list[ChangedFile] = field(default_factory=list)

    @property
    def diff_sha256(self) -> str:
        return hashlib.sha256(self.diff.encode("utf-8", "surrogateescape")).hexdigest()


def _fetch(box: Sandbox, path: str, budget: int) -> tuple[str, bytes]:
    first = box.read_raw(path)
    if first.kind == "other":
        raise PatchboxError(
            f"{path}: not a regular file or symlink", code=ErrorCode.CHANGESET_INVALID
        )
    if first.size > budget:
        raise PatchboxError(
            f"the changed files exceed {MAX_CHANGED_BYTES} bytes", code=ErrorCode.LIMIT_EXCEEDED
        )
    data = bytearray(base64.b64decode(first.data, validate=True))
    while first.kind == "file" and len(data) < first.size:
        more = box.read_raw(path, offset=len(data))
        chunk = base64.b64decode(more.data, validate=True)
        if not chunk:
            break
        data += chunk
    mode = "120000" if first.kind == "symlink" else ("100755" if first.executable else "100644")
    return mode, bytes(data[: first.size])


def collect(box: Sandbox, baseline: Baseline) -> Collected:
    """Reads the changes out of ``box`` and diffs them against ``baseline`` on the host.

    Raises ``LIMIT_EXCEEDED`` when more than :data:`MAX_CHANGED_FILES` files or
    :data:`MAX_CHANGED_BYTES` bytes changed, ``CHANGESET_INVALID`` for an entry that is
    neither a file nor a symlink."""
    changes = box.changes()
    if changes.truncated or changes.count > MAX_CHANGED_FILES:
        raise PatchboxError(
            f"{changes.count} files changed; at most {MAX_CHANGED_FILES} may",
            code=ErrorCode.LIMIT_EXCEEDED,
        )
    for path in (*changes.added, *changes.modified, *changes.removed):
        try:  # the agent's name rules, the change set's too (a name not UTF-8 comes escaped)
            diffs.check_path(path)
        except diffs.DiffError as exc:
            raise PatchboxError(
                f"a changed file's name is refused ({exc.reason}): {jail.escape_name(path)}",
                code=ErrorCode.CHANGESET_INVALID,
            ) from None
    private = private_repo_of(baseline)
    scratch = owned_temp_dir("collect-")
    try:
        files: list[ChangedFile] = []
        budget = MAX_CHANGED_BYTES
        blobs = scratch / "blobs"
        blobs.mkdir()
        fetched: list[tuple[str, str, Path]] = []
        for kind, paths in (("added", changes.added), ("modified", changes.modified)):
            for path in paths:
                mode, data = _fetch(box, path, budget)
                budget -= len(data)
                blob = blobs / str(len(fetched))
                blob.write_bytes(data)
                fetched.append((mode, path, blob))
                digest = hashlib.sha256(data).hexdigest()
                files.append(ChangedFile(path, kind, mode, digest))
        oids = store_blobs(private, [blob for _, _, blob in fetched])
        written = [(mode, oid, path) for (mode, path, _), oid in zip(fetched, oids, strict=True)]
        files += [ChangedFile(path, "removed", None, None) for path in changes.removed]
        tree, diff = tree_over(private, baseline.tree, written, changes.removed, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return Collected(diff=diff, tree=tree, files=sorted(files, key=lambda f: f.path))


def tree_over(
    private: PrivateRepo,
    base: str,
    written: Sequence[tuple[str, str, str]],
    removed: Sequence[str],
    scratch: Path,
) -> tuple[str, str]:
    """The tree ``base`` with ``written`` (mode, blob id, path) put in and ``removed`` taken
    out, made on a private index in ``scratch`` with one ``git update-index`` for every
    path; and a job's diff from ``base`` to it (:data:`DIFF_TREE`)."""
    index = scratch / "index"
    private.git("read-tree", base, index=index)
    entries = [f"{mode} {oid}\t{path}\0" for mode, oid, path in written]
    zero = "0" * len(base)  # mode 0 drops an entry (--force-remove would want a work tree)
    entries += [f"0 {zero}\t{path}\0" for path in removed]
    if entries:
        private.git(
            "update-index",
            "-z",
            "--index-info",
            index=index,
            stdin="".join(entries).encode("utf-8", "surrogateescape"),
        )
    tree = private.git("write-tree", index=index).decode().strip()
    diff = private.git(*DIFF_TREE, base, tree).decode("utf-8", "surrogateescape")
    return tree, diff


def store_blobs(private: PrivateRepo, blobs: list[Path]) -> list[str]:
    """Writes the files ``blobs`` into the private git dir as blobs, bytes as they are (no
    filter or conversion); their object ids, in order. One ``git hash-object`` for all of
    them, never a process per file (docs/performance.md has the measurements)."""
    if not blobs:
        return []
    if any("\n" in str(blob) for blob in blobs):  # one path per line: hash them one by one
        hashed = ("hash-object", "-w", "--no-filters", "--stdin")
        return [
            private.git(*hashed, writes=True, stdin=b.read_bytes()).decode().strip() for b in blobs
        ]
    listing = "".join(f"{blob}\n" for blob in blobs).encode("utf-8", "surrogateescape")
    out = private.git(
        "hash-object", "-w", "--no-filters", "--stdin-paths", writes=True, stdin=listing
    )
    oids = out.decode("ascii").split()
    if len(oids) != len(blobs):
        msg = f"git hash-object gave {len(oids)} object ids for {len(blobs)} files"
        raise GitError(msg)
    return oids


def baseline_sha256(baseline: Baseline, paths: Iterable[str]) -> dict[str, str | None]:
    """The SHA-256 of each of ``paths`` as the baseline tree holds it (a file's bytes, a
    symlink's target), or None where the tree has no blob there. Read from the private git
    dir only; meant for the few paths a reconciliation cannot settle from the changes."""
    wanted = set(paths)
    out: dict[str, str | None] = dict.fromkeys(wanted)
    if not wanted:
        return out
    private = private_repo_of(baseline)
    listing = private.git("ls-tree", "-r", "-z", "--full-tree", baseline.tree)
    for record in listing.split(b"\0"):
        meta, _, name = record.partition(b"\t")
        path = name.decode("utf-8", "surrogateescape")
        if path not in wanted:
            continue
        _mode, kind, oid = meta.decode("ascii").split(" ")
        if kind == "blob":
            out[path] = hashlib.sha256(private.git("cat-file", "blob", oid)).hexdigest()
    return out
