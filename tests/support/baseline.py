"""What the baseline and repository-health tests compare: a private HOME for the test's git
and the controller, the controller's leftovers, exact snapshots of folders, and the files of
a baseline's tar against a work tree."""

from __future__ import annotations

import hashlib
import io
import os
import stat
import tarfile
from pathlib import Path

import pytest

from controller.repo.baseline import Baseline, archive_stream
from tests.support.git import git_env


def isolate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """A throwaway HOME for both the test's git and the controller, and a private
    ``PATCHBOX_HOME``; returns the git environment for the test's own commands."""
    home = tmp_path / "home"
    env = git_env(home)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    monkeypatch.setenv("PATCHBOX_HOME", str(tmp_path / "patchbox-home"))
    return env


def leftovers(tmp_path: Path) -> list[str]:
    """Temp folders the controller left under the test's ``PATCHBOX_HOME``."""
    tmp = tmp_path / "patchbox-home" / "tmp"
    return sorted(p.name for p in tmp.iterdir()) if tmp.is_dir() else []


Entry = tuple[int, int, str]
"""(st_mode, mtime in ns, sha-256 of the bytes or the link target; '' for anything else)."""


def snapshot(root: Path) -> dict[str, Entry]:
    """Every entry under ``root`` (``root`` itself as '.'), read without following links or
    opening anything but regular files. Folder mtimes catch files created then removed."""
    out: dict[str, Entry] = {}

    def one(path: Path, rel: str) -> None:
        st = os.lstat(path)
        digest = ""
        if stat.S_ISREG(st.st_mode):
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
        elif stat.S_ISLNK(st.st_mode):
            digest = hashlib.sha256(os.fsencode(path.readlink())).hexdigest()
        out[rel] = (st.st_mode, st.st_mtime_ns, digest)
        if stat.S_ISDIR(st.st_mode):
            for entry in sorted(p.name for p in path.iterdir()):
                one(path / entry, entry if rel == "." else f"{rel}/{entry}")

    one(root, ".")
    return out


Files = dict[str, tuple[bytes, bool]]
"""Path -> (bytes, executable)."""


def archive_files(baseline: Baseline) -> tuple[Files, set[str]]:
    """The regular files of the baseline's tar (with their exec bit) and its folders."""
    with archive_stream(baseline) as chunks:
        data = b"".join(chunks)
    files: Files = {}
    folders: set[str] = set()
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        for member in tar.getmembers():
            name = member.name.rstrip("/")
            if member.isdir():
                folders.add(name)
            elif member.isfile():
                handle = tar.extractfile(member)
                assert handle is not None
                files[name] = (handle.read(), bool(member.mode & 0o100))
            else:
                files[name] = (f"<{member.type!r}>".encode(), False)
    return files, folders


def work_tree_files(top: Path, skip: set[str] | None = None) -> Files:
    """Every regular file under ``top`` except ``.git`` (folder or file) and ``skip``."""
    skip = skip or set()
    out: Files = {}
    for folder, dirs, names in os.walk(top):
        rel_folder = os.path.relpath(folder, top)
        if rel_folder == ".":
            dirs[:] = [d for d in dirs if d != ".git"]
        for name in names:
            path = Path(folder) / name
            rel = name if rel_folder == "." else f"{rel_folder}/{name}"
            if rel in skip or rel == ".git":
                continue
            st = path.lstat()
            assert stat.S_ISREG(st.st_mode), rel
            out[rel] = (path.read_bytes(), bool(st.st_mode & 0o100))
    return out
