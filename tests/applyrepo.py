"""Real git repositories for the change-set, apply and journal tests, made with the test's
own git under a clean environment (no user or system configuration), canonical diffs made by
git, and exact snapshots of a work tree."""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

Content = bytes | tuple[int, bytes]
"""A file's content, or (permission bits, content)."""


def git_env(home: Path) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@localhost",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@localhost",
        "GIT_OPTIONAL_LOCKS": "0",
        "LC_ALL": "C",
    }


def git(repo: Path, *args: str, stdin: bytes | None = None) -> bytes:
    proc = subprocess.run(
        ["git", "-c", "core.hooksPath=/dev/null", "-C", str(repo), *args],
        env=git_env(repo.parent),
        input=stdin,
        capture_output=True,
        check=False,
    )
    if proc.returncode != 0:
        msg = f"git {' '.join(args)}: {proc.stderr.decode(errors='replace')}"
        raise AssertionError(msg)
    return proc.stdout


def write_files(root: Path, files: Mapping[str, Content]) -> None:
    for name, value in files.items():
        mode, data = value if isinstance(value, tuple) else (0o644, value)
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        path.chmod(mode)


def make_repo(
    path: Path,
    files: Mapping[str, Content],
    *,
    symlinks: dict[str, str] | None = None,
    gitlinks: tuple[str, ...] = (),
) -> Path:
    """A repository with one commit holding ``files``, ``symlinks`` (name -> target) and
    ``gitlinks`` (submodule entries with an empty folder, as an uninitialised submodule)."""
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    write_files(path, files)
    for name, target in (symlinks or {}).items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).symlink_to(target)
    git(path, "add", "-A")
    for name in gitlinks:
        (path / name).mkdir(parents=True)
        git(path, "update-index", "--add", "--cacheinfo", f"160000,{'1' * 40},{name}")
    git(path, "commit", "-qm", "init")
    return path


def make_diff(scratch: Path, before: Mapping[str, Content], after: Mapping[str, Content]) -> str:
    """The canonical ``git diff`` (renames found) from ``before`` to ``after``."""
    repo = scratch / f"diff-{hashlib.sha256(repr((before, after)).encode()).hexdigest()[:12]}"
    if not repo.exists():
        make_repo(repo, before)
        for name in before:
            (repo / name).unlink()
        write_files(repo, after)
        git(repo, "add", "-A")
    return git(repo, "diff", "--cached", "-M", "HEAD").decode("utf-8")


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


def status(repo: Path) -> bytes:
    """``git status`` as the user sees it (staged, unstaged, untracked), without refreshing
    the index."""
    return git(repo, "--no-optional-locks", "status", "--porcelain=v2", "--untracked-files=all")
