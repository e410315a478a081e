"""A service job's repository, held to the folder it was resolved to.

A tenant of ``patchbox serve`` names its repository by a path inside its ``repo_roots``,
and may write there: between the submit and the job's start, or between the decision and an
apply, it could put a symbolic link where its folder was, or point its git data elsewhere.
So the path is resolved once and what it resolved to is kept:

- :func:`pin_repo` walks the path's components from the root, each folder opened relative to
  the one before with ``O_NOFOLLOW | O_DIRECTORY``: a symbolic link below the root, a ``..``
  or a path outside every root is refused (``REPO_NOT_ALLOWED``). The roots themselves are
  the operator's and may be links (their real paths are taken once). The result,
  :class:`RepoPin`, is the real path and the top folder's device and inode.
- :meth:`RepoPin.open` walks again and compares the identity: a folder moved, replaced or
  reached through a link is refused. The descriptor it returns is the top itself; writes
  relative to it (:class:`controller.changes.worktree.WorkTree`) cannot be redirected.
- :meth:`RepoPin.verify` adds the git data: the git dir a ``.git`` file names, a linked
  worktree's ``commondir``, the ``objects/info/alternates`` chain, every symbolic link in
  those folders, and the files the repository's own ``core.excludesFile`` and
  ``core.attributesFile`` name must all resolve inside the tenant's roots (and outside the
  service's own folder), checked before anything of them is read.

The CLI, the API and MCP run on the user's own repository, with no pin: nothing changes
there.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from controller.errors import NotARepositoryError, RepoNotAllowedError
from controller.repo.layout import (
    CONFIGURED_FILES,
    GITFILE_LIMIT,
    RepoLayout,
    common_dir_of,
    config_includes,
    config_value,
    gitfile_target,
    named_file,
    read_config,
)

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
MAX_INCLUDE_DEPTH = 10
"""How deep git follows a config's includes (its own limit); a deeper chain is refused."""
MAX_ALTERNATES_DEPTH = 5
"""How deep git follows alternates of alternates; a deeper chain is refused."""
ALTERNATES_LIMIT = 1 << 20
"""The largest ``objects/info/alternates`` file that is checked (a larger one is refused)."""


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def _parts(path: str) -> list[str]:
    return [p for p in path.split("/") if p not in {"", "."}]


@dataclass(frozen=True)
class Confinement:
    """Where one tenant's repositories and their git data may be: inside one of its roots,
    never inside an excluded folder (the service's own ``data_dir``)."""

    tenant: str
    roots: tuple[tuple[str, str], ...]
    """Each root as the operator wrote it (normalised) and as its real path."""
    excluded: tuple[str, ...] = ()

    @classmethod
    def of(cls, tenant: str, roots: Sequence[str], excluded: Sequence[str] = ()) -> Confinement:
        """The roots and excluded folders, their real paths taken now."""
        return cls(
            tenant,
            tuple((os.path.normpath(r), os.path.realpath(r)) for r in roots),
            tuple(os.path.realpath(e) for e in excluded),
        )

    def excludes(self, real: str) -> bool:
        return any(_inside(real, e) for e in self.excluded)

    def holds(self, real: str) -> bool:
        """``real`` (a real path) is inside a root and outside every excluded folder."""
        return not self.excludes(real) and any(_inside(real, root) for _, root in self.roots)

    def outside(self, what: str) -> RepoNotAllowedError:
        return RepoNotAllowedError(f"{what} is outside the repo_roots of tenant {self.tenant!r}")


class PinRecord(BaseModel):
    """What the service keeps of a pin with a queued job (the path is the job's repo)."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    root: str
    dev: int
    ino: int


@dataclass(frozen=True)
class RepoPin:
    """A repository resolved once: its real ``path`` below the real ``root``, and the
    identity (``dev``, ``ino``) of its top folder."""

    path: str
    root: str
    dev: int
    ino: int
    confinement: Confinement

    def record(self) -> PinRecord:
        return PinRecord(root=self.root, dev=self.dev, ino=self.ino)

    @classmethod
    def of_record(cls, path: str, record: PinRecord, confinement: Confinement) -> RepoPin:
        return cls(path, record.root, record.dev, record.ino, confinement)

    # -- the top folder -------------------------------------------------------------------

    def _walk(self) -> int:
        """The top, opened by walking from the root without following any link."""
        if not any(root == self.root for _, root in self.confinement.roots):
            raise self.confinement.outside(self.path)
        if self.confinement.excludes(self.path):
            msg = f"{self.path}: the repository is in the service's own folder"
            raise RepoNotAllowedError(msg + " (submit a bundle instead)")
        try:
            fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            raise NotARepositoryError(
                f"{self.path} does not exist (its root cannot be opened)"
            ) from exc
        parts = _parts(os.path.relpath(self.path, self.root))
        for depth, name in enumerate(parts):
            try:
                below = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                error = self._walk_error(fd, name, "/".join(parts[: depth + 1]), exc)
                os.close(fd)
                raise error from None
            os.close(fd)
            fd = below
        return fd

    def _walk_error(self, parent: int, name: str, sub: str, exc: OSError) -> Exception:
        try:
            mode = os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode
        except FileNotFoundError:
            return NotARepositoryError(f"{self.path} does not exist")
        except OSError:
            mode = 0
        if stat.S_ISLNK(mode):
            msg = (
                f"{self.path} goes through a symbolic link below its repository root ({sub}): "
                "a service job's repository is named by its real path"
            )
            return RepoNotAllowedError(msg)
        if mode and not stat.S_ISDIR(mode):
            return NotARepositoryError(f"{self.path} is not a folder ({sub} is not one)")
        return RepoNotAllowedError(f"{self.path} cannot be opened ({exc.strerror})")

    def open(self) -> int:
        """The top folder's descriptor (the caller closes it), after walking from the root
        again: ``REPO_NOT_ALLOWED`` when a link is on the way or the folder there is not the
        one pinned (moved or replaced), ``NOT_A_REPOSITORY`` when it is gone."""
        fd = self._walk()
        info = os.fstat(fd)
        if (info.st_dev, info.st_ino) != (self.dev, self.ino):
            os.close(fd)
            msg = (
                f"{self.path} is no longer the folder the job was submitted on (it was moved "
                "or replaced); submit the job again"
            )
            raise RepoNotAllowedError(msg)
        return fd

    def open_top(self, top: Path) -> int:
        """:meth:`open`, for a caller that names the top by path: it must be the pin's."""
        if os.path.normpath(top) != self.path:
            msg = f"{top} is not the repository {self.path} the job was submitted on"
            raise RepoNotAllowedError(msg)
        return self.open()

    # -- the top and its git data ---------------------------------------------------------

    def verify(self) -> None:
        """The top is the folder pinned and its git data is inside the tenant's roots."""
        fd = self.open()
        try:
            self._check_git_data(fd)
        finally:
            os.close(fd)

    def check_roots(self) -> None:
        """For an action that reads and writes nothing of the repository (a discard): its
        path still leads, with no link, to a folder inside the tenant's roots whose git data
        is inside them too, or to nothing. The folder may be another one (cloned again)."""
        try:
            fd = self._walk()
        except NotARepositoryError:
            return
        try:
            self._check_git_data(fd)
        finally:
            os.close(fd)

    def confirm(self, repo: str | None) -> None:
        """After the repository was read (``repo``: the top the read resolved; None when
        the read failed): it was the folder pinned, and still is."""
        self.verify()
        if repo is not None and repo != self.path:
            msg = f"{self.path} was replaced while the job read it; submit the job again"
            raise RepoNotAllowedError(msg)

    def _elsewhere(self, what: str) -> RepoNotAllowedError:
        msg = (
            f"{self.path} keeps git data outside the repo_roots of tenant "
            f"{self.confinement.tenant!r} ({what}); a service job reads git data only "
            "inside them"
        )
        return RepoNotAllowedError(msg)

    def _held(self, real: str, what: str) -> None:
        if not self.confinement.holds(real):
            raise self._elsewhere(what)

    def _check_git_data(self, top: int) -> None:
        try:
            mode = os.stat(".git", dir_fd=top, follow_symlinks=False).st_mode
        except FileNotFoundError:
            return  # not a work tree: the job ends NOT_A_REPOSITORY
        if stat.S_ISDIR(mode):
            git_dir = str(Path(self.path) / ".git")
        elif stat.S_ISREG(mode):
            git_dir = str(gitfile_target(_read_at(top, ".git", GITFILE_LIMIT), Path(self.path)))
            self._held(git_dir, "the git dir its .git file names")
        else:
            return  # a link or something odd: the job refuses it (NOT_A_REPOSITORY)
        self._no_link_out(git_dir, "the git dir")
        try:
            named = common_dir_of(Path(git_dir))
        except (OSError, UnicodeDecodeError) as exc:
            raise NotARepositoryError("the worktree's commondir cannot be read") from exc
        common = git_dir if named is None else str(named)
        if common != git_dir:
            self._held(common, "the common git dir its commondir names")
            self._no_link_out(common, "the common git dir")
        self._alternates(os.path.realpath(Path(common) / "objects"), set())
        layout = RepoLayout(
            top=Path(self.path),
            git_dir=Path(git_dir),
            common_dir=Path(common),
            kind="repository" if named is None else "linked-worktree",
        )
        for key in CONFIGURED_FILES:
            value = read_config(layout, key)
            if value:
                self._held(os.path.realpath(named_file(layout, value)), f"its {key}")
        for config in (Path(common) / "config", Path(git_dir) / "config.worktree"):
            self._includes(layout, config, set())

    def _includes(self, layout: RepoLayout, config: Path, seen: set[str], depth: int = 0) -> None:
        """Every file ``config`` includes (any condition taken as met), and those files'
        includes, inside the roots; their file settings too."""
        for written in config_includes(config):
            path = Path(written).expanduser()
            if not path.is_absolute():
                path = config.parent / path
            target = os.path.realpath(path)
            self._held(target, f"a file its git config includes ({written[:200]!r})")
            if target in seen or not Path(target).is_file():
                continue
            if depth >= MAX_INCLUDE_DEPTH:
                raise self._elsewhere("its git config: includes nested too deep")
            seen.add(target)
            for key in CONFIGURED_FILES:
                value = config_value(Path(target), key)
                if value:
                    self._held(os.path.realpath(named_file(layout, value)), f"its {key}")
            self._includes(layout, Path(target), seen, depth + 1)

    def _no_link_out(self, folder: str, what: str) -> None:
        """Every symbolic link under ``folder`` (none followed) resolves inside the roots."""
        stack = [folder]
        while stack:
            current = stack.pop()
            try:
                entries = list(os.scandir(current))
            except OSError:
                continue
            for entry in entries:
                if entry.is_symlink():
                    if not self.confinement.holds(os.path.realpath(entry.path)):
                        rel = os.path.relpath(entry.path, folder)
                        raise self._elsewhere(f"a symbolic link in {what}: {rel}")
                elif entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)

    def _alternates(self, objects: str, seen: set[str], depth: int = 0) -> None:
        """The object stores ``objects`` borrows, and theirs, all inside the roots."""
        seen.add(objects)
        try:
            data = _read_following(Path(objects) / "info" / "alternates")
        except FileNotFoundError:
            return
        except OSError as exc:
            raise self._elsewhere(f"objects/info/alternates: {exc.strerror}") from exc
        for raw in data.splitlines():
            line = raw.decode("utf-8", "surrogateescape").strip()
            if not line or line.startswith("#"):
                continue
            if line.startswith('"'):
                raise self._elsewhere("objects/info/alternates: a quoted entry")
            target = os.path.realpath(Path(objects) / line)
            self._held(target, "objects/info/alternates")
            if target in seen:
                continue
            if depth >= MAX_ALTERNATES_DEPTH:
                raise self._elsewhere("objects/info/alternates: a chain too deep")
            self._no_link_out(target, "an alternate object store")
            self._alternates(target, seen, depth + 1)


def _read_at(folder: int, name: str, limit: int) -> bytes:
    """The first ``limit`` bytes of the regular file ``name`` in ``folder`` (no link)."""
    try:
        fd = os.open(name, _FILE_FLAGS, dir_fd=folder)
    except OSError as exc:
        raise NotARepositoryError(f"{name} cannot be read") from exc
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotARepositoryError(f"{name} is not a file")
        return os.read(fd, limit)
    finally:
        os.close(fd)


def _read_following(path: Path) -> bytes:
    """A whole regular file as git reads it (links followed: the caller checked them)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > ALTERNATES_LIMIT:
            raise OSError(0, "not a regular file of at most 1 MiB")
        return os.read(fd, ALTERNATES_LIMIT)
    finally:
        os.close(fd)


def pin_repo(confinement: Confinement, requested: str) -> RepoPin:
    """The repository at the absolute path ``requested``, resolved and pinned (see the
    module docstring). The path must be spelled inside a root, as the operator wrote it or
    as its real path."""
    parts = _parts(requested)
    if ".." in parts:
        msg = f"{requested} has a '..' component: name the repository by its real path"
        raise RepoNotAllowedError(msg)
    found: tuple[int, str, list[str]] | None = None
    for named, real in confinement.roots:
        for spelling in (named, real):
            prefix = _parts(spelling)
            if parts[: len(prefix)] == prefix and (found is None or len(prefix) > found[0]):
                found = (len(prefix), real, parts[len(prefix) :])
    if found is None:
        raise confinement.outside("the repository")
    _, root, rel = found
    pin = RepoPin(str(Path(root, *rel)), root, 0, 0, confinement)
    fd = pin._walk()  # noqa: SLF001 - the pin's own walk, before it has an identity
    try:
        info = os.fstat(fd)
    finally:
        os.close(fd)
    return replace(pin, dev=info.st_dev, ino=info.st_ino)
