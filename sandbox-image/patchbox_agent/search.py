"""Text search over the indexed files: literal by default, regex only with a time bound.

A literal search reads each file once (relative to its directory's descriptor, never
following a link) and finds hits with ``bytes.find``; files with a NUL byte in their first
8 KiB, or that are not UTF-8, are skipped. A regular expression runs in a child process
that is killed at its deadline, so a catastrophic pattern costs at most that time.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from . import jail, procs

MAX_FILE_BYTES = 8 * 1024 * 1024
MAX_LINE_CHARS = 500
REGEX_SECONDS = float(os.environ.get("PATCHBOX_REGEX_SECONDS", "10"))
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY

Hit = Dict[str, Any]
Finder = Callable[[bytes], Iterator[int]]


def _read_text(dfd: int, name: str) -> Optional[bytes]:
    """The file's bytes, or None when it cannot be opened without following a link, is
    larger than the bound, or looks binary. ``O_NONBLOCK`` keeps a FIFO from blocking; a
    short read of a regular file means its end, so small files cost one read."""
    try:
        fd = os.open(name, _FILE_FLAGS, dir_fd=dfd)
    except OSError:
        return None
    chunks = []
    size = 0
    try:
        while True:
            chunk = os.read(fd, 65536)
            chunks.append(chunk)
            size += len(chunk)
            if len(chunk) < 65536 or size > MAX_FILE_BYTES:
                break
    except OSError:
        return None
    finally:
        os.close(fd)
    data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
    if size > MAX_FILE_BYTES or b"\x00" in data[:8192]:
        return None
    return data


def literal_finder(query: bytes) -> Finder:
    def find(data: bytes) -> Iterator[int]:
        pos = data.find(query)
        while pos >= 0:
            yield pos
            pos = data.find(query, pos + 1)

    return find


def regex_finder(pattern: "re.Pattern[bytes]") -> Finder:
    def find(data: bytes) -> Iterator[int]:
        for m in pattern.finditer(data):
            yield m.start()

    return find


def _hits_in(path: str, data: bytes, find: Finder, room: int) -> Tuple[List[Hit], bool]:
    hits: List[Hit] = []
    line_no = 1
    counted = 0
    last_line_start = -1
    for pos in find(data):
        line_no += data.count(b"\n", counted, pos)
        counted = pos
        start = data.rfind(b"\n", 0, pos) + 1
        if start == last_line_start:
            continue
        last_line_start = start
        end = data.find(b"\n", pos)
        line = data[start : end if end >= 0 else len(data)]
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError:
            return [], False
        if len(hits) >= room:
            return hits, True
        hits.append({"path": path, "line": line_no, "text": text.rstrip("\r")[:MAX_LINE_CHARS]})
    if hits:
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            return [], False
    return hits, False


def _search_dir(
    root_fd: int, directory: str, names: List[str], find: Finder, room: int
) -> Tuple[List[Hit], int, bool]:
    hits: List[Hit] = []
    scanned = 0
    try:
        dfd = jail.open_dir(root_fd, directory.split("/") if directory else [])
    except jail.PathDeniedError:
        return hits, 0, False
    try:
        for name in names:
            data = _read_text(dfd, name)
            if data is None:
                continue
            scanned += 1
            found, cut = _hits_in(_join(directory, name), data, find, room - len(hits))
            hits.extend(found)
            if cut or len(hits) >= room:
                return hits, scanned, True
    finally:
        os.close(dfd)
    return hits, scanned, False


def search(
    root_fd: int,
    by_dir: Dict[str, List[str]],
    find: Finder,
    limit: int,
    keep: Optional[Callable[[str], bool]] = None,
) -> Dict[str, Any]:
    """Searches every indexed file, directory by directory, until ``limit`` hits; hits are
    returned sorted by path and line. (One thread: the sandbox's CPU quota is usually one
    core, and two threads measured slower there.)"""
    hits: List[Hit] = []
    scanned = 0
    truncated = False
    for directory in sorted(by_dir):
        names = [n for n in by_dir[directory] if keep is None or keep(_join(directory, n))]
        if not names:
            continue
        found, n, truncated = _search_dir(root_fd, directory, names, find, limit - len(hits))
        hits.extend(found)
        scanned += n
        if truncated:
            break
    hits.sort(key=lambda h: (h["path"], h["line"]))
    return {"hits": hits, "truncated": truncated, "filesScanned": scanned}


def _join(directory: str, name: str) -> str:
    return f"{directory}/{name}" if directory else name


def regex_search_bounded(
    workspace: str,
    by_dir: Dict[str, List[str]],
    pattern: str,
    limit: int,
    seconds: float = REGEX_SECONDS,
) -> Optional[Dict[str, Any]]:
    """Runs a regex search in a child process; None when it hit its deadline."""
    payload = json.dumps(
        {"workspace": workspace, "dirs": by_dir, "pattern": pattern, "limit": limit}
    )
    home = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = (
        f"import sys; sys.path.insert(0, {home!r}); "
        "from patchbox_agent.search import _regex_child; _regex_child()"
    )
    try:
        out = procs.run(
            [sys.executable, "-I", "-S", "-B", "-c", code],
            input=payload.encode(),
            timeout=seconds,
            check=True,
            cwd="/",
        ).stdout
    except subprocess.TimeoutExpired:
        return None
    result: Dict[str, Any] = json.loads(out)
    return result


def _regex_child() -> None:
    req = json.loads(sys.stdin.buffer.read())
    pattern = re.compile(req["pattern"].encode("utf-8"), re.MULTILINE)
    root_fd = os.open(req["workspace"], os.O_RDONLY | os.O_DIRECTORY)
    result = search(root_fd, req["dirs"], regex_finder(pattern), req["limit"])
    sys.stdout.write(json.dumps(result))
