"""The workspace file index: which files the model may see, per workspace version.

Built on first use by one walk that never follows a link and skips protected names, then
filtered by what git would ignore (asked as :mod:`patchbox_agent.ignore` says, so that
nothing a check can write decides it). Every write through the agent and every process run
bumps the version and drops the index, so a listing or a cached search is never older than
the workspace.

- The ``.gitignore`` files are read here, through the workspace's descriptors. Change
  detection (:meth:`FileIndex.snapshot`) uses them as they were when the baseline was
  marked, plus those in folders made since (a tool's cache folder that ignores itself, as
  pytest's does), so a ``.gitignore`` written later in a folder of the baseline hides
  nothing from it and is itself a change; and a file it reported once stays visible. The
  model's listing follows the live files.
- Nothing is hidden for its name alone: the agent's temp files (``.patchbox-tmp-``) exist
  only while it holds the index lock, so one seen by a walk is someone else's.
"""

from __future__ import annotations

import os

from . import jail
from .ignore import ignore_git_dir, ignored, patterns

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Tuple

    DirStat = Tuple[int, int, int]

MAX_IGNORE_FILE = 1024 * 1024
"""Bytes read of one ``.gitignore``; rules past it are dropped (files stay visible)."""
MAX_PATHSPECS = 256
"""New files checked by pathspec in one refresh; more and the whole tree is asked."""

_NONE: set[str] = set()


class FileIndex:
    """Visible files per directory, kept honest across versions without rescanning the tree.

    After a possible change (a process ran, a patch applied) every known directory is
    stat'ed: any entry added, removed or renamed changes its directory's ctime, which no
    unprivileged process can set back, so only those directories are read again (and new
    subdirectories walked). New files go through git's ignore check; a changed set of
    ``.gitignore`` files makes the rules be read again and asked about the whole tree.
    """

    def __init__(self, root_fd: int, workspace: str) -> None:
        self._root_fd = root_fd
        self._workspace = workspace
        self.version = 0
        self.git_filtered = False
        # Made now, before any process of the repository can run.
        self._git_dir = ignore_git_dir()
        self._raw: Dict[str, List[str]] = {}
        self._subdirs: Dict[str, List[str]] = {}
        self._dstat: Dict[str, DirStat] = {}
        self._rules: Dict[str, bytes] = {}
        self._base_rules: Optional[Dict[str, bytes]] = None
        self._base_dirs: set[str] = set()
        self._ignored: set[str] = set()
        """Ignored by the live rules (the model's view)."""
        self._ignored_base: set[str] = set()
        """Ignored by the baseline's rules (change detection)."""
        self._shown: set[str] = set()
        """Every path a snapshot reported since the baseline: no rule hides it again."""
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
        self._update()
        if self._dirs is None:
            self._dirs = self._visible(self._ignored)
        return self._dirs

    def mark_base(self) -> Dict[str, Tuple[int, int, int, int, int]]:
        """The workspace is the baseline: its ``.gitignore`` files become the rules of change
        detection from now on. Returns :meth:`snapshot`."""
        self._update()
        if self._base_rules is None:
            self._base_rules = dict(self._rules)
            self._base_dirs = set(self._raw)
            self._ignored_base = set(self._ignored)
        return self.snapshot()

    def snapshot(self) -> Dict[str, Tuple[int, int, int, int, int]]:
        """Metadata of every file change detection sees: (mode, size, mtime, ctime, inode).
        A change of content always changes ctime, which no unprivileged process can set
        back. Once the baseline is marked, only its ``.gitignore`` files (and those of
        folders made since) hide a file here, whatever the listing shows, and a file once
        reported here is never hidden again while it exists (a rule written later cannot
        make a known file look removed)."""
        self._update()
        based = self._base_rules is not None
        ignored = self._ignored_base if based else self._ignored
        out: Dict[str, Tuple[int, int, int, int, int]] = {}
        for directory, names in self._visible(ignored, self._shown).items():
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
        if based:
            self._shown.update(out)
        return out

    def _visible(self, ignored: set[str], shown: set[str] = _NONE) -> Dict[str, List[str]]:
        """Files neither ``ignored`` (unless ``shown`` before) nor protected."""
        out: Dict[str, List[str]] = {}
        extra = jail.operator_protected
        for d, names in self._raw.items():
            protected = jail.protected_in(d)
            prefix = f"{d}/" if d else ""
            kept = []
            for n in names:
                path = prefix + n
                if path in ignored and path not in shown:
                    continue
                if not protected(n) and not extra(path):
                    kept.append(n)
            if kept:
                out[d] = kept
        return out

    # -- building -------------------------------------------------------------------------

    def _update(self) -> None:
        if not self._built:
            self._full()
        elif self._stale:
            self._refresh()
        self._stale = False

    def _full(self) -> None:
        self._raw, self._subdirs, self._dstat = {}, {}, {}
        self._walk("", os.dup(self._root_fd))
        self._read_rules()
        self._built = True

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
                    sub = jail.open_subdir(dfd, name)  # never a link, under gVisor too
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
        new_files: List[str] = []
        changed = False
        for rel in sorted(self._dstat, key=lambda d: (d.count("/"), d)):
            if rel in self._dstat and self._stat_dir(rel) != self._dstat[rel]:
                changed = True
                new_files.extend(self._reread(rel))
        # After the re-reads, so a .gitignore new in a known folder counts too.
        if self._stat_ignore_files() != self._ignore_files or len(new_files) > MAX_PATHSPECS:
            self._read_rules()
        elif new_files:
            live, base = self._pattern_sets()
            found = self._git_ignored(live, new_files)
            self._ignored |= found
            if base is not None:
                self._ignored_base |= found if base == live else self._git_ignored(base, new_files)
        if changed:
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

    # -- ignore rules ---------------------------------------------------------------------

    def _read_rules(self) -> None:
        """Reads every ``.gitignore`` of the tree (each stat'ed through the descriptor it is
        read from) and asks git what the rules ignore in the whole tree."""
        rules: Dict[str, bytes] = {}
        stats: Dict[str, DirStat] = {}
        for d, names in self._raw.items():
            if ".gitignore" not in names:
                continue
            path = _join(d, ".gitignore")
            try:
                fd = jail.open_file(self._root_fd, path)
            except jail.PathDeniedError:
                continue
            try:
                st = os.fstat(fd)
                stats[path] = (st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
                data = os.read(fd, MAX_IGNORE_FILE)
            except OSError:
                continue
            finally:
                os.close(fd)
            # A folder name git's exclude file cannot hold: its rules are dropped.
            if "\n" not in d and "\r" not in d:
                rules[d] = data
        self._rules = rules
        self._ignore_files = stats
        live, base = self._pattern_sets()
        self._ignored = self._git_ignored(live)
        if base is not None:
            self._ignored_base = set(self._ignored) if base == live else self._git_ignored(base)
        self._dirs = None
        self._files = None

    def _pattern_sets(self) -> Tuple[bytes, Optional[bytes]]:
        """The exclude files of the live rules, and (once the baseline is marked) of the
        baseline's rules with those of folders made since."""
        live = patterns(self._rules)
        if self._base_rules is None:
            return live, None
        made_since = {d: data for d, data in self._rules.items() if d not in self._base_dirs}
        return live, patterns({**self._base_rules, **made_since})

    def _git_ignored(self, excludes: bytes, paths: Optional[List[str]] = None) -> set[str]:
        """What ``excludes`` ignore: in the whole tree, or among ``paths``."""
        found, self.git_filtered = ignored(self._git_dir, self._workspace, excludes, paths)
        return found


def snapshot_changes(before: Dict[str, Any], after: Dict[str, Any], limit: int) -> Dict[str, Any]:
    """Visible files added, removed or modified from one :meth:`FileIndex.snapshot` to
    another: sorted lists, each cut at ``limit`` (names that are not UTF-8 escaped), and
    ``count``, the number of changed files in all."""
    added = jail.reported(sorted(after.keys() - before.keys()))
    removed = jail.reported(sorted(before.keys() - after.keys()))
    changed = (p for p, meta in after.items() if p in before and before[p] != meta)
    modified = jail.reported(sorted(changed))
    return {
        "added": added[:limit],
        "removed": removed[:limit],
        "modified": modified[:limit],
        "count": len(added) + len(removed) + len(modified),
    }


def _join(directory: str, name: str) -> str:
    return f"{directory}/{name}" if directory else name


def _scan(dfd: int) -> Tuple[List[str], List[str]]:
    """A directory's regular files and real subdirectories, protected names left out.

    Names like the agent's temp files (``.patchbox-tmp-``) are NOT left out: the agent's own
    exist only while it holds the index lock, so one seen here was left by someone else and
    is a change like any other."""
    files: List[str] = []
    subdirs: List[str] = []
    with os.scandir(dfd) as it:
        for entry in it:
            name = entry.name
            if jail.is_protected_component(name):
                continue
            if entry.is_file(follow_symlinks=False):
                files.append(name)
            elif entry.is_dir(follow_symlinks=False):
                subdirs.append(name)
    files.sort()
    subdirs.sort()
    return files, subdirs
