"""The agent's request loop: one framed request in, one framed response out.

Requests are ``{"id": int, "op": str, "args": object}``; responses are
``{"id": int, "ok": true, "result": object}`` or
``{"id": int, "ok": false, "error": {"code": str, "message": str}}``.
The first request must be ``hello`` with the controller's protocol version.
``run`` executes in a worker thread so that ``cancel`` can reach it; every other
operation runs inline, in order.

This module is the request loop and the operations on files; the tar extraction behind
``put_archive`` and the preload (:mod:`patchbox_agent.extract`) and the ``run`` operation's
process handling (:mod:`patchbox_agent.runner`) live apart and load on first use. It stays
a little over 600 lines because the agent's operations are one class sharing its state.
"""

from __future__ import annotations

import os
import select
import stat
import sys
import time
from _thread import allocate_lock, start_new_thread

from . import jail, procs, wire
from .frames import KIND_JSON, PROTOCOL_VERSION, FdReader, FrameError, Signer, grow_pipe
from .globs import Glob, GlobError
from .index import FileIndex, snapshot_changes

# The start path imports as little as it can: a sandbox reads every module cold (under
# gVisor through its gofer), so ``json``, ``re``, ``typing``, ``threading``, ``collections``
# and ``signal`` (which brings ``enum``) stay out of it; see docs/performance.md.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import signal as _signal
    import subprocess
    from collections.abc import Callable
    from typing import IO, Any
else:
    import _signal  # the C module behind signal, without its enums

AGENT_VERSION = "0.1.0"
WORKSPACE = "/workspace"

# The operations' limits. The controller imports them (its result models, the tools'
# argument schemas, the checks' bounds) rather than copying them.
MAX_READ_BYTES = 256 * 1024
MAX_READ_LINES = 2000
MAX_LINE_NUMBER = 10_000_000
MAX_READ_FILE = 64 * 1024 * 1024
MAX_LINE_BYTES = 1024 * 1024
MAX_LIST_RESULTS = 10000
DEFAULT_LIST_RESULTS = 1000
MAX_SEARCH_RESULTS = 1000
DEFAULT_SEARCH_RESULTS = 100
MAX_QUERY = 1000
SEARCH_CACHE_ENTRIES = 64
MAX_RUN_OUTPUT = 1024 * 1024
DEFAULT_RUN_OUTPUT = 64 * 1024
MAX_RUN_SECONDS = 24 * 3600
MAX_EXPORT_PATHS = 10000
MAX_CHANGE_PATHS = 200
SEED = "/opt/patchbox-seed"
"""Where a project environment keeps what its setup left in /workspace."""
RAW_CHUNK = 2 * 1024 * 1024
WRITE_OPS = frozenset({"replace_text", "apply_patch", "run"})
"""Operations that may change the workspace: the first one marks the baseline state."""


class OpError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _bad(message: str) -> OpError:
    return OpError("TOOL_ARGUMENTS_INVALID", message)


def _int_arg(args: dict[str, Any], key: str, default: int, lo: int, hi: int) -> int:
    value = args.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise _bad(f"{key} must be an integer in [{lo}, {hi}]")
    return value


class Agent:
    def __init__(
        self,
        in_fd: int,
        out_fd: int,
        workspace: str = WORKSPACE,
        wake: tuple[int, Callable[[], object]] | None = None,
    ) -> None:
        grow_pipe(in_fd)
        self._reader = FdReader(in_fd, wake=wake)
        self._out_fd = out_fd
        self._write_lock = allocate_lock()
        self._workspace = workspace
        self._root_fd = -1
        self._index: FileIndex | None = None
        self._search_cache: dict[str, dict[str, Any]] = {}  # in use order, oldest first
        self._index_lock = allocate_lock()
        self._greeted = False
        self._preload: dict[str, Any] | None = None
        self._base: dict[str, Any] | None = None
        self._signer: Signer | None = None
        self._running: dict[int, subprocess.Popen[bytes]] = {}
        self._cancelled: set[int] = set()
        self._state_lock = allocate_lock()

    # -- output ---------------------------------------------------------------------------

    def _send(self, obj: object) -> None:
        if self._signer is None:
            return  # nothing is ever answered without the controller's key
        with self._write_lock:
            data = self._signer.encode(obj)
            view = memoryview(data)
            while view:
                n = os.write(self._out_fd, view)
                view = view[n:]

    def _reply(self, rid: int, fn: Callable[[], dict[str, Any]]) -> None:
        try:
            self._send({"id": rid, "ok": True, "result": fn()})
        except OpError as exc:
            self._send(
                {"id": rid, "ok": False, "error": {"code": exc.code, "message": exc.message}}
            )
        except jail.PathDeniedError:
            err = {"code": "TOOL_PATH_DENIED", "message": "path denied"}
            self._send({"id": rid, "ok": False, "error": err})
        except FrameError:
            raise
        except Exception as exc:
            err = {"code": "SANDBOX_FAILED", "message": f"agent fault: {type(exc).__name__}"}
            self._send({"id": rid, "ok": False, "error": err})

    # -- loop -----------------------------------------------------------------------------

    def _next_request(self) -> tuple[int, str, dict[str, Any]] | None:
        """The next well-formed request, or None when the stream ends or breaks the protocol."""
        frame = self._reader.read()
        if frame is None or frame[0] != KIND_JSON:
            return None
        try:
            req = wire.loads(frame[1])
        except ValueError:
            return None
        if not isinstance(req, dict) or not isinstance(req.get("id"), int):
            return None
        op, args = req.get("op"), req.get("args", {})
        if not isinstance(op, str) or not isinstance(args, dict):
            return None
        if not self._greeted and op != "hello":
            return None
        return req["id"], op, args

    def serve(self) -> int:
        """Serves until end of input or ``shutdown``; returns the process exit code
        (0 on a clean end, 3 on a protocol violation)."""
        try:
            while True:
                req = self._next_request()
                if req is None:
                    return 0 if self._reader.at_eof else 3
                rid, op, args = req
                if op in WRITE_OPS and self._greeted:
                    self._mark_base()
                if op == "shutdown":
                    self._send({"id": rid, "ok": True, "result": {}})
                    return 0
                if op == "run":
                    import threading  # imported on first use: a faster start
                    from functools import partial

                    work = partial(self._run, rid, args)
                    threading.Thread(target=self._reply, args=(rid, work), daemon=True).start()
                    continue
                self._dispatch(rid, op, args)
        except FrameError:
            return 3

    def _dispatch(self, rid: int, op: str, args: dict[str, Any]) -> None:
        handlers: dict[str, Callable[[], dict[str, Any]]] = {
            "hello": lambda: self._hello(args),
            "list_files": lambda: self._locked(self._list_files, args),
            "search_text": lambda: self._locked(self._search_text, args),
            "replace_text": lambda: self._locked(self._replace_text, args),
            "apply_patch": lambda: self._locked(self._apply_patch, args),
            "read_file": lambda: self._read_file(args),
            "cancel": lambda: self._cancel(args),
            "put_archive": lambda: self._put_archive(args),
            "changes": lambda: self._locked(self._changes_since_base, args),
            "read_raw": lambda: self._read_raw(args),
        }
        handler = handlers.get(op)
        if handler is None:
            err = {"code": "TOOL_ARGUMENTS_INVALID", "message": "unknown operation"}
            self._send({"id": rid, "ok": False, "error": err})
            return
        self._reply(rid, handler)

    # -- operations -----------------------------------------------------------------------

    def _hello(self, args: dict[str, Any]) -> dict[str, Any]:
        if self._greeted:
            raise OpError("SANDBOX_FAILED", "hello may come only once")
        key = args.get("key")
        if not isinstance(key, str) or len(key) != 64:
            raise OpError("SANDBOX_FAILED", "hello needs a 32-byte key")
        self._signer = Signer(bytes.fromhex(key))
        if args.get("protocol") != PROTOCOL_VERSION:
            raise OpError("SANDBOX_FAILED", "protocol version mismatch")
        protected = args.get("protected", [])
        if not isinstance(protected, list) or not all(isinstance(p, str) for p in protected):
            raise OpError("SANDBOX_FAILED", "protected must be a list of globs")
        try:
            jail.set_operator_protected(protected)
        except GlobError as exc:
            raise OpError("SANDBOX_FAILED", "a protected glob is invalid") from exc
        if self._root_fd < 0:
            self._root_fd = os.open(self._workspace, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            self._index = FileIndex(self._root_fd, self._workspace)
        self._greeted = True
        return {
            "protocol": PROTOCOL_VERSION,
            "agent": AGENT_VERSION,
            "python": sys.version.split()[0],
            "uid": os.getuid(),
            "gid": os.getgid(),
            **({"preload": self._preload} if self._preload is not None else {}),
        }

    @property
    def index(self) -> FileIndex:
        assert self._index is not None  # noqa: S101 - made by hello, which comes first
        return self._index

    def _changed(self) -> None:
        """The workspace may have changed: new version, caches dropped."""
        with self._index_lock:
            self.index.invalidate()
            self._search_cache.clear()

    def _locked(
        self, fn: Callable[[dict[str, Any]], dict[str, Any]], args: dict[str, Any]
    ) -> dict[str, Any]:
        with self._index_lock:
            return fn(args)

    def _list_files(self, args: dict[str, Any]) -> dict[str, Any]:
        keep = _glob_arg(args)
        limit = _int_arg(args, "maxResults", DEFAULT_LIST_RESULTS, 1, MAX_LIST_RESULTS)
        files = jail.shown(self.index.files())  # names that are not UTF-8 left out
        if keep is not None:
            files = [p for p in files if keep(p)]
        return {
            "files": files[:limit],
            "truncated": len(files) > limit,
            "version": self.index.version,
        }

    def _search_text(self, args: dict[str, Any]) -> dict[str, Any]:
        from . import search  # imported on first use: a faster start

        query = args.get("query")
        if not isinstance(query, str) or not 0 < len(query) <= MAX_QUERY or "\x00" in query:
            raise _bad("query must be a string of 1 to 1000 characters")
        regex = args.get("regex", False)
        if not isinstance(regex, bool):
            raise _bad("regex must be a boolean")
        keep = _glob_arg(args)
        limit = _int_arg(args, "maxResults", DEFAULT_SEARCH_RESULTS, 1, MAX_SEARCH_RESULTS)
        key = wire.dumps([self.index.version, query, regex, args.get("glob"), limit])
        cached = self._search_cache.pop(key, None)
        if cached is not None:
            self._search_cache[key] = cached  # now the most recently used
            return dict(cached, cached=True)
        by_dir = jail.shown_dirs(self.index.by_dir())  # names that are not UTF-8 left out
        if keep is not None:
            by_dir = _filter_dirs(by_dir, keep)
        if regex:
            import re  # imported on first use: a faster start

            try:
                re.compile(query.encode("utf-8"))
            except re.error as exc:
                raise _bad(f"invalid regular expression: {exc.msg}") from exc
            found = search.regex_search_bounded(self._workspace, by_dir, query, limit)
            if found is None:
                raise _bad(
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

    def _replace_text(self, args: dict[str, Any]) -> dict[str, Any]:
        from . import edit  # imported on first use: a faster start

        try:
            result = edit.replace_text(
                self._root_fd, args.get("path"), args.get("oldText"), args.get("newText")
            )
        except ValueError as exc:
            raise _bad(str(exc)) from exc
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

    def _apply_patch(self, args: dict[str, Any]) -> dict[str, Any]:
        from . import edit  # imported on first use: a faster start

        try:
            result = edit.apply_patch(self._root_fd, args.get("patch"), self.index.files())
        except ValueError as exc:
            raise _bad(str(exc)) from exc
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

    def _mark_base(self) -> None:
        """Before the first operation that may write: the workspace is still the baseline,
        so its file metadata becomes the reference of ``changes``, and its ``.gitignore``
        files the rules of change detection (none written later can hide a change)."""
        if self._base is None:
            with self._index_lock:
                if link_seed(self._root_fd, SEED):
                    self.index.invalidate()
                self._base = self.index.mark_base()

    def _changes_since_base(self, args: dict[str, Any]) -> dict[str, Any]:
        """Visible files added, removed or modified since the baseline (complete lists up to
        :data:`MAX_EXPORT_PATHS`, then ``truncated``)."""
        del args
        if self._base is None:
            return {"added": [], "removed": [], "modified": [], "count": 0, "truncated": False}
        self.index.invalidate()  # a process left behind may have added files since
        found = snapshot_changes(self._base, self.index.snapshot(), MAX_EXPORT_PATHS)
        listed = len(found["added"]) + len(found["removed"]) + len(found["modified"])
        return dict(found, truncated=found["count"] > listed)

    def _read_raw(self, args: dict[str, Any]) -> dict[str, Any]:
        """Bytes of one workspace entry, base64, at most :data:`RAW_CHUNK` per call: a regular
        file (with its executable bit) or a symlink's target. Nothing is followed."""
        import base64  # imported on first use

        parts = jail.split(args.get("path"))
        offset = _int_arg(args, "offset", 0, 0, 1 << 40)
        length = _int_arg(args, "length", RAW_CHUNK, 1, RAW_CHUNK)
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

    def _read_file(self, args: dict[str, Any]) -> dict[str, Any]:
        start = _int_arg(args, "startLine", 1, 1, MAX_LINE_NUMBER)
        end = _int_arg(args, "endLine", start + MAX_READ_LINES - 1, start, MAX_LINE_NUMBER)
        end = min(end, start + MAX_READ_LINES - 1)
        fd = jail.open_file(self._root_fd, args.get("path"))
        with os.fdopen(fd, "rb") as fh:
            if os.fstat(fd).st_size > MAX_READ_FILE or b"\x00" in fh.read(8192):
                raise jail.PathDeniedError
            fh.seek(0)
            lines, total, truncated = _read_lines(fh, start, end)
        last = start + len(lines) - 1 if lines else start - 1
        return {
            "path": args["path"],
            "startLine": start,
            "endLine": last,
            "totalLines": total,
            "content": "".join(lines),
            "truncated": truncated or last < min(end, total),
        }

    def _put_archive(self, args: dict[str, Any]) -> dict[str, Any]:
        """Unpacks a tar stream into the workspace (see :mod:`patchbox_agent.extract`);
        ``bytes`` is the archive size consumed."""
        from . import extract  # imported on first use: a faster start

        if args.get("stream") is True:
            stream = extract.Chunks(self._reader, None)
        else:
            stream = extract.Chunks(self._reader, _int_arg(args, "size", 0, 0, 1 << 40))
        try:
            count = extract.unpack(stream, self._workspace, self._root_fd)
        except extract.ArchiveRefusedError as exc:
            raise OpError("SANDBOX_FAILED", str(exc)) from exc
        finally:
            stream.drain()
            self._changed()
        return {"entries": count, "bytes": stream.total}

    def preload(self, path: str) -> None:
        """Unpacks the baseline archive at ``path`` (a file or FIFO the controller mounted
        read-only) before the first request; the result goes into the hello answer."""
        from . import extract  # imported on first use: a faster start

        started = time.monotonic()
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError as exc:
            self._preload = {"error": f"cannot open the baseline archive: {exc.strerror}"}
            return
        try:
            root = os.open(self._workspace, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            self._root_fd = root
            self._index = FileIndex(root, self._workspace)
            stream = extract.FileStream(fd)
            count = extract.unpack(stream, self._workspace, root)
            self._preload = {
                "entries": count,
                "bytes": stream.total,
                "ms": int((time.monotonic() - started) * 1000),
            }
        except extract.ArchiveRefusedError as exc:
            self._preload = {"error": str(exc)}
        except (OSError, FrameError) as exc:
            self._preload = {"error": f"baseline archive unreadable: {exc}"}
        finally:
            os.close(fd)

    def _cancel(self, args: dict[str, Any]) -> dict[str, Any]:
        target = _int_arg(args, "target", 0, 0, 1 << 62)
        with self._state_lock:
            proc = self._running.get(target)
            if proc is not None:
                self._cancelled.add(target)
        if proc is not None:
            from . import runner  # loaded already: the run started it

            runner.kill_group(proc)
        return {"cancelled": proc is not None}

    def _run(self, rid: int, args: dict[str, Any]) -> dict[str, Any]:
        argv, env, timeout, cap = _run_args(args)
        track = args.get("trackChanges", False)
        if not isinstance(track, bool):
            raise _bad("trackChanges must be a boolean")
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
        tail, total, timed_out = runner.collect(proc, proc.stdout, started + timeout, cap)
        self._changed()
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


def _run_args(args: dict[str, Any]) -> tuple[list[str], dict[str, str], float, int]:
    argv = args.get("argv")
    if (
        not isinstance(argv, list)
        or not argv
        or not all(isinstance(a, str) and "\x00" not in a for a in argv)
    ):
        raise _bad("argv must be a non-empty list of strings")
    env = args.get("env", {})
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise _bad("env must map strings to strings")
    timeout = args.get("timeoutSeconds", 60)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise _bad("timeoutSeconds must be a number")
    if not 0 < timeout <= MAX_RUN_SECONDS:
        raise _bad("timeoutSeconds out of range")
    cap = _int_arg(args, "outputLimit", DEFAULT_RUN_OUTPUT, 0, MAX_RUN_OUTPUT)
    return argv, env, float(timeout), cap


def _read_lines(fh: IO[bytes], start: int, end: int) -> tuple[list[str], int, bool]:
    """Lines ``start..end`` (bounded in bytes), the total line count, and whether the range
    was cut. The whole file must be UTF-8 text with no NUL and no line over 1 MiB."""
    lines: list[str] = []
    size = 0
    total = 0
    truncated = False
    while True:
        raw = fh.readline(MAX_LINE_BYTES + 1)
        if not raw:
            break
        if len(raw) > MAX_LINE_BYTES or b"\x00" in raw:
            raise jail.PathDeniedError
        total += 1
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise jail.PathDeniedError from exc
        if start <= total <= end and not truncated:
            if size + len(raw) > MAX_READ_BYTES:
                truncated = True
            else:
                lines.append(text)
                size += len(raw)
    return lines, total, truncated


def _glob_arg(args: dict[str, Any]) -> Glob | None:
    pattern = args.get("glob")
    if pattern is None:
        return None
    if not isinstance(pattern, str):
        raise _bad("glob must be a string")
    try:
        return Glob(pattern)
    except GlobError as exc:
        raise _bad(str(exc)) from exc


def _filter_dirs(by_dir: dict[str, list[str]], keep: Glob) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for directory, names in by_dir.items():
        prefix = f"{directory}/" if directory else ""
        kept = [n for n in names if keep(prefix + n)]
        if kept:
            out[directory] = kept
    return out


def _not_dumpable() -> None:
    """Makes the agent non-dumpable, so processes it starts (same uid) cannot open its
    channel through /proc/PID/fd or attach to it."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4
    except (OSError, AttributeError):
        pass


def _on_term(*_: object) -> None:
    """SIGTERM (``docker stop``): the agent, the container's init, ends; the kernel then
    kills every other process of the sandbox."""
    os._exit(143)


HANGUP_GRACE = 1.0
"""How long the agent, once its channel hung up, leaves its request loop to see the end (and
exit with its own status) before it ends anyway."""


def _end_with_channel(in_fd: int) -> None:
    """Ends the agent once its channel hangs up, whatever it is doing then.

    The channel's end is the controller's end: Docker closes the container's stdin when the
    controller's attach stream closes (``StdinOnce``), for any reason, SIGKILL included. The
    request loop sees that end when it next reads; this watch (a thread of its own, blocked
    in ``poll`` on hang-up alone, never on data) also covers the times it does not read:
    while the baseline is unpacked, while the open of a FIFO that nobody will feed waits, and
    during a long call. The agent is the container's init, so its exit ends the sandbox. A
    spare nobody attached to has no hang-up: it waits for its claim or its idle exit.
    """
    poller = select.poll()
    poller.register(in_fd, 0)  # POLLHUP, POLLERR and POLLNVAL are always reported
    while not poller.poll():
        pass
    time.sleep(HANGUP_GRACE)
    os._exit(0)


def main() -> int:
    """Entry point: takes private copies of stdin/stdout and points fds 0 and 1 at /dev/null.

    Nothing the agent starts can then write into the channel by accident. As pid 1 (the
    container's init) the agent also reaps orphans (see :mod:`patchbox_agent.procs`). The
    agent ends when its channel hangs up (:func:`_end_with_channel`).
    """
    _not_dumpable()
    wake = None
    if os.getpid() == 1:
        _signal.signal(_signal.SIGTERM, _on_term)
        wake = procs.install_reaper()
    in_fd = os.dup(0)
    out_fd = os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)
    sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the process
    start_new_thread(_end_with_channel, (in_fd,))
    workspace = os.environ.get("PATCHBOX_WORKSPACE", WORKSPACE)
    agent = Agent(in_fd, out_fd, workspace, wake)
    preload = os.environ.get("PATCHBOX_PRELOAD")
    if preload:
        agent.preload(preload)
    idle = os.environ.get("PATCHBOX_IDLE_EXIT")
    if idle and not select.select([in_fd], [], [], float(idle))[0]:
        return 0  # a spare nobody claimed in time: the container ends (and is removed)
    return agent.serve()
