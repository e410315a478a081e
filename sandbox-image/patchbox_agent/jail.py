"""Path jail: every workspace path is opened component by component, never following a link.

Paths are relative POSIX paths. Each directory component is opened with
``O_DIRECTORY | O_NOFOLLOW`` relative to its parent's descriptor, so a symlink swapped in
between a check and an open cannot lead outside the workspace. The final component is
opened with ``O_NOFOLLOW | O_NONBLOCK`` and must be a regular file, so FIFOs and devices
never block the agent.
"""

from __future__ import annotations

import os
import stat
import unicodedata

from . import protected
from .globs import Glob

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Iterator

MAX_PATH_BYTES = 4096
MAX_COMPONENTS = 128

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY

# Names the model never sees or touches, compared after NFC and case folding. One list,
# shared with the controller's write policy: see protected.py and docs/architecture.md.
_PROTECTED_NAMES = protected.NAMES
_PROTECTED_PREFIXES = protected.PREFIXES
_PROTECTED_SUFFIXES = protected.SUFFIXES


_EXTRA: list[Glob] = []


def set_operator_protected(patterns: list[str]) -> None:
    """Adds the operator's protected globs (matched against the whole folded path)."""
    _EXTRA[:] = [Glob(fold(p)) for p in patterns]


def operator_protected(path: str) -> bool:
    if not _EXTRA:
        return False
    folded = fold(path)
    return any(g(folded) for g in _EXTRA)


class PathDeniedError(Exception):
    """The path is not allowed or not a readable regular file; the reason is never shown."""


def fold(name: str) -> str:
    return unicodedata.normalize("NFC", name).casefold()


def is_protected_component(name: str) -> bool:
    """True when this one component is protected whatever its directory."""
    return protected.is_protected_name(name)


def is_protected_path(path: str) -> bool:
    """True when the whole relative path is protected, including the (directory, name)
    rules such as ``.docker/config.json`` that no single component shows."""
    return protected.is_protected_path(path)


def split(path: object) -> list[str]:
    """Validates a workspace path and returns its components (raises PathDeniedError)."""
    if not isinstance(path, str) or not path:
        raise PathDeniedError
    if len(path.encode("utf-8", "surrogatepass")) > MAX_PATH_BYTES:
        raise PathDeniedError
    if path.startswith("/") or "\\" in path or "\x00" in path:
        raise PathDeniedError
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in path):
        raise PathDeniedError
    parts = path.split("/")
    if len(parts) > MAX_COMPONENTS:
        raise PathDeniedError
    for part in parts:
        if part in ("", ".", "..") or is_protected_component(part):
            raise PathDeniedError
    if is_protected_path(path) or operator_protected(path):
        raise PathDeniedError
    return parts


def open_dir(root_fd: int, parts: list[str]) -> int:
    """Opens the directory ``parts`` beneath ``root_fd`` without following links."""
    fd = os.dup(root_fd)
    try:
        for part in parts:
            nfd = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = nfd
    except OSError as exc:
        os.close(fd)
        raise PathDeniedError from exc
    return fd


def make_dirs(root_fd: int, parts: list[str]) -> int:
    """Creates missing directories ``parts`` beneath ``root_fd`` (never through a link)
    and returns a descriptor of the last one."""
    fd = os.dup(root_fd)
    try:
        for part in parts:
            try:
                os.mkdir(part, 0o755, dir_fd=fd)
            except FileExistsError:
                pass
            nfd = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = nfd
    except OSError as exc:
        os.close(fd)
        raise PathDeniedError from exc
    return fd


def open_file(root_fd: int, path: object) -> int:
    """Opens a regular file for reading beneath ``root_fd``; raises PathDeniedError otherwise."""
    parts = split(path)
    dfd = open_dir(root_fd, parts[:-1])
    try:
        fd = os.open(parts[-1], _FILE_FLAGS, dir_fd=dfd)
    except OSError as exc:
        raise PathDeniedError from exc
    finally:
        os.close(dfd)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise PathDeniedError
    return fd


def walk_files(root_fd: int, prefix: str = "") -> Iterator[str]:
    """Yields the relative paths of regular files beneath ``root_fd`` in sorted order,
    never following a link and never entering or listing a protected name."""
    with os.scandir(root_fd) as it:
        entries = sorted(it, key=lambda e: e.name)
    for entry in entries:
        if is_protected_component(entry.name) or entry.name.startswith(".patchbox-tmp-"):
            continue
        rel = prefix + entry.name
        if entry.is_file(follow_symlinks=False):
            if not (is_protected_path(rel) or operator_protected(rel)):
                yield rel
        elif entry.is_dir(follow_symlinks=False):
            try:
                sub = os.open(entry.name, _DIR_FLAGS, dir_fd=root_fd)
            except OSError:
                continue
            try:
                yield from walk_files(sub, rel + "/")
            finally:
                os.close(sub)
