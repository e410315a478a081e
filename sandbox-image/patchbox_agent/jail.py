"""Path jail: every workspace path is opened component by component, never following a link.

Paths are relative POSIX paths. Each directory component is opened with
``O_DIRECTORY | O_NOFOLLOW`` relative to its parent's descriptor, and then verified: an
``fstatat(AT_SYMLINK_NOFOLLOW)`` of the name must show a directory with the same
``(st_dev, st_ino)`` as the descriptor just opened. The flags alone are not enough: gVisor
(runsc) follows a symlink to a directory under ``O_DIRECTORY | O_NOFOLLOW`` (Linux answers
ENOTDIR), so without the check ``link_to_etc/passwd`` would open ``/etc/passwd``. The check
also holds against a swap: the descriptor pins what was opened, and a name that is (or
became) a link, or now names another inode, is refused. The final component is opened with
``O_NOFOLLOW | O_NONBLOCK``, must be a regular file, and is verified the same way, so FIFOs
and devices never block the agent. See docs/architecture.md, "The path jail".
"""

from __future__ import annotations

import errno
import os
import stat
import unicodedata

from . import protected
from .globs import Glob

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Iterator

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


def operator_guarded(path: str) -> bool:
    """Whether an operator glob protects everything below the folder ``path`` (``secrets``
    under ``secrets/**``): the folder is then refused by name too, so whether it exists
    is never shown."""
    if not _EXTRA:
        return False
    folded = fold(path)
    return any(g.covers_below(folded) for g in _EXTRA)


NOT_ALLOWED = "not allowed"
"""The one answer for a protected path, whether or not it exists (never more specific)."""
ABSOLUTE = "use a path relative to the repository top (like src/app.py), not an absolute path"
MALFORMED = (
    "not a valid path: use a path relative to the repository top, with / between names and"
    " no empty or '.' parts"
)
NO_SUCH_FILE = "no such file"


class PathDeniedError(Exception):
    """The path may not be used (``TOOL_PATH_DENIED``): protected, outside the workspace, or
    not a regular file the tools read. A protected name always gets :data:`NOT_ALLOWED`,
    before anything is looked up, so whether it exists is never shown."""

    code = "TOOL_PATH_DENIED"

    def __init__(self, message: str = NOT_ALLOWED) -> None:
        super().__init__(message)
        self.message = message


class PathInvalidError(PathDeniedError):
    """Not a workspace path at all (``TOOL_PATH_INVALID``): absolute, empty, malformed."""

    code = "TOOL_PATH_INVALID"


class NoSuchFileError(PathDeniedError):
    """A path the model may use names nothing (``TOOL_FILE_NOT_FOUND``)."""

    code = "TOOL_FILE_NOT_FOUND"

    def __init__(self, message: str = NO_SUCH_FILE) -> None:
        super().__init__(message)


def fold(name: str) -> str:
    return unicodedata.normalize("NFC", name).casefold()


def is_protected_component(name: str) -> bool:
    """True when this one component is protected whatever its directory."""
    return protected.is_protected_name(name)


def is_protected_path(path: str) -> bool:
    """True when the whole relative path is protected, including the (directory, name)
    rules such as ``.docker/config.json`` that no single component shows."""
    return protected.is_protected_path(path)


def protected_in(folder: str) -> Callable[[str], bool]:
    """:func:`is_protected_path` for the names in ``folder``, its part checked once."""
    return protected.protected_in(folder)


def _well_formed(path: object) -> str:
    """``path`` when it is a string a relative path may be (PathInvalidError otherwise)."""
    if not isinstance(path, str) or not path:
        raise PathInvalidError(MALFORMED)
    if len(path.encode("utf-8", "surrogatepass")) > MAX_PATH_BYTES:
        raise PathInvalidError(f"not a valid path: longer than {MAX_PATH_BYTES} bytes")
    if path.startswith("/"):
        raise PathInvalidError(ABSOLUTE)
    if "\\" in path or "\x00" in path or any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in path):
        raise PathInvalidError(MALFORMED + ", backslashes or control characters")
    return path


def split(path: object) -> list[str]:
    """Validates a workspace path and returns its components (raises PathDeniedError)."""
    path = _well_formed(path)
    parts = path.split("/")
    if len(parts) > MAX_COMPONENTS:
        raise PathInvalidError(f"not a valid path: more than {MAX_COMPONENTS} parts")
    if ".." in parts:
        raise PathDeniedError(NOT_ALLOWED + ": '..' leaves the repository")
    for part in parts:
        if is_protected_component(part):
            raise PathDeniedError
    if any(part in ("", ".") for part in parts):
        raise PathInvalidError(MALFORMED)
    if is_protected_path(path) or operator_protected(path) or operator_guarded(path):
        raise PathDeniedError
    return parts


def _verify(dfd: int, name: str, fd: int, kind: int) -> None:
    """Raises OSError unless ``name`` in ``dfd`` is, without following it, an entry of type
    ``kind`` whose ``(st_dev, st_ino)`` is that of the open descriptor ``fd``."""
    opened = os.fstat(fd)
    entry = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    if stat.S_IFMT(entry.st_mode) != kind or (entry.st_dev, entry.st_ino) != (
        opened.st_dev,
        opened.st_ino,
    ):
        raise OSError(f"{name!r} is not the {kind:o} entry that was opened")


def _open_verified(dfd: int, name: str, flags: int, kind: int) -> int:
    fd = os.open(name, flags, dir_fd=dfd)
    try:
        _verify(dfd, name, fd, kind)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_subdir(dfd: int, name: str) -> int:
    """Opens the directory ``name`` in ``dfd``; OSError if it is a link (whatever the runtime
    does with ``O_DIRECTORY | O_NOFOLLOW``), not a directory, or swapped while opened."""
    return _open_verified(dfd, name, _DIR_FLAGS, stat.S_IFDIR)


def open_regular(dfd: int, name: str) -> int:
    """Opens the regular file ``name`` in ``dfd`` for reading (never blocking on a FIFO);
    OSError if it is a link, not a regular file, or swapped while opened."""
    return _open_verified(dfd, name, _FILE_FLAGS, stat.S_IFREG)


def why_not(dfd: int, name: str, error: OSError, want: int) -> PathDeniedError:
    """The error for ``name`` in ``dfd`` that could not be opened as a ``want`` (a
    directory or a regular file): missing, or what it is instead. Only ever called for a
    name :func:`split` let through, so a protected name never gets here."""
    try:
        kind = stat.S_IFMT(os.stat(name, dir_fd=dfd, follow_symlinks=False).st_mode)
    except OSError:
        if error.errno in (errno.ENOENT, errno.ENOTDIR):
            return NoSuchFileError()
        return PathDeniedError(NOT_ALLOWED + ": it cannot be opened")
    if kind == stat.S_IFLNK:
        return PathDeniedError(NOT_ALLOWED + ": a symbolic link, which the tools do not follow")
    if kind == want or kind not in (stat.S_IFREG, stat.S_IFDIR):
        what = "not a regular file"
        if kind == want:
            denied = error.errno in (errno.EACCES, errno.EPERM)
            what = (
                "it cannot be opened (no permission)"
                if denied
                else "it changed while it was opened"
            )
        return PathDeniedError(f"{NOT_ALLOWED}: {what}")
    if want == stat.S_IFREG:
        return PathDeniedError("a folder, not a file (list_files lists what it holds)")
    return NoSuchFileError(NO_SUCH_FILE + " (a part of the path is a file, not a folder)")


def open_dir(root_fd: int, parts: list[str]) -> int:
    """Opens the directory ``parts`` beneath ``root_fd``; NoSuchFileError if one is missing,
    PathDeniedError if any component is a link or not a directory."""
    fd = os.dup(root_fd)
    try:
        for part in parts:
            try:
                nfd = open_subdir(fd, part)
            except OSError as exc:
                raise why_not(fd, part, exc, stat.S_IFDIR) from exc
            os.close(fd)
            fd = nfd
    except PathDeniedError:
        os.close(fd)
        raise
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
            nfd = open_subdir(fd, part)
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
        return open_regular(dfd, parts[-1])
    except OSError as exc:
        raise why_not(dfd, parts[-1], exc, stat.S_IFREG) from exc
    finally:
        os.close(dfd)


def shown(paths: list[str]) -> list[str]:
    """``paths`` less those that are not UTF-8 (``os`` hands such a name over with lone
    surrogates): the model could not name them back, nor could the results carry them. They
    still count as changes, which the controller then refuses by name."""
    if "".join(paths).isascii():
        return paths
    return [p for p in paths if _encodes(p)]


def shown_dirs(by_dir: dict[str, list[str]]) -> dict[str, list[str]]:
    """:func:`shown` for names grouped by folder."""
    if "".join(d + "".join(names) for d, names in by_dir.items()).isascii():
        return by_dir
    out: dict[str, list[str]] = {}
    for d, names in by_dir.items():
        kept = [n for n in names if _encodes(n)] if _encodes(d) else []
        if kept:
            out[d] = kept
    return out


def reported(paths: list[str]) -> list[str]:
    """``paths`` for a change report: a name that is not UTF-8 as :func:`escape_name` spells
    it (``bad\\xff``), which no name rule accepts, so the controller refuses the change set
    and says which file; every other name as it is."""
    if "".join(paths).isascii():
        return paths
    return [p if _encodes(p) else escape_name(p) for p in paths]


def escape_name(name: str | bytes) -> str:
    """A name as printable ASCII, every other byte of its UTF-8 (for a ``str`` from ``os``
    calls, undecodable bytes are lone surrogates) escaped: ``bad\\xff``, ``caf\\xc3\\xa9``.
    Safe in any message; never a valid name itself when anything was escaped (a backslash is
    refused), and escaping it again changes nothing."""
    raw = name if isinstance(name, bytes) else name.encode("utf-8", "surrogateescape")
    return "".join(chr(b) if 0x20 <= b < 0x7F else f"\\x{b:02x}" for b in raw)


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


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
                sub = open_subdir(root_fd, entry.name)
            except OSError:
                continue
            try:
                yield from walk_files(sub, rel + "/")
            finally:
                os.close(sub)
