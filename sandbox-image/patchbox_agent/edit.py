"""Exact edits: ``replace_text`` with an atomic same-directory rename, and ``apply_patch``.

The rules are in docs/architecture.md ("The tools").

Nothing here follows a link: every folder and file is opened through the jail (each
component verified against its ``fstatat``, see jail.py, under gVisor too), a replacement
is written to a fresh temp file in the same directory (``O_EXCL | O_NOFOLLOW``) and renamed
over the original after re-checking that the original did not change since it was read.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import stat
from typing import Any, Callable, Dict, List, Optional, Tuple, TypeVar

from . import diffs, jail

T = TypeVar("T")

MAX_EDIT_FILE = 8 * 1024 * 1024
TMP_PREFIX = ".patchbox-tmp-"
_TRAILING_WS = re.compile(r"[ \t]+\r?$")
_SPACE_BEFORE_TAB = re.compile(r"^\t* +\t")


class EditRejected(Exception):  # noqa: N818 - mirrors the PATCH_REJECTED code
    """The edit did not apply and the workspace is exactly as before (retryable)."""


class EditBroken(Exception):  # noqa: N818 - a job-ending condition, not a retryable one
    """The edit failed and the workspace may differ from before: the job must end."""


def _read(dfd: int, name: str) -> Tuple[bytes, os.stat_result]:
    try:
        fd = jail.open_regular(dfd, name)
    except OSError as exc:
        raise jail.why_not(dfd, name, exc, stat.S_IFREG) from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise jail.PathDeniedError(jail.NOT_ALLOWED + ": not a regular file")
        if st.st_size > MAX_EDIT_FILE:
            raise jail.PathDeniedError(f"too large to edit (over {MAX_EDIT_FILE} bytes)")
        chunks = []
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks), st


def _same_file(dfd: int, name: str, before: os.stat_result) -> bool:
    try:
        now = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except OSError:
        return False
    return (now.st_ino, now.st_size, now.st_mtime_ns, now.st_mode) == (
        before.st_ino,
        before.st_size,
        before.st_mtime_ns,
        before.st_mode,
    )


def _write_atomic(dfd: int, name: str, data: bytes, mode: int) -> None:
    tmp = TMP_PREFIX + secrets.token_hex(8)
    fd = os.open(
        tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dfd
    )
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fchmod(fd, mode)
    except BaseException:
        os.close(fd)
        os.unlink(tmp, dir_fd=dfd)
        raise
    os.close(fd)
    os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)


def fingerprint(dfd: int, name: str) -> str:
    """What a failed edit could have changed: the directory's entries and the file's bytes."""
    h = hashlib.sha256()
    for entry in sorted(os.scandir(dfd), key=lambda e: e.name):
        st = entry.stat(follow_symlinks=False)
        h.update(
            f"{entry.name}\0{stat.S_IFMT(st.st_mode)}\0{st.st_size}\0".encode(
                "utf-8", "surrogateescape"
            )
        )
    try:
        data, _ = _read(dfd, name)
        h.update(hashlib.sha256(data).digest())
    except jail.PathDeniedError:
        h.update(b"missing")
    return h.hexdigest()


def whitespace_errors(text: str, first: int, last: int) -> List[str]:
    """``git diff --check``-style errors on lines ``first..last`` (1-based) of ``text``."""
    errors = []
    lines = text.split("\n")
    for no in range(first, min(last, len(lines)) + 1):
        line = lines[no - 1]
        if _TRAILING_WS.search(line):
            errors.append(f"line {no}: trailing whitespace")
        if _SPACE_BEFORE_TAB.search(line):
            errors.append(f"line {no}: space before tab in indent")
    return errors


def _locate(text: str, old: str) -> int:
    pos = text.find(old)
    if pos < 0:
        raise EditRejected("oldText was not found")
    if text.find(old, pos + 1) >= 0:
        raise EditRejected("oldText occurs more than once; include more context to make it unique")
    return pos


def replace_text(root_fd: int, path: Any, old: Any, new: Any) -> Dict[str, Any]:
    if not isinstance(old, str) or not old or not isinstance(new, str) or old == new:
        raise ValueError("oldText must be non-empty and differ from newText")
    parts = jail.split(path)
    if parts[-1].startswith(TMP_PREFIX):
        raise jail.PathDeniedError
    dfd = jail.open_dir(root_fd, parts[:-1])
    try:
        return _replace_in(dfd, parts[-1], path, old, new)
    finally:
        os.close(dfd)


def _replace_in(dfd: int, name: str, path: str, old: str, new: str) -> Dict[str, Any]:
    data, st = _read(dfd, name)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise jail.PathDeniedError("not a UTF-8 text file") from exc
    pos = _locate(text, old)
    updated = text[:pos] + new + text[pos + len(old) :]
    encoded = updated.encode("utf-8")
    if not _same_file(dfd, name, st):
        raise EditRejected("the file changed while it was being edited")
    before_print = fingerprint(dfd, name)
    _write_atomic(dfd, name, encoded, stat.S_IMODE(st.st_mode))
    first = text.count("\n", 0, pos) + 1
    last = first + new.count("\n")
    written, _ = _read(dfd, name)
    errors = whitespace_errors(written.decode("utf-8"), first, last) if new else []
    if errors:
        _restore(dfd, name, data, stat.S_IMODE(st.st_mode), before_print)
        raise EditRejected("whitespace errors: " + "; ".join(errors[:5]))
    return {
        "path": path,
        "line": first,
        "removedLines": old.count("\n") + 1,
        "addedLines": new.count("\n") + 1 if new else 0,
        "sha256Before": hashlib.sha256(data).hexdigest(),
        "sha256After": hashlib.sha256(encoded).hexdigest(),
    }


def _restore(dfd: int, name: str, data: bytes, mode: int, before_print: Optional[str]) -> None:
    try:
        _write_atomic(dfd, name, data, mode)
    except OSError as exc:
        raise EditBroken("the file could not be restored after a rejected edit") from exc
    if fingerprint(dfd, name) != before_print:
        raise EditBroken("the workspace differs from before a rejected edit")


def _in_parent(root_fd: int, path: str, look: Callable[[int, str], T]) -> Optional[T]:
    """``look(folder fd, name)`` in the folder that holds ``path``; None when that folder
    cannot be opened through the jail."""
    parts = jail.split(path)
    try:
        dfd = jail.open_dir(root_fd, parts[:-1])
    except jail.PathDeniedError:
        return None
    try:
        return look(dfd, parts[-1])
    finally:
        os.close(dfd)


def _read_for_patch(root_fd: int, path: str) -> Optional[bytes]:
    """Current bytes of ``path`` for the applier: None if missing; denied paths refuse the
    whole patch (links, protected names, non-regular files)."""

    def look(dfd: int, name: str) -> Optional[bytes]:
        try:
            os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            return None
        return _read(dfd, name)[0]

    return _in_parent(root_fd, path, look)


def _current_mode(root_fd: int, path: str) -> Optional[int]:
    def look(dfd: int, name: str) -> Optional[int]:
        try:
            return stat.S_IMODE(os.stat(name, dir_fd=dfd, follow_symlinks=False).st_mode)
        except OSError:
            return None

    return _in_parent(root_fd, path, look)


def _stated_mode(root_fd: int, path: str) -> Optional[str]:
    """The mode a traditional diff's deleted file is stated with: the file's own (None when
    it cannot be looked at: the parser or the jail then refuses the path)."""
    try:
        mode = _current_mode(root_fd, path)
    except jail.PathDeniedError:
        return None
    if mode is None:
        return None
    return "100755" if mode & 0o111 else "100644"


def _check_modes(root_fd: int, patches: List[Any]) -> None:
    """No mode escalation: a new file is 100644, an existing file keeps its own mode, and a
    mode line must name the file's real mode."""
    for p in patches:
        if p.kind == "create":
            if p.new_mode not in (None, "100644"):
                raise EditRejected(f"{p.path}: new files are created with mode 100644 only")
            continue
        if p.new_mode is not None and p.old_mode is not None and p.new_mode != p.old_mode:
            raise EditRejected(f"{p.path}: mode changes are not allowed")
        mode = _current_mode(root_fd, p.old_path)
        if mode is None:
            continue
        real = "100755" if mode & 0o111 else "100644"
        stated = p.old_mode or p.new_mode
        if stated is not None and stated != real:
            raise EditRejected(f"{p.path}: the patch states mode {stated}, the file has {real}")


def apply_patch(root_fd: int, text: Any, tree_paths: List[str]) -> Dict[str, Any]:
    """Applies one canonical diff, all or nothing (docs/architecture.md, "apply_patch").

    Rejections before any write raise EditRejected (the workspace is untouched); a failure
    after the first visible write raises EditBroken.
    """
    if not isinstance(text, str) or not text:
        raise ValueError("patch must be a non-empty string")
    try:
        patches = diffs.parse_patch(text, lambda path: _stated_mode(root_fd, path))
        for p in patches:
            for path in {p.old_path, p.new_path} - {None}:
                jail.split(path)
        _check_modes(root_fd, patches)
        modes = {p.path: _mode_for(root_fd, p) for p in patches}
        result = diffs.apply(
            patches,
            lambda path: _read_for_patch(root_fd, path),
            tree_paths=tree_paths,
            same_endings=True,
        )
    except diffs.DiffError as exc:
        raise EditRejected(str(exc)) from exc
    except jail.PathDeniedError as exc:
        raise EditRejected("the patch touches a path that may not be written") from exc
    before = {path: _read_for_patch(root_fd, path) for path in result}
    _write_all(root_fd, result, modes)
    files = []
    for st in diffs.stats(patches):
        old = before.get(st["old_path"] or st["path"])
        new = result.get(st["path"])
        files.append(
            {
                "path": st["path"],
                "oldPath": st["old_path"],
                "kind": st["kind"],
                "added": st["added"],
                "removed": st["removed"],
                "sha256Before": hashlib.sha256(old).hexdigest() if old is not None else None,
                "sha256After": hashlib.sha256(new).hexdigest() if new is not None else None,
            }
        )
    return {"files": files}


def _mode_for(root_fd: int, patch: Any) -> int:
    if patch.kind == "create":
        return 0o644
    mode = _current_mode(root_fd, patch.old_path)
    return 0o755 if mode is not None and mode & 0o111 else 0o644


class _Staging:
    """Temp files written beside their targets, and the directories made for them."""

    def __init__(self, root_fd: int) -> None:
        self.root_fd = root_fd
        self.staged: List[Tuple[int, str, str]] = []
        self.made: List[Tuple[int, str]] = []

    def stage(self, path: str, data: bytes, mode: int) -> None:
        parts = jail.split(path)
        dfd = _dirs_for(self.root_fd, parts[:-1], self.made)
        tmp = TMP_PREFIX + secrets.token_hex(8)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(tmp, flags, 0o600, dir_fd=dfd)
        except OSError:
            os.close(dfd)
            raise
        self.staged.append((dfd, tmp, parts[-1]))
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            os.fchmod(out.fileno(), mode)

    def undo(self) -> None:
        for dfd, tmp, _ in self.staged:
            try:
                os.unlink(tmp, dir_fd=dfd)
            except OSError:
                pass
        for dfd, name in reversed(self.made):
            try:
                os.rmdir(name, dir_fd=dfd)
            except OSError:
                pass

    def commit(self) -> None:
        for dfd, tmp, name in self.staged:
            os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)

    def close(self) -> None:
        _close_all(self.staged, self.made)


def _write_all(root_fd: int, result: Dict[str, Optional[bytes]], modes: Dict[str, int]) -> None:
    """Stages every new file as a temp file first (invisible to the tree), then renames and
    deletes. A failure while staging leaves the workspace as it was."""
    staging = _Staging(root_fd)
    try:
        try:
            for path, data in sorted(result.items()):
                if data is not None:
                    staging.stage(path, data, modes.get(path, 0o644))
        except (OSError, jail.PathDeniedError) as exc:
            staging.undo()
            raise EditRejected(f"the patch could not be staged: {exc.__class__.__name__}") from exc
        try:
            staging.commit()
            for path in sorted(p for p, data in result.items() if data is None):
                _unlink(root_fd, path)
        except (OSError, jail.PathDeniedError) as exc:
            raise EditBroken("the patch failed half way; the workspace changed") from exc
    finally:
        staging.close()


def _unlink(root_fd: int, path: str) -> None:
    parts = jail.split(path)
    dfd = jail.open_dir(root_fd, parts[:-1])
    try:
        os.unlink(parts[-1], dir_fd=dfd)
    finally:
        os.close(dfd)


def _dirs_for(root_fd: int, parts: List[str], made: List[Tuple[int, str]]) -> int:
    """Opens (creating where missing) the directories ``parts``; records what it created."""
    fd = os.dup(root_fd)
    for part in parts:
        try:
            os.mkdir(part, 0o755, dir_fd=fd)
            made.append((os.dup(fd), part))
        except FileExistsError:
            pass
        except OSError:
            os.close(fd)
            raise
        try:
            nfd = jail.open_subdir(fd, part)  # never a link, under gVisor too
        finally:
            os.close(fd)
        fd = nfd
    return fd


def _close_all(staged: List[Tuple[int, str, str]], made: List[Tuple[int, str]]) -> None:
    for fd in {dfd for dfd, _, _ in staged} | {dfd for dfd, _ in made}:
        try:
            os.close(fd)
        except OSError:
            pass
    staged.clear()
    made.clear()
