"""Real git repositories in temp folders, built with the system git under a throwaway HOME
(the developer's own configuration never applies), and exact snapshots of folders."""

from __future__ import annotations

import hashlib
import io
import os
import stat
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from controller.repo.baseline import Baseline, archive_stream

DATE = "1600000000 +0000"


def git_env(home: Path) -> dict[str, str]:
    """A git environment whose only configuration is under ``home`` (``.gitconfig``, and
    ``.config/git/config`` if a test writes one); no system configuration."""
    home.mkdir(parents=True, exist_ok=True)
    gitconfig = home / ".gitconfig"
    if not gitconfig.exists():
        gitconfig.write_text(
            "[user]\n\tname = Test\n\temail = test@example.invalid\n"
            "[init]\n\tdefaultBranch = main\n"
            "[advice]\n\tdetachedHead = false\n"
        )
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_DATE": DATE,
        "GIT_COMMITTER_DATE": DATE,
        "GIT_EDITOR": "true",
        "GIT_SEQUENCE_EDITOR": "true",
        "GIT_PAGER": "cat",
        "GIT_TERMINAL_PROMPT": "0",
        "LC_ALL": "C",
        "TZ": "UTC",
    }


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


@dataclass
class Repo:
    path: Path
    env: dict[str, str]

    def git(self, *args: str, check: bool = True, stdin: bytes | None = None) -> str:
        proc = self.run(*args, stdin=stdin)
        if check and proc.returncode != 0:
            msg = f"git {' '.join(args)} failed ({proc.returncode}): {proc.stderr.decode()}"
            raise AssertionError(msg)
        return proc.stdout.decode("utf-8", "surrogateescape").strip()

    def run(self, *args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            ["git", *args],
            cwd=self.path,
            env=self.env,
            input=stdin,
            capture_output=True,
            check=False,
            timeout=60,
        )

    def write(self, rel: str, data: bytes | str, *, executable: bool = False) -> Path:
        target = self.path / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data.encode() if isinstance(data, str) else data)
        target.chmod(0o755 if executable else 0o644)
        return target

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
    path: Path, env: dict[str, str], files: dict[str, bytes | str] | None = None, *args: str
) -> Repo:
    """``git init`` at ``path`` (extra ``args`` go to init), then one commit of ``files``."""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["git", "init", "-q", *args, str(path)], env=env, check=True, timeout=60)
    repo = Repo(path, env)
    if files is not None:
        for rel, data in files.items():
            repo.write(rel, data)
        repo.commit("initial")
    return repo


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


def refs_and_logs(repo: Repo) -> tuple[str, str, str]:
    """All refs, the HEAD reflog and the worktree list, as the repository's git shows them."""
    return (
        repo.git("for-each-ref", "--format=%(refname) %(objectname)"),
        repo.git("reflog", "show", "--format=%H %gs", "HEAD", check=False),
        repo.git("worktree", "list", "--porcelain"),
    )


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
