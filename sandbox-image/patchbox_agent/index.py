"""The workspace file index: which files the model may see, per workspace version.

Built on first use by one walk that never follows a link and skips protected names, then
filtered by what git would ignore (git itself reads the workspace's ``.gitignore`` files,
through a private, empty git directory in /tmp; where git is missing nothing is ignored).
Every write through the agent and every process run bumps the version and drops the
index, so a listing or a cached search is never older than the workspace.
"""

from __future__ import annotations

import os

from . import jail, procs

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List, Optional, Tuple

    DirStat = Tuple[int, int, int]

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
    """Visible files per directory, kept honest across versions without rescanning the tree.

    After a possible change (a process ran, a patch applied) every known directory is
    stat'ed: any entry added, removed or renamed changes its directory's ctime, which no
    unprivileged process can set back, so only those directories are read again (and new
    subdirectories walked). New files go through git's ignore check; a changed
    ``.gitignore`` rebuilds everything.
    """

    def __init__(self, root_fd: int, workspace: str) -> None:
        self._root_fd = root_fd
        self._workspace = workspace
        self.version = 0
        self.git_filtered = False
        self._git_dir = os.path.join(os.environ.get("TMPDIR") or "/tmp", ".patchbox-index-git")
        self._raw: Dict[str, List[str]] = {}
        self._subdirs: Dict[str, List[str]] = {}
        self._dstat: Dict[str, DirStat] = {}
        self._ignored: set[str] = set()
        self._ignore_files: Dict[str, DirStat] = {}
        self._dirs: Optional[Dict[str, List[str]]] = None
        self._files: Optional[List[str]] = None
        self._built = False
        self._stale = False

    def invalidate(self) -> None:
        """The tree may have changed (paths added or removed): a new version."""
        self.version += 1
        self._stale = True

    def touch(self) -> None:
        """File contents changed but no path appeared or vanished: a new version, same list."""
        self.version += 1

    def files(self) -> List[str]:
        """Every visible file, sorted."""
        dirs = self.by_dir()
        if self._files is None:
            self._files = sorted(_join(d, n) for d, names in dirs.items() for n in names)
        return self._files

    def by_dir(self) -> Dict[str, List[str]]:
        """Visible file names grouped by their directory ("" for the top)."""
        if not self._built:
            self._full()
        elif self._stale:
            self._refresh()
        self._stale = False
        if self._dirs is None:
            self._dirs = {}
            for d, names in self._raw.items():
                kept = [
                    n
                    for n in names
                    if _join(d, n) not in self._ignored
                    and not jail.is_protected_path(_join(d, n))
                    and not jail.operator_protected(_join(d, n))
                ]
                if kept:
                    self._dirs[d] = kept
        return self._dirs

    # -- building -------------------------------------------------------------------------

    def _full(self) -> None:
        self._raw, self._subdirs, self._dstat = {}, {}, {}
        self._walk("", os.dup(self._root_fd))
        self._ignored = self._git_ignored()
        self._ignore_files = self._stat_ignore_files()
        self._built = True
        self._dirs = None
        self._files = None

    def _walk(self, rel: str, dfd: int) -> List[str]:
        """Reads directory ``rel`` (descriptor ``dfd``, closed here) and its whole subtree."""
        return self._read_dir(rel, dfd, set(), set())

    def _read_dir(
        self, rel: str, dfd: int, old_files: set[str], old_subdirs: set[str]
    ) -> List[str]:
        """Reads directory ``rel`` (``dfd`` is closed here): records its files, drops
        subdirectories that are gone, walks new ones. Returns the files not known before."""
        found: List[str] = []
        try:
            st = os.fstat(dfd)
            self._dstat[rel] = (st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
            files, subdirs = _scan(dfd)
            self._raw[rel] = files
            self._subdirs[rel] = subdirs
            found.extend(_join(rel, n) for n in files if n not in old_files)
            for name in old_subdirs - set(subdirs):
                self._drop(_join(rel, name))
            for name in subdirs:
                if name in old_subdirs:
                    continue
                try:
                    sub = os.open(name, jail._DIR_FLAGS, dir_fd=dfd)  # noqa: SLF001
                except OSError:
                    continue
                found.extend(self._walk(_join(rel, name), sub))
        finally:
            os.close(dfd)
        return found

    def _drop(self, rel: str) -> None:
        for name in self._subdirs.pop(rel, []):
            self._drop(_join(rel, name))
        self._raw.pop(rel, None)
        self._dstat.pop(rel, None)

    def _refresh(self) -> None:
        if self._stat_ignore_files() != self._ignore_files:
            self._full()
            return
        new_files: List[str] = []
        changed = False
        for rel in sorted(self._dstat, key=lambda d: (d.count("/"), d)):
            if rel in self._dstat and self._stat_dir(rel) != self._dstat[rel]:
                changed = True
                new_files.extend(self._reread(rel))
        if changed:
            if new_files:
                self._ignored |= self._git_ignored(new_files)
            self._dirs = None
            self._files = None

    def _reread(self, rel: str) -> List[str]:
        """Reads a changed directory again: its files, new subtrees walked, gone ones dropped."""
        try:
            dfd = jail.open_dir(self._root_fd, rel.split("/") if rel else [])
        except jail.PathDeniedError:
            self._drop(rel)
            return []
        return self._read_dir(
            rel, dfd, set(self._raw.get(rel, [])), set(self._subdirs.get(rel, []))
        )

    def _stat_dir(self, rel: str) -> Optional[DirStat]:
        try:
            st = os.stat(rel or ".", dir_fd=self._root_fd, follow_symlinks=False)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_ctime_ns, st.st_ino)

    def _stat_ignore_files(self) -> Dict[str, DirStat]:
        out: Dict[str, DirStat] = {}
        for d, names in self._raw.items():
            if ".gitignore" in names:
                path = _join(d, ".gitignore")
                st = self._stat_dir(path)
                if st is not None:
                    out[path] = st
        return out

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

    def _git(self, args: List[str], stdin: bytes = b"") -> bytes:
        import subprocess  # imported on first use: a faster start

        if not os.path.isdir(self._git_dir):
            procs.run(
                ["git", *_GIT_OPTS, "init", "-q", "--bare", self._git_dir],
                env=_GIT_ENV,
                stdin=subprocess.DEVNULL,
                check=True,
                timeout=30,
            )
        return procs.run(
            [
                "git",
                *_GIT_OPTS,
                f"--git-dir={self._git_dir}",
                f"--work-tree={self._workspace}",
                *args,
            ],
            env=_GIT_ENV,
            cwd="/",
            input=stdin,
            check=False,
            timeout=120,
        ).stdout

    def _git_ignored(self, paths: Optional[List[str]] = None) -> set[str]:
        """What git would ignore: everything (a full build), or among ``paths``."""
        import subprocess  # imported on first use: a faster start

        try:
            if paths is None:
                out = self._git(["ls-files", "-z", "--others", "--ignored", "--exclude-standard"])
            else:
                data = "\0".join(paths).encode("utf-8", "surrogateescape") + b"\0"
                out = self._git(["check-ignore", "-z", "--stdin", "--no-index"], data)
        except (OSError, subprocess.SubprocessError):
            self.git_filtered = False
            return set()
        self.git_filtered = True
        return {p for p in out.decode("utf-8", "surrogateescape").split("\0") if p}


def _join(directory: str, name: str) -> str:
    return f"{directory}/{name}" if directory else name


def _scan(dfd: int) -> Tuple[List[str], List[str]]:
    """A directory's regular files and real subdirectories, protected names left out."""
    files: List[str] = []
    subdirs: List[str] = []
    with os.scandir(dfd) as it:
        for entry in it:
            name = entry.name
            if jail.is_protected_component(name) or name.startswith(".patchbox-tmp-"):
                continue
            if entry.is_file(follow_symlinks=False):
                files.append(name)
            elif entry.is_dir(follow_symlinks=False):
                subdirs.append(name)
    files.sort()
    subdirs.sort()
    return files, subdirs
