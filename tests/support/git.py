"""The one way the tests make and run real git repositories: the system git in an isolated
environment (no system configuration; user configuration only from a throwaway HOME when a
test asks for one, else none at all), with a fixed identity and dates.

``init`` makes a repository (optionally with files and one commit) and returns a ``Repo``;
``git(path, *args)`` runs one command in a repository and returns its output."""

from __future__ import annotations

import hashlib
import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

DATE = "1600000000 +0000"
NAME = "t"
EMAIL = "t@example.invalid"

Content = bytes | tuple[int, bytes]
"""A file's bytes, or (permission bits, bytes)."""
Written = Content | str | tuple[int, str]
"""What ``write_files`` and ``init`` take: bytes or text, optionally with permission bits."""


def git_env(home: Path | None = None) -> dict[str, str]:
    """The environment of every git command a test runs. With ``home``, the only user
    configuration is under it (``.gitconfig``, written here if missing, and
    ``.config/git/...`` if a test writes them); without, there is none at all."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_NAME": NAME,
        "GIT_AUTHOR_EMAIL": EMAIL,
        "GIT_COMMITTER_NAME": NAME,
        "GIT_COMMITTER_EMAIL": EMAIL,
        "GIT_AUTHOR_DATE": DATE,
        "GIT_COMMITTER_DATE": DATE,
        "GIT_EDITOR": "true",
        "GIT_SEQUENCE_EDITOR": "true",
        "GIT_PAGER": "cat",
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_OPTIONAL_LOCKS": "0",
        "LC_ALL": "C",
        "TZ": "UTC",
    }
    if home is None:
        return env | {
            "HOME": "/nonexistent",
            "XDG_CONFIG_HOME": "/nonexistent",
            "GIT_CONFIG_GLOBAL": os.devnull,
        }
    home.mkdir(parents=True, exist_ok=True)
    gitconfig = home / ".gitconfig"
    if not gitconfig.exists():
        gitconfig.write_text(
            f"[user]\n\tname = {NAME}\n\temail = {EMAIL}\n"
            "[init]\n\tdefaultBranch = main\n"
            "[advice]\n\tdetachedHead = false\n"
        )
    return env | {"HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config")}


def run(
    path: Path, *args: str, env: dict[str, str] | None = None, stdin: bytes | None = None
) -> subprocess.CompletedProcess[bytes]:
    """``git ARGS`` in ``path`` (not checked); new repositories start on ``main``."""
    return subprocess.run(
        ["git", "-c", "init.defaultBranch=main", *args],
        cwd=path,
        env=git_env() if env is None else env,
        input=stdin,
        capture_output=True,
        check=False,
        timeout=60,
    )


def git(
    path: Path, *args: str, env: dict[str, str] | None = None, stdin: bytes | None = None
) -> str:
    """``git ARGS`` in ``path``; its output (not stripped). A failure fails the test."""
    proc = run(path, *args, env=env, stdin=stdin)
    if proc.returncode != 0:
        msg = f"git {' '.join(args)} failed ({proc.returncode}): {proc.stderr.decode()}"
        raise AssertionError(msg)
    return proc.stdout.decode("utf-8", "surrogateescape")


def write_files(root: Path, files: Mapping[str, Written]) -> None:
    """Writes each file (mode 644 unless given), making its folders."""
    for name, value in files.items():
        mode, data = value if isinstance(value, tuple) else (0o644, value)
        target = root / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data.encode() if isinstance(data, str) else data)
        target.chmod(mode)


@dataclass
class Repo:
    path: Path
    env: dict[str, str]

    def git(self, *args: str, check: bool = True, stdin: bytes | None = None) -> str:
        """``git ARGS`` here, its output stripped; unless ``check`` is off a failure fails
        the test."""
        proc = self.run(*args, stdin=stdin)
        if check and proc.returncode != 0:
            msg = f"git {' '.join(args)} failed ({proc.returncode}): {proc.stderr.decode()}"
            raise AssertionError(msg)
        return proc.stdout.decode("utf-8", "surrogateescape").strip()

    def run(self, *args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
        return run(self.path, *args, env=self.env, stdin=stdin)

    def write(self, rel: str, data: bytes | str, *, executable: bool = False) -> Path:
        raw = data.encode() if isinstance(data, str) else data
        write_files(self.path, {rel: (0o755 if executable else 0o644, raw)})
        return self.path / rel

    def commit(self, message: str = "commit", *paths: str) -> str:
        self.git("add", "-A", "--", *(paths or (".",)))
        self.git("commit", "-q", "--allow-empty", "-m", message)
        return self.head()

    def head(self) -> str:
        return self.git("rev-parse", "HEAD")

    @property
    def git_dir(self) -> Path:
        return Path(self.git("rev-parse", "--absolute-git-dir"))


def init(
    path: Path,
    files: Mapping[str, Written] | None = None,
    *args: str,
    env: dict[str, str] | None = None,
    symlinks: Mapping[str, str] | None = None,
    gitlinks: tuple[str, ...] = (),
    message: str = "initial",
) -> Repo:
    """``git init`` at ``path`` (extra ``args`` go to init) in ``env`` (default: no user
    configuration), then, if ``files`` are given, one commit of them, of ``symlinks`` (name
    -> target) and of ``gitlinks`` (submodule entries with an empty folder, as an
    uninitialised submodule)."""
    path.mkdir(parents=True, exist_ok=True)
    repo = Repo(path, git_env() if env is None else env)
    repo.git("init", "-q", *args)
    if files is not None:
        write_files(path, files)
        for name, target in (symlinks or {}).items():
            (path / name).parent.mkdir(parents=True, exist_ok=True)
            (path / name).symlink_to(target)
        repo.git("add", "-A")
        for name in gitlinks:
            (path / name).mkdir(parents=True)
            repo.git("update-index", "--add", "--cacheinfo", f"160000,{'1' * 40},{name}")
        repo.git("commit", "-q", "--allow-empty", "-m", message)
    return repo


def make_diff(scratch: Path, before: Mapping[str, Written], after: Mapping[str, Written]) -> str:
    """The canonical ``git diff`` (renames found) from ``before`` to ``after``."""
    path = scratch / f"diff-{hashlib.sha256(repr((before, after)).encode()).hexdigest()[:12]}"
    if not path.exists():
        init(path, before, message="init")
        for name in before:
            (path / name).unlink()
        write_files(path, after)
        git(path, "add", "-A")
    return git(path, "diff", "--cached", "-M", "HEAD")


def status(path: Path) -> bytes:
    """``git status`` as the user sees it (staged, unstaged, untracked), without refreshing
    the index."""
    args = ("--no-optional-locks", "status", "--porcelain=v2", "--untracked-files=all")
    proc = run(path, *args)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    return proc.stdout


def refs_and_logs(repo: Repo) -> tuple[str, str, str]:
    """All refs, the HEAD reflog and the worktree list, as the repository's git shows them."""
    return (
        repo.git("for-each-ref", "--format=%(refname) %(objectname)"),
        repo.git("reflog", "show", "--format=%H %gs", "HEAD", check=False),
        repo.git("worktree", "list", "--porcelain"),
    )
