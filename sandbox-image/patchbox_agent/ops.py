"""The agent's operations on the workspace: ``list_files``, ``search_text``, ``read_file``,
``replace_text``, ``apply_patch``, ``changes``, ``read_raw``, ``check_paths``, ``put_archive``,
``run`` and ``cancel``, with their limits, and the baseline preload.
:mod:`patchbox_agent.server` greets the controller and hands each request to a :class:`Workspace`.

The tar extraction behind ``put_archive`` and the preload (:mod:`patchbox_agent.extract`),
the ``run`` operation's process handling (:mod:`patchbox_agent.runner`), search and edits
load on first use (a faster start, see docs/performance.md).
"""

from __future__ import annotations

import os
import stat
import time
from _thread import allocate_lock

from . import jail, procs, wire
from .bounds import (
    DEFAULT_LIST_RESULTS,
    DEFAULT_SEARCH_RESULTS,
    MAX_CHANGE_PATHS,
    MAX_CHECK_PATHS,
    MAX_EXPORT_PATHS,
    MAX_LINE_NUMBER,
    MAX_LIST_RESULTS,
    MAX_QUERY,
    MAX_READ_FILE,
    MAX_READ_LINES,
    MAX_SEARCH_RESULTS,
    NO_SUCH_PATH,
    NOT_TEXT,
    RAW_CHUNK,
    SEARCH_CACHE_ENTRIES,
    SEED,
)
from .frames import FdReader, FrameError
from .index import FileIndex, snapshot_changes
from .opargs import OpError, bad, filter_dirs, glob_arg, int_arg, read_lines, run_args

TYPE_CHECKING = False
if TYPE_CHECKING:
    import subprocess
    from collections.abc import Callable
    from typing import Any

    from . import runner


class Workspace:
    """The workspace's descriptor, its file index and search cache, the baseline reference
    of ``changes``, and the processes ``run`` started (for ``cancel``). The operations that
    read or write the file index run under :meth:`locked`; ``run`` runs on a thread of its
    own."""

    def __init__(self, workspace: str) -> None:
        self._workspace = workspace
        self._root_fd = -1
        self._index: FileIndex | None = None
        self._search_cache: dict[str, dict[str, Any]] = {}  # in use order, oldest first
        self._index_lock = allocate_lock()
        self._base: dict[str, Any] | None = None
        self._running: dict[int, subprocess.Popen[bytes]] = {}
        self._cancelled: set[int] = set()
        self._watches: dict[int, runner.Watch] = {}
        self._state_lock = allocate_lock()

    def open(self) -> None:
        """Opens the workspace and its file index, unless the preload did."""
        if self._root_fd < 0:
            self._root_fd = os.open(self._workspace, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            self._index = FileIndex(self._root_fd, self._workspace)

    @property
    def index(self) -> FileIndex:
        assert self._index is not None  # noqa: S101 - opened at hello, which comes first
        return self._index

    def changed(self) -> None:
        """The workspace may have changed: new version, caches dropped."""
        with self._index_lock:
            self.index.invalidate()
            self._search_cache.clear()

    def locked(
        self, fn: Callable[[dict[str, Any]], dict[str, Any]], args: dict[str, Any]
    ) -> dict[str, Any]:
        with self._index_lock:
            return fn(args)

    def list_files(self, args: dict[str, Any]) -> dict[str, Any]:
        keep = glob_arg(args)
        limit = int_arg(args, "maxResults", DEFAULT_LIST_RESULTS, 1, MAX_LIST_RESULTS)
        files = jail.shown(self.index.files())  # names that are not UTF-8 left out
        if keep is not None:
            files = [p for p in files if keep(p)]
        return {
            "files": files[:limit],
            "truncated": len(files) > limit,
            "version": self.index.version,
        }

    def search_text(self, args: dict[str, Any]) -> dict[str, Any]:
        from . import search  # imported on first use: a faster start

        query = args.get("query")
        if not isinstance(query, str) or not 0 < len(query) <= MAX_QUERY or "\x00" in query:
            raise bad("query must be a string of 1 to 1000 characters")
        regex = args.get("regex", False)
        if not isinstance(regex, bool):
            raise bad("regex must be a boolean")
        keep = glob_arg(args)
        limit = int_arg(args, "maxResults", DEFAULT_SEARCH_RESULTS, 1, MAX_SEARCH_RESULTS)
        key = wire.dumps([self.index.version, query, regex, args.get("glob"), limit])
        cached = self._search_cache.pop(key, None)
        if cached is not None:
            self._search_cache[key] = cached  # now the most recently used
            return dict(cached, cached=True)
        by_dir = jail.shown_dirs(self.index.by_dir())  # names that are not UTF-8 left out
        if keep is not None:
            by_dir = filter_dirs(by_dir, keep)
        if regex:
            import re  # imported on first use: a faster start

            try:
                re.compile(query.encode("utf-8"))
            except re.error as exc:
                raise bad(f"invalid regular expression: {exc.msg}") from exc
            found = search.regex_search_bounded(self._workspace, by_dir, query, limit)
            if found is None:
                raise bad(
                    "the regular expression ran out of time; use a literal or a simpler pattern"
                )
        else:
            found = search.search(
                self._root_fd, by_dir, search.literal_finder(query.encode("utf-8")), limit
            )
        result = dict(found, version=self.index.version, cached=False)
        self._search_cache[key] = result
        while len(self._search_cache) > SEARCH_CACHE_ENTRIES:
            del self._search_cache[next(iter(self._search_cache))]
        return result

    def replace_text(self, args: dict[str, Any]) -> dict[str, Any]:
        from . import edit  # imported on first use: a faster start

        try:
            result = edit.replace_text(
                self._root_fd, args.get("path"), args.get("oldText"), args.get("newText")
            )
        except ValueError as exc:
            raise bad(str(exc)) from exc
        except edit.EditRejected as exc:
            raise OpError("PATCH_REJECTED", str(exc)) from exc
        except edit.EditBroken as exc:
            self.index.touch()
            self._search_cache.clear()
            raise OpError("SANDBOX_FAILED", str(exc)) from exc
        self.index.touch()
        self._search_cache.clear()
        result["version"] = self.index.version
        return result

    def apply_patch(self, args: dict[str, Any]) -> dict[str, Any]:
        from . import edit  # imported on first use: a faster start

        try:
            result = edit.apply_patch(self._root_fd, args.get("patch"), self.index.files())
        except ValueError as exc:
            raise bad(str(exc)) from exc
        except edit.EditRejected as exc:
            raise OpError("PATCH_REJECTED", str(exc)[:1000]) from exc
        except edit.EditBroken as exc:
            self.index.invalidate()
            self._search_cache.clear()
            raise OpError("SANDBOX_FAILED", str(exc)) from exc
        self.index.invalidate()
        self._search_cache.clear()
        result["version"] = self.index.version
        return result

    def mark_base(self) -> None:
        """Before the first operation that may write: the workspace is still the baseline,
        so its file metadata becomes the reference of ``changes``, and its ``.gitignore``
        files the rules of change detection (none written later can hide a change)."""
        if self._base is None:
            with self._index_lock:
                if link_seed(self._root_fd, SEED):
                    self.index.invalidate()
                self._base = self.index.mark_base()

    def changes(self, args: dict[str, Any]) -> dict[str, Any]:
        """Visible files added, removed or modified since the baseline (complete lists up to
        :data:`MAX_EXPORT_PATHS`, then ``truncated``)."""
        del args
        if self._base is None:
            return {"added": [], "removed": [], "modified": [], "count": 0, "truncated": False}
        self.index.invalidate()  # a process left behind may have added files since
        found = snapshot_changes(self._base, self.index.snapshot(), MAX_EXPORT_PATHS)
        listed = len(found["added"]) + len(found["removed"]) + len(found["modified"])
        return dict(found, truncated=found["count"] > listed)

    def read_raw(self, args: dict[str, Any]) -> dict[str, Any]:
        """Bytes of one workspace entry, base64, at most :data:`RAW_CHUNK` per call: a regular
        file (with its executable bit) or a symlink's target. Nothing is followed."""
        import base64  # imported on first use

        parts = jail.split(args.get("path"))
        offset = int_arg(args, "offset", 0, 0, 1 << 40)
        length = int_arg(args, "length", RAW_CHUNK, 1, RAW_CHUNK)
        dfd = jail.open_dir(self._root_fd, parts[:-1])
        try:
            st = os.stat(parts[-1], dir_fd=dfd, follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                target = os.fsencode(os.readlink(parts[-1], dir_fd=dfd))
                data = base64.b64encode(target).decode("ascii")
                return {"kind": "symlink", "size": len(target), "offset": 0, "data": data}
            if not stat.S_ISREG(st.st_mode):
                return {"kind": "other", "size": 0, "offset": 0, "data": ""}
            fd = jail.open_regular(dfd, parts[-1])  # the entry just seen, never a link
            try:
                size = os.fstat(fd).st_size
                chunk = os.pread(fd, length, offset)
            finally:
                os.close(fd)
        finally:
            os.close(dfd)
        return {
            "kind": "file",
            "executable": bool(st.st_mode & 0o111),
            "size": size,
            "offset": offset,
            "data": base64.b64encode(chunk).decode("ascii"),
        }

    def check_paths(self, args: dict[str, Any]) -> dict[str, Any]:
        """What each of ``paths`` names, under the jail's rules: ``{"kind": "file"}`` or
        ``{"kind": "folder"}``, or the error a tool would get (``code``, ``message``). A
        protected path is refused by name before anything is looked up; a link, at any
        component, is refused and never followed. The arguments a check is given are
        checked here, where the workspace is."""
        paths = args.get("paths")
        if (
            not isinstance(paths, list)
            or len(paths) > MAX_CHECK_PATHS
            or not all(isinstance(p, str) for p in paths)
        ):
            raise bad(f"paths must be a list of at most {MAX_CHECK_PATHS} strings")
        return {"paths": [self._path_kind(p) for p in paths]}

    def _path_kind(self, path: str) -> dict[str, str]:
        try:
            parts = jail.split(path)
            dfd = jail.open_dir(self._root_fd, parts[:-1])
            try:
                try:
                    st = os.stat(parts[-1], dir_fd=dfd, follow_symlinks=False)
                except FileNotFoundError:
                    raise jail.NoSuchFileError(NO_SUCH_PATH) from None
                except OSError:
                    raise jail.PathDeniedError(jail.NOT_ALLOWED + ": it cannot be opened") from None
            finally:
                os.close(dfd)
        except jail.NoSuchFileError as exc:
            return {"code": exc.code, "message": NO_SUCH_PATH}
        except jail.PathDeniedError as exc:
            return {"code": exc.code, "message": exc.message}
        if stat.S_ISDIR(st.st_mode):
            return {"kind": "folder"}
        if stat.S_ISREG(st.st_mode):
            return {"kind": "file"}
        if stat.S_ISLNK(st.st_mode):
            message = jail.NOT_ALLOWED + ": a symbolic link, which the tools do not follow"
        else:
            message = jail.NOT_ALLOWED + ": not a regular file or folder"
        return {"code": "TOOL_PATH_DENIED", "message": message}

    def read_file(self, args: dict[str, Any]) -> dict[str, Any]:
        start = int_arg(args, "startLine", 1, 1, MAX_LINE_NUMBER)
        end = int_arg(args, "endLine", start + MAX_READ_LINES - 1, start, MAX_LINE_NUMBER)
        end = min(end, start + MAX_READ_LINES - 1)
        fd = jail.open_file(self._root_fd, args.get("path"))
        with os.fdopen(fd, "rb") as fh:
            if os.fstat(fd).st_size > MAX_READ_FILE:
                raise jail.PathDeniedError(f"too large to read (over {MAX_READ_FILE} bytes)")
            if b"\x00" in fh.read(8192):
                raise jail.PathDeniedError(NOT_TEXT)
            fh.seek(0)
            lines, total, truncated = read_lines(fh, start, end)
        last = start + len(lines) - 1 if lines else start - 1
        return {
            "path": args["path"],
            "startLine": start,
            "endLine": last,
            "totalLines": total,
            "content": "".join(lines),
            "truncated": truncated or last < min(end, total),
        }

    def put_archive(self, reader: FdReader, args: dict[str, Any]) -> dict[str, Any]:
        """Unpacks a tar stream into the workspace (see :mod:`patchbox_agent.extract`);
        ``bytes`` is the archive size consumed."""
        from . import extract  # imported on first use: a faster start

        if args.get("stream") is True:
            stream = extract.Chunks(reader, None)
        else:
            stream = extract.Chunks(reader, int_arg(args, "size", 0, 0, 1 << 40))
        try:
            count = extract.unpack(stream, self._workspace, self._root_fd)
        except extract.ArchiveRefusedError as exc:
            raise OpError("SANDBOX_FAILED", str(exc)) from exc
        finally:
            stream.drain()
            self.changed()
        return {"entries": count, "bytes": stream.total}

    def preload(self, path: str) -> dict[str, Any]:
        """Unpacks the baseline archive at ``path`` (a file or FIFO the controller mounted
        read-only) before the first request; the result goes into the hello answer."""
        from . import extract  # imported on first use: a faster start

        started = time.monotonic()
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError as exc:
            return {"error": f"cannot open the baseline archive: {exc.strerror}"}
        try:
            root = os.open(self._workspace, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            self._root_fd = root
            self._index = FileIndex(root, self._workspace)
            stream = extract.FileStream(fd)
            count = extract.unpack(stream, self._workspace, root)
            return {
                "entries": count,
                "bytes": stream.total,
                "ms": int((time.monotonic() - started) * 1000),
            }
        except extract.ArchiveRefusedError as exc:
            return {"error": str(exc)}
        except (OSError, FrameError) as exc:
            return {"error": f"baseline archive unreadable: {exc}"}
        finally:
            os.close(fd)

    def cancel(self, args: dict[str, Any]) -> dict[str, Any]:
        target = int_arg(args, "target", 0, 0, 1 << 62)
        with self._state_lock:
            proc = self._running.get(target)
            if proc is not None:
                self._cancelled.add(target)
        if proc is not None:
            from . import runner  # loaded already: the run started it

            runner.kill_group(proc)
        return {"cancelled": proc is not None}

    def run_start(self, rid: int, args: dict[str, Any]) -> dict[str, Any]:
        """Starts ``run`` on a thread of its own and answers at once with its handle (the
        request's id); ``run_poll`` then gives its output as it comes and its result. One
        such run at a time; its deadline, kill and ``cancel`` are those of ``run``."""
        run_args(args)  # refused now, not on the thread
        from . import runner  # imported on first use: a faster start

        with self._state_lock:
            if any(not w.done for w in self._watches.values()):
                raise OpError("TOOL_ARGUMENTS_INVALID", "a watched run is already running")
            watch = runner.Watch()
            self._watches[rid] = watch

        def work() -> None:
            try:
                watch.end(self.run(rid, args, sink=watch.add))
            except OpError as exc:
                watch.end(None, (exc.code, exc.message))
            except Exception as exc:
                watch.end(None, ("SANDBOX_FAILED", f"agent fault: {type(exc).__name__}"))

        import threading

        threading.Thread(target=work, daemon=True).start()
        return {"handle": rid}

    def run_poll(self, args: dict[str, Any]) -> dict[str, Any]:
        """A watched run's output since the last poll, after waiting up to ``waitSeconds``
        for some; ``done`` with its ``result`` once it ended (then the handle is gone)."""
        handle = int_arg(args, "handle", 0, 0, 1 << 62)
        wait = args.get("waitSeconds", 0)
        if isinstance(wait, bool) or not isinstance(wait, (int, float)) or not 0 <= wait <= 60:
            raise bad("waitSeconds must be a number from 0 to 60")
        with self._state_lock:
            watch = self._watches.get(handle)
        if watch is None:
            raise bad("no such watched run")
        out = watch.take(float(wait))
        if out["done"]:
            with self._state_lock:
                self._watches.pop(handle, None)
            if watch.error is not None:
                raise OpError(*watch.error)
        return out

    def run(
        self, rid: int, args: dict[str, Any], sink: Callable[[bytes], object] | None = None
    ) -> dict[str, Any]:
        argv, env, timeout, cap = run_args(args)
        track = args.get("trackChanges", False)
        if not isinstance(track, bool):
            raise bad("trackChanges must be a boolean")
        if track:
            with self._index_lock:
                before = self.index.snapshot()
        from . import runner  # imported on first use: a faster start

        oom_before = runner.oom_kills()
        started = time.monotonic()
        try:
            proc = runner.spawn(argv, env, self._workspace)
        except OSError as exc:
            return runner.result(started, spawn_error=exc.strerror or type(exc).__name__)
        with self._state_lock:
            self._running[rid] = proc
        assert proc.stdout is not None  # noqa: S101 - Popen contract with stdout=PIPE
        tail, total, timed_out = runner.collect(proc, proc.stdout, started + timeout, cap, sink)
        self.changed()
        procs.reap_orphans()  # what the killed process group left behind
        oom_after = runner.oom_kills()
        with self._state_lock:
            self._running.pop(rid, None)
            cancelled = rid in self._cancelled
            self._cancelled.discard(rid)
        result = runner.result(
            started,
            code=proc.returncode,
            timed_out=timed_out,
            cancelled=cancelled,
            tail=tail,
            total=total,
            oom_kills=(
                max(0, oom_after - oom_before)
                if oom_before is not None and oom_after is not None
                else None
            ),
        )
        if track:
            with self._index_lock:
                result["changes"] = snapshot_changes(
                    before, self.index.snapshot(), MAX_CHANGE_PATHS
                )
        return result


def link_seed(root_fd: int, seed: str) -> list[str]:
    """Links each top-level entry of a project environment's seed (what its setup left in
    /workspace: ``node_modules``, ``.venv``) into the workspace, where the baseline has no
    entry of that name. The links are read-only image content; tools refuse them (they are
    links) and checks follow them. Made before the change reference, so they are no change.
    Returns the names linked."""
    try:
        names = sorted(os.listdir(seed))
    except OSError:
        return []
    linked = []
    for name in names:
        try:
            os.symlink(f"{seed}/{name}", name, dir_fd=root_fd)
        except OSError:
            continue  # the baseline has it: the project's own wins
        linked.append(name)
    return linked
