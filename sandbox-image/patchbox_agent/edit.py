"""Exact edits: ``replace_text`` with an atomic same-directory rename (SPEC 5.3).

Nothing here follows a link: the file is opened through the jail, the replacement is
written to a fresh temp file in the same directory (``O_EXCL | O_NOFOLLOW``) and renamed
over the original after re-checking that the original did not change since it was read.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import stat
from typing import Any, Dict, List, Optional, Tuple

from . import jail

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
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
    except OSError as exc:
        raise jail.PathDeniedError from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_EDIT_FILE:
            raise jail.PathDeniedError
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
        raise jail.PathDeniedError from exc
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
