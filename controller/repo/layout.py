"""The user's repository, read and never written: where it is, and whether a job may start
from it.

:func:`locate` finds the git dir of a work tree by reading files (``.git`` folder, a
``gitdir:`` file, a linked worktree's ``commondir``); :func:`resolve_head` reads refs the
same way. Neither runs git in the user's repository. The health answer itself comes from
:mod:`controller.repo.baseline`, which looks at the work tree through a private git dir.
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from controller.errors import BareRepositoryError, ErrorCode, NotARepositoryError, RepoBlockedError
from controller.paths import patchbox_home
from controller.reasons import Reason
from controller.repo.git import GitContext, run_git

_OID = re.compile(rb"^([0-9a-f]{40}|[0-9a-f]{64})$")
_MAX_SYMREF_DEPTH = 5


class RepoLayout(BaseModel):
    """Where a work tree keeps its git data. ``git_dir`` holds HEAD, the index and the state
    of operations in progress; ``common_dir`` holds objects, refs and config (the same
    folder except in a linked worktree)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    top: Path
    git_dir: Path
    common_dir: Path
    kind: Literal["repository", "gitdir-file", "linked-worktree"]


GITFILE_LIMIT = 4096
"""The bytes of a ``.git`` file that are read (its ``gitdir:`` line)."""


def gitfile_target(data: bytes, top: Path) -> Path:
    """The git dir a ``.git`` file of the work tree ``top`` names, as a real path
    (``NotARepositoryError`` for a file that is not a ``gitdir:`` line)."""
    try:
        text = data[:GITFILE_LIMIT].decode("utf-8").strip()
    except UnicodeDecodeError as exc:
        raise NotARepositoryError(".git cannot be read as a gitdir file") from exc
    if not text.startswith("gitdir:"):
        raise NotARepositoryError(".git is a file without a 'gitdir:' line")
    target = Path(text[len("gitdir:") :].strip())
    return (top / target).resolve() if not target.is_absolute() else target.resolve()


def _read_gitfile(dotgit: Path) -> Path:
    try:
        data = dotgit.read_bytes()[:GITFILE_LIMIT]
    except OSError as exc:
        raise NotARepositoryError(f"{dotgit.name} cannot be read as a gitdir file") from exc
    return gitfile_target(data, dotgit.parent)


def _looks_like_git_dir(path: Path) -> bool:
    return (path / "HEAD").is_file() and (path / "objects").is_dir()


def _git_dir_of(
    top: Path, path: Path
) -> tuple[Path, Literal["repository", "gitdir-file", "linked-worktree"]]:
    dotgit = top / ".git"
    if dotgit.is_symlink():
        raise NotARepositoryError(".git is a symlink; patchbox does not follow it")
    if dotgit.is_dir():
        return dotgit, "repository"
    if dotgit.is_file():
        return _read_gitfile(dotgit), "gitdir-file"
    if _looks_like_git_dir(top):
        raise BareRepositoryError(f"{path} is a bare repository: it has no work tree")
    for parent in top.parents:
        if (parent / ".git").exists():
            raise RepoBlockedError(
                f"{path} is inside the work tree at {parent}; give its top level",
                [Reason(code="NOT_TOP_LEVEL", detail="a folder inside a work tree")],
                code=ErrorCode.NOT_A_REPOSITORY,
            )
    raise NotARepositoryError(f"{path} is not a git repository")


def locate(path: Path) -> RepoLayout:
    """The layout of the work tree whose top level is ``path``.

    Raises :class:`NotARepositoryError` for a path that is not a work tree (a bare
    repository included) and :class:`RepoBlockedError` (``NOT_TOP_LEVEL``) for a folder
    inside one."""
    try:
        top = path.resolve(strict=True)
    except (OSError, RuntimeError) as exc:
        raise NotARepositoryError(f"{path} does not exist") from exc
    if not top.is_dir():
        raise NotARepositoryError(f"{path} is not a folder")
    git_dir, kind = _git_dir_of(top, path)
    common_dir = git_dir
    named = common_dir_of(git_dir)
    if named is not None:
        # A linked worktree's own git dir has HEAD and index; objects are in the common dir.
        common_dir = named
        kind = "linked-worktree"
        if not (common_dir / "objects").is_dir():
            raise NotARepositoryError("the worktree's common git dir is missing")
    if not (git_dir / "HEAD").is_file() or not (common_dir / "objects").is_dir():
        raise NotARepositoryError(f"{git_dir} is not a git dir")
    return RepoLayout(top=top, git_dir=git_dir, common_dir=common_dir, kind=kind)


def enclosing_top(start: Path) -> Path:
    """The top folder of the work tree ``start`` is in (``start`` itself, or the nearest
    folder above it holding ``.git``), as git finds the repository of the current folder.
    :class:`NotARepositoryError` when no folder from ``start`` up holds one; what is found
    is a candidate only: :func:`locate` says whether it is a work tree."""
    try:
        here = start.resolve(strict=True)
    except (OSError, RuntimeError) as exc:
        raise NotARepositoryError(f"{start} does not exist") from exc
    for folder in (here, *here.parents):
        with contextlib.suppress(OSError):
            os.lstat(folder / ".git")
            return folder
    msg = f"{here} is not inside a git work tree (no folder from it up holds .git)"
    raise NotARepositoryError(msg)


def common_dir_of(git_dir: Path) -> Path | None:
    """The common git dir a linked worktree's ``commondir`` file names, as a real path;
    None for a git dir without one."""
    commondir_file = git_dir / "commondir"
    if not commondir_file.is_file():
        return None
    rel = Path(commondir_file.read_text("utf-8").strip())
    return (git_dir / rel).resolve() if not rel.is_absolute() else rel.resolve()


def _outside() -> GitContext:
    """Config files are parsed as data from the controller's own folder, never from inside
    the user's repository (whose own configuration would then be read to set git up)."""
    home = patchbox_home()
    return GitContext(cwd=home, home=home)


def _config_value(config: Path, key: str, *, as_bool: bool) -> str | None:
    if not config.is_file():
        return None
    typed = ["--type=bool"] if as_bool else []
    args = ["config", "--file", str(config), "--no-includes", *typed, "--get", key]
    proc = run_git(_outside(), *args, check=False)
    if proc.returncode != 0:
        return None
    return proc.stdout.decode("utf-8", "replace").strip()


def config_value(config: Path, key: str) -> str | None:
    """One value of the config file ``config`` itself (no includes), or None."""
    return _config_value(config, key, as_bool=False)


def config_includes(config: Path) -> list[str]:
    """The files ``config`` includes (``include.path`` and every ``includeIf.*.path``, each
    condition taken as met), as written, read as data."""
    if not config.is_file():
        return []
    args = ["config", "--file", str(config), "--no-includes", "--null", "--get-regexp"]
    proc = run_git(_outside(), *args, r"^include(if\..*)?\.path$", check=False)
    if proc.returncode != 0:
        return []
    found: list[str] = []
    for item in proc.stdout.split(b"\0"):
        _key, sep, value = item.partition(b"\n")
        if sep:
            found.append(value.decode("utf-8", "surrogateescape"))
    return found


def read_config(layout: RepoLayout, key: str, *, as_bool: bool = False) -> str | None:
    """One value of the repository's own config, read as data (no includes, nothing
    executed), or None. As in git, ``config.worktree`` of the work tree's git dir wins when
    ``extensions.worktreeConfig`` is on (``git sparse-checkout`` writes there). With
    ``as_bool`` the value is ``true`` or ``false``."""
    common = layout.common_dir / "config"
    value = _config_value(common, key, as_bool=as_bool)
    if _config_value(common, "extensions.worktreeConfig", as_bool=True) == "true":
        own = _config_value(layout.git_dir / "config.worktree", key, as_bool=as_bool)
        if own is not None:
            value = own
    return value


def _packed_ref(common_dir: Path, name: str) -> bytes | None:
    try:
        data = (common_dir / "packed-refs").read_bytes()
    except OSError:
        return None
    suffix = b" " + name.encode()
    for line in data.splitlines():
        if line.endswith(suffix) and not line.startswith((b"#", b"^")):
            return line.split(b" ", 1)[0]
    return None


def _lookup_ref(layout: RepoLayout, name: str) -> bytes | None:
    for base in (layout.git_dir, layout.common_dir):
        try:
            return (base / name).read_bytes().strip()
        except OSError:
            continue
    return _packed_ref(layout.common_dir, name)


def resolve_head(layout: RepoLayout) -> tuple[str | None, Reason | None]:
    """HEAD's object id, read from the files of the git dir, or the reason it has none.

    Repositories whose refs are not plain files (reftable) are asked through git with the
    hardened environment."""
    try:
        value = (layout.git_dir / "HEAD").read_bytes().strip()
    except OSError:
        return None, Reason(code="HEAD_UNRESOLVABLE", detail="HEAD cannot be read")
    for _ in range(_MAX_SYMREF_DEPTH):
        if _OID.match(value):
            return value.decode(), None
        name = value[5:].strip().decode("utf-8", "replace")
        if name == "refs/heads/.invalid":
            return _head_by_git(layout)
        if not value.startswith(b"ref: ") or ".." in name or not name.startswith("refs/"):
            return None, Reason(code="HEAD_UNRESOLVABLE", detail="HEAD is not a valid ref or id")
        found = _lookup_ref(layout, name)
        if found is None:
            return None, Reason(code="HEAD_UNBORN", detail=f"{name} has no commit yet")
        value = found
    return None, Reason(code="HEAD_UNRESOLVABLE", detail="HEAD is a chain of symbolic refs")


def _head_by_git(layout: RepoLayout) -> tuple[str | None, Reason | None]:
    home = patchbox_home()
    proc = run_git(
        GitContext(cwd=home, git_dir=layout.git_dir, home=home),
        "rev-parse",
        "--verify",
        "-q",
        "HEAD",
        check=False,
    )
    out = proc.stdout.strip()
    if proc.returncode != 0 or not _OID.match(out):
        return None, Reason(code="HEAD_UNBORN", detail="HEAD has no commit yet")
    return out.decode(), None


def operations_in_progress(layout: RepoLayout) -> list[Reason]:
    """Merge, rebase, am, cherry-pick, revert and bisect in progress, and an index lock."""
    g = layout.git_dir
    found: list[Reason] = []
    if (g / "MERGE_HEAD").exists():
        found.append(Reason(code="MERGE_IN_PROGRESS", detail="a merge is in progress"))
    if (g / "rebase-merge").is_dir():
        found.append(Reason(code="REBASE_IN_PROGRESS", detail="an interactive or merge rebase"))
    if (g / "rebase-apply").is_dir():
        if (g / "rebase-apply" / "applying").exists():
            found.append(Reason(code="AM_IN_PROGRESS", detail="git am is in progress"))
        else:
            found.append(Reason(code="REBASE_IN_PROGRESS", detail="an apply-based rebase"))
    if (g / "CHERRY_PICK_HEAD").exists():
        found.append(Reason(code="CHERRY_PICK_IN_PROGRESS", detail="a cherry-pick"))
    if (g / "REVERT_HEAD").exists():
        found.append(Reason(code="REVERT_IN_PROGRESS", detail="a revert"))
    if (g / "BISECT_LOG").exists() or (layout.common_dir / "BISECT_LOG").exists():
        found.append(Reason(code="BISECT_IN_PROGRESS", detail="a bisect"))
    if (g / "index.lock").exists():
        found.append(Reason(code="INDEX_LOCKED", detail="index.lock exists: git is running"))
    return found


def is_sparse(layout: RepoLayout) -> bool:
    return read_config(layout, "core.sparseCheckout", as_bool=True) == "true"


def submodule_paths(layout: RepoLayout) -> list[str]:
    """Paths named by ``.gitmodules`` (read as data; submodules are never entered)."""
    gitmodules = layout.top / ".gitmodules"
    if not gitmodules.is_file() or gitmodules.is_symlink():
        return []
    proc = run_git(
        _outside(),
        "config",
        "--file",
        str(gitmodules),
        "--no-includes",
        "--get-regexp",
        r"^submodule\..*\.path$",
        check=False,
    )
    paths = []
    for line in proc.stdout.decode("utf-8", "replace").splitlines():
        _, _, value = line.partition(" ")
        if value:
            paths.append(value)
    return sorted(paths)


def _global_config_files() -> list[Path]:
    """The user's global config files in the order git reads them (the later one wins)."""
    home = Path.home()
    xdg = os.environ.get("XDG_CONFIG_HOME") or str(home / ".config")
    return [Path(xdg) / "git" / "config", home / ".gitconfig"]


def _configured_file(layout: RepoLayout | None, key: str, default: str) -> list[Path]:
    """The file a setting such as ``core.excludesFile`` names, resolved as the user's git
    does: the repository's config, else the global ones, else ``$XDG_CONFIG_HOME/git/``."""
    value = None
    for config in _global_config_files():
        value = _config_value(config, key, as_bool=False) or value
    if layout is not None:
        value = read_config(layout, key) or value
    home = Path.home()
    if value:
        path = named_file(layout, value)
    else:
        path = Path(os.environ.get("XDG_CONFIG_HOME") or str(home / ".config")) / "git" / default
    return [path] if path.is_file() else []


CONFIGURED_FILES = ("core.excludesFile", "core.attributesFile")
"""The settings whose files the baseline reads (see :func:`environment_excludes`)."""


def named_file(layout: RepoLayout | None, value: str) -> Path:
    """The file a setting's value names, as git reads it: ``~`` expanded, a relative path
    from the work tree's top (from the home folder without a repository)."""
    path = Path(value).expanduser()
    if not path.is_absolute():
        path = (layout.top if layout is not None else Path.home()) / path
    return path


def environment_excludes(layout: RepoLayout | None = None) -> list[Path]:
    """The user's own ignore file (``core.excludesFile`` or git's default place), read as
    data so that the baseline leaves out what the user's ``git status`` leaves out."""
    return _configured_file(layout, "core.excludesFile", "ignore")


def environment_attributes(layout: RepoLayout | None = None) -> list[Path]:
    """The user's own attributes file (``core.attributesFile`` or git's default place)."""
    return _configured_file(layout, "core.attributesFile", "attributes")
