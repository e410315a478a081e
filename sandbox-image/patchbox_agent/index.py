"""The workspace file index: which files the model may see, per workspace version.

Built on first use by one walk that never follows a link and skips protected names, then
filtered by what git would ignore (git itself reads the workspace's ``.gitignore`` files,
through a private, empty git directory in /tmp; where git is missing nothing is ignored).
Every write through the agent and every process run bumps the version and drops the
index, so a listing or a cached search is never older than the workspace.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from typing import Dict, List, Optional, Tuple

from . import jail

_GIT_ENV = {
    "HOME": "/tmp",
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_TERMINAL_PROMPT": "0",
    "LC_ALL": "C",
}
_GIT_OPTS = [
    "-c",
    "core.fsmonitor=false",
    "-c",
    "core.untrackedCache=false",
    "-c",
    "core.hooksPath=/dev/null",
]


class FileIndex:
    def __init__(self, root_fd: int, workspace: str) -> None:
        self._root_fd = root_fd
        self._workspace = workspace
        self.version = 0
        self._dirs: Optional[Dict[str, List[str]]] = None
        self._files: Optional[List[str]] = None
        self.git_filtered = False
        self._git_dir = os.path.join(tempfile.gettempdir(), ".patchbox-index-git")

    def invalidate(self) -> None:
        """The workspace changed (or may have): a new version, nothing cached survives."""
        self.version += 1
        self._dirs = None
        self._files = None

    def touch(self) -> None:
        """File contents changed but no path appeared or vanished: a new version, same list."""
        self.version += 1

    def files(self) -> List[str]:
        """Every visible file, sorted."""
        if self._files is None:
            self._build()
        assert self._files is not None  # noqa: S101 - set by _build
        return self._files

    def by_dir(self) -> Dict[str, List[str]]:
        """Visible file names grouped by their directory ("" for the top)."""
        if self._dirs is None:
            self._build()
        assert self._dirs is not None  # noqa: S101 - set by _build
        return self._dirs

    def snapshot(self) -> Dict[str, Tuple[int, int, int, int, int]]:
        """Metadata of every visible file: (mode, size, mtime, ctime, inode). A change of
        content always changes ctime, which no unprivileged process can set back."""
        out: Dict[str, Tuple[int, int, int, int, int]] = {}
        for directory, names in self.by_dir().items():
            try:
                dfd = jail.open_dir(self._root_fd, directory.split("/") if directory else [])
            except jail.PathDeniedError:
                continue
            try:
                for name in names:
                    try:
                        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                    except OSError:
                        continue
                    path = f"{directory}/{name}" if directory else name
                    out[path] = (st.st_mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
            finally:
                os.close(dfd)
        return out

    def _build(self) -> None:
        walked = list(jail.walk_files(self._root_fd))
        ignored = self._ignored()
        files = [p for p in walked if p not in ignored] if ignored else walked
        dirs: Dict[str, List[str]] = {}
        for path in files:
            head, _, name = path.rpartition("/")
            dirs.setdefault(head, []).append(name)
        self._files = files
        self._dirs = dirs

    def _ignored(self) -> set[str]:
        try:
            if not os.path.isdir(self._git_dir):
                subprocess.run(
                    ["git", *_GIT_OPTS, "init", "-q", "--bare", self._git_dir],
                    env=_GIT_ENV,
                    stdin=subprocess.DEVNULL,
                    capture_output=True,
                    check=True,
                    timeout=30,
                )
            out = subprocess.run(
                [
                    "git",
                    *_GIT_OPTS,
                    f"--git-dir={self._git_dir}",
                    f"--work-tree={self._workspace}",
                    "ls-files",
                    "-z",
                    "--others",
                    "--ignored",
                    "--exclude-standard",
                ],
                env=_GIT_ENV,
                cwd="/",
                stdin=subprocess.DEVNULL,
                capture_output=True,
                check=True,
                timeout=120,
            ).stdout
        except (OSError, subprocess.SubprocessError):
            self.git_filtered = False
            return set()
        self.git_filtered = True
        return {p for p in out.decode("utf-8", "surrogateescape").split("\0") if p}
