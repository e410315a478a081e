"""Exact snapshots of a work tree, for the change-set, apply and journal tests: everything of
it a user could lose."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Snapshot:
    """Everything of a work tree a user could lose: each file's mode and bytes, each
    symlink, each folder, and the bytes of the index and HEAD."""

    files: dict[str, tuple[int, bytes]]
    links: dict[str, str]
    folders: frozenset[str]
    index: bytes
    head: bytes


def snapshot(repo: Path) -> Snapshot:
    files: dict[str, tuple[int, bytes]] = {}
    links: dict[str, str] = {}
    folders: set[str] = set()
    for folder, dirnames, filenames in os.walk(repo):
        if Path(folder) == repo:
            dirnames[:] = [d for d in dirnames if d != ".git"]
        for name in dirnames + filenames:
            path = Path(folder) / name
            key = path.relative_to(repo).as_posix()
            st = path.lstat()
            if stat.S_ISLNK(st.st_mode):
                links[key] = str(path.readlink())
            elif stat.S_ISDIR(st.st_mode):
                folders.add(key)
            else:
                files[key] = (stat.S_IMODE(st.st_mode), path.read_bytes())
    return Snapshot(
        files=files,
        links=links,
        folders=frozenset(folders),
        index=(repo / ".git" / "index").read_bytes(),
        head=(repo / ".git" / "HEAD").read_bytes(),
    )
