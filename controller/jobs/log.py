"""A job's record on disk: one append-only log, ``$PATCHBOX_HOME/jobs/JOB/log.jsonl``.

Its first line is ``{"record_format": 2}``. Each save appends one group of JSON lines, in
one write:

- ``{"add": LIST, "item": ITEM}`` for each item of the record's lists (its state changes,
  tool calls, transcript turns, ledger entries, files, flagged lines, checks) that the log
  does not hold yet, in the order made; ``{"set": LIST, "items": [ITEM, ...]}`` for a list
  replaced whole;
- then ``{"saved": {FIELD: VALUE, ...}}``, the record's other fields (state, error,
  decision, baseline, task, ...) that the save changed (all of them in a record's first
  save). This line ends the save.

The record is the log replayed: the lists' entries in order and, for every other field, the
last value a ``saved`` line gave it. A save costs what it adds (a turn's transcript, not the
whole record again), so the bytes of a job's record grow with its transcript, linearly.

Crash safety and readers: only whole saves count. A reader replays up to the last
``saved`` line and ignores what follows it (the rest of a save being written, or a save a
crash cut short; a torn last line is dropped), so it sees the record as one save left it,
never half of the next; readers take no lock. A durable save (every state change) fsyncs
the log and its folder; the tool loop's save after each turn does not (a killed process
loses nothing, a power loss may bring back the record of an earlier turn).

Writers: each save holds an exclusive ``flock`` of the log and first cuts off anything after
the last ``saved`` line, so saves of one job from several processes (the job's own,
``apply``, ``revert``, an ``INTERRUPTED`` mark) each keep their entries and the log stays a
sequence of whole saves. This process remembers, for each record it loaded or saved, what
of its lists is in the log and the fields it saved; a record it does not know (a new job,
one read from a ``job.json`` of record format 1) is taken to begin with the log's lists, and
its first save writes every field.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import threading
import weakref
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar, get_args

from pydantic import BaseModel, TypeAdapter, ValidationError

from controller.errors import UsageError

LOG_FILE = "log.jsonl"
RECORD_FORMAT = 2
"""The log's format; 1 was a whole ``job.json``, replaced at every save."""
HEADER = b'{"record_format":%d}\n' % RECORD_FORMAT

M = TypeVar("M", bound=BaseModel)


def write_atomic(path: Path, data: bytes, *, durable: bool = True) -> None:
    """Temp file in the same folder, fsync, rename, fsync of the folder (without the two
    fsyncs unless ``durable``)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    with tmp.open("wb") as out:
        out.write(data)
        out.flush()
        if durable:
            os.fsync(out.fileno())
    tmp.replace(path)
    if not durable:
        return
    _fsync_folder(path.parent)


class RecordLogError(ValueError):
    """A job's log cannot be read: a line before its last one that is no entry."""


@dataclass(frozen=True)
class Saved:
    """What one save appended."""

    bytes: int
    entries: int
    """Lines, its ``saved`` line included."""


@dataclass
class _Replay:
    """What whole saves a stretch of log holds."""

    lists: dict[str, list[Any]] = field(default_factory=dict)
    """The lists' items (for a stretch from the log's start: the lists)."""
    fields: dict[str, Any] = field(default_factory=dict)
    """Every other field, as the last ``saved`` line that names it gives it."""
    counts: dict[str, int] = field(default_factory=dict)
    size: int = 0
    """Bytes up to the end of the last ``saved`` line."""
    saves: int = 0


@dataclass
class _Mark:
    """What this process knows the log holds of a record, as of its last load or save."""

    ref: weakref.ref[BaseModel]
    folder: Path
    size: int
    """The log's size then: a save finding it so has nothing of another writer to settle."""
    held: dict[str, int]
    """Of each of the record's lists, how many items are in the log."""
    last: dict[str, object]
    """The last of those items (a list that no longer has it there was replaced)."""
    fields: Mapping[str, Any]
    """The other fields as saved (JSON values)."""
    fields_json: bytes = b""
    """The same as JSON text, when this process wrote them (a save that finds them so has
    no field to write)."""


class RecordLog(Generic[M]):
    """Reads and writes records of ``model`` whose ``lists`` (fields of type ``list[X]``)
    are appended to, one item per line; one instance per model, shared by every store of
    the process."""

    def __init__(self, model: type[M], lists: Sequence[str]) -> None:
        self.model = model
        self.lists = tuple(lists)
        self._items: dict[str, TypeAdapter[Any]] = {}
        for name in self.lists:
            (item,) = get_args(model.model_fields[name].annotation)
            self._items[name] = TypeAdapter(item)
        self._exclude = set(self.lists)
        self._add = {name: b'{"add":"%s","item":' % name.encode() for name in self.lists}
        self._marks: dict[int, _Mark] = {}
        self._guard = threading.Lock()

    # -- reading ------------------------------------------------------------------------

    def read(self, folder: Path) -> M | None:
        """The record in ``folder``'s log as its last whole save left it (None when there is
        no log, or no save in it)."""
        try:
            data = (folder / LOG_FILE).read_bytes()
        except FileNotFoundError:
            return None
        replay = self._replay(data, folder, start=True)
        if not replay.saves:
            return None
        try:
            record = self.model.model_validate({**replay.fields, **replay.lists})
        except ValidationError as exc:
            msg = f"the log of {folder.name} does not make a record: {exc}"
            raise RecordLogError(msg[:2000]) from exc
        self._remember(record, folder, replay.size, replay.fields)
        return record

    def _replay(self, data: bytes, folder: Path, *, start: bool) -> _Replay:
        """The whole saves in ``data`` (the log from its ``start``, or from the end of a
        save): what follows the last ``saved`` line is not one (a torn last line included).
        A line that is no entry fails, unless it is the last."""
        out = _Replay()
        pending: list[tuple[str, list[Any], bool]] = []
        offset = 0
        lines = data.split(b"\n")
        lines.pop()  # after the last newline: nothing, or a torn line
        if start and lines:
            _check_header(lines[0], folder)
            offset = len(lines[0]) + 1
            lines = lines[1:]
        for number, line in enumerate(lines, 1):
            offset += len(line) + 1
            try:
                entry = self._entry(line)
            except RecordLogError:
                if number == len(lines):
                    break
                raise
            if isinstance(entry, dict):
                for name, items, replace in pending:
                    if replace:
                        out.lists[name] = items
                        out.counts[name] = len(items)
                    else:
                        out.lists.setdefault(name, []).extend(items)
                        out.counts[name] = out.counts.get(name, 0) + len(items)
                pending.clear()
                out.fields.update(entry)
                out.size, out.saves = offset, out.saves + 1
            else:
                pending.append(entry)
        return out

    def _entry(self, line: bytes) -> tuple[str, list[Any], bool] | dict[str, Any]:
        """One log line: a list's items (and whether they replace it), or the fields of a
        ``saved`` line."""
        try:
            entry = json.loads(line)
        except ValueError as exc:
            msg = f"a log line is not JSON: {line[:80]!r}"
            raise RecordLogError(msg) from exc
        keys = set(entry) if isinstance(entry, dict) else set()
        if keys == {"saved"} and isinstance(entry["saved"], dict):
            if self._exclude.intersection(entry["saved"]):
                msg = f"a saved line names a list: {line[:80]!r}"
                raise RecordLogError(msg)
            return dict(entry["saved"])
        if keys == {"add", "item"}:
            name, items, replace = entry["add"], [entry["item"]], False
        elif keys == {"set", "items"}:
            name, items, replace = entry["set"], entry["items"], True
        else:
            msg = f"a log line is not an entry: {line[:80]!r}"
            raise RecordLogError(msg)
        if name not in self._items or not isinstance(items, list):
            msg = f"a log line names no list of the record: {line[:80]!r}"
            raise RecordLogError(msg)
        return name, items, replace

    # -- writing ------------------------------------------------------------------------

    def write(self, folder: Path, record: M, *, durable: bool, fields: bool = True) -> Saved:
        """Appends one save of ``record``: the new items of its lists, then its changed
        fields (fsynced with the log's folder when ``durable``). Without ``fields``, a save
        whose caller changed only lists: its fields are not looked at (the next save with
        them writes any change)."""
        with _locked_log(folder) as fd:
            size = os.fstat(fd).st_size
            mark = self._mark_of(record, folder)
            if mark is not None and mark.size > size:  # the log lost its end: start again
                mark = None
            counts: Mapping[str, int] = {}
            if mark is None:
                replay = self._replay(_read_from(fd, 0), folder, start=True)
                counts, size = replay.counts, _cut(fd, replay.size, size)
            elif mark.size != size:  # another writer saved since, or one was cut short
                tail = self._replay(_read_from(fd, mark.size), folder, start=False)
                size = _cut(fd, mark.size + tail.size, size)
            lines = [HEADER] if size == 0 else []
            lines += self._new_lines(record, mark, counts)
            if mark is not None and not fields:
                now, now_json, saved = mark.fields, mark.fields_json, b'{"saved":{}}\n'
            else:
                now, now_json, saved = self._fields(record, mark)
            lines.append(saved)
            data = b"".join(lines)
            _write_all(fd, data)
            if durable:
                os.fsync(fd)
                _fsync_folder(folder)
            self._remember(record, folder, size + len(data), now, now_json)
        return Saved(bytes=len(data), entries=len(lines))

    def _fields(self, record: M, mark: _Mark | None) -> tuple[Mapping[str, Any], bytes, bytes]:
        """The record's other fields (as JSON values, and as JSON text), and the ``saved``
        line naming those that changed since ``mark``."""
        now_json = record.model_dump_json(exclude=self._exclude).encode()
        if mark is not None and now_json == mark.fields_json:
            return mark.fields, now_json, b'{"saved":{}}\n'
        now = record.model_dump(mode="json", exclude=self._exclude)
        changed = _changed({} if mark is None else mark.fields, now)
        return (
            now,
            now_json,
            b'{"saved":%s}\n' % json.dumps(changed, separators=(",", ":")).encode(),
        )

    def _new_lines(self, record: M, mark: _Mark | None, counts: Mapping[str, int]) -> list[bytes]:
        """Lines for what the log does not hold of ``record``'s lists."""
        lines: list[bytes] = []
        for name in self.lists:
            items: list[Any] = getattr(record, name)
            adapter = self._items[name]
            held = counts.get(name, 0) if mark is None else mark.held.get(name, 0)
            kept = len(items) >= held
            if kept and mark is not None and held:
                last = mark.last.get(name)
                kept = items[held - 1] is last or items[held - 1] == last
            if kept:
                add = self._add[name]
                lines += [add + adapter.dump_json(item) + b"}\n" for item in items[held:]]
            else:
                dumped = b",".join(adapter.dump_json(item) for item in items)
                lines.append(b'{"set":"%s","items":[%s]}\n' % (name.encode(), dumped))
        return lines

    # -- what this process knows of a record ----------------------------------------------

    def knows(self, record: M, folder: Path) -> bool:
        """Whether ``record`` was loaded from or saved to ``folder``'s log by this process."""
        return self._mark_of(record, folder) is not None

    def _mark_of(self, record: M, folder: Path) -> _Mark | None:
        mark = self._marks.get(id(record))
        if mark is None or mark.ref() is not record or mark.folder != folder:
            return None
        return mark

    def _remember(
        self,
        record: M,
        folder: Path,
        size: int,
        fields: Mapping[str, Any],
        fields_json: bytes = b"",
    ) -> None:
        lists = [(name, getattr(record, name)) for name in self.lists]
        held = {name: len(items) for name, items in lists}
        last = {name: items[-1] for name, items in lists if items}
        mark = self._mark_of(record, folder)
        if mark is not None:
            mark.size, mark.held, mark.last = size, held, last
            mark.fields, mark.fields_json = fields, fields_json
            return
        key = id(record)
        with self._guard:
            known = self._marks.get(key)
            if known is None or known.ref() is not record:
                weakref.finalize(record, self._marks.pop, key, None)
            self._marks[key] = _Mark(weakref.ref(record), folder, size, held, last, fields)
            self._marks[key].fields_json = fields_json


def _changed(before: Mapping[str, Any], now: dict[str, Any]) -> dict[str, Any]:
    """The fields of ``now`` that differ from ``before``; null for one it no longer has."""
    changed = {k: v for k, v in now.items() if k not in before or before[k] != v}
    changed.update((k, None) for k in before.keys() - now.keys() if before[k] is not None)
    return changed


def _check_header(line: bytes, folder: Path) -> None:
    """The log's first line: its format, ``USAGE_ERROR`` for one this version does not read."""
    try:
        header = json.loads(line)
    except ValueError:
        header = None
    version = header.get("record_format") if isinstance(header, dict) else None
    if not isinstance(version, int) or set(header) != {"record_format"}:
        msg = f"the log of {folder.name} does not start with its record format: {line[:80]!r}"
        raise RecordLogError(msg)
    if version != RECORD_FORMAT:
        msg = (
            f"job {folder.name} was written in record format {version}; this patchbox reads "
            f"formats 1 (job.json) and {RECORD_FORMAT} (log.jsonl)"
        )
        raise UsageError(msg)


def _read_from(fd: int, offset: int) -> bytes:
    size = os.fstat(fd).st_size
    return os.pread(fd, max(size - offset, 0), offset)


def _cut(fd: int, end: int, size: int) -> int:
    """Cuts the log after its last whole save (at ``end``); returns its size."""
    if end < size:
        os.ftruncate(fd, end)
    return end


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _fsync_folder(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def _locked_log(folder: Path) -> Iterator[int]:
    """The log, opened to append, under an exclusive lock (the kernel drops it with the
    process)."""
    fd = os.open(folder / LOG_FILE, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield fd
    finally:
        os.close(fd)
