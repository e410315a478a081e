"""The hunk grammar of a unified diff: a ``@@ -a,b +c,d @@`` header, its body of `` ``,
``-`` and ``+`` lines with their ``\\ No newline at end of file`` markers, held to the
header's counts; hunks in order, not overlapping, their new positions consistent. Also the
line-level errors every part of the parser raises (:func:`stray`, :func:`no_cr`).

Used by :mod:`patchbox_agent.diffs` (the parser of whole diffs, which lists the reason
codes). Pure and standard-library only (python >= 3.9).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import cast

from .patch import DiffError, Hunk, Op, op_of
from .patching import lines_before

DIFF_GIT = "diff --git "
_OPS: dict[str, Op] = {" ": " ", "-": "-", "+": "+"}
_NO_EOL = "\\ No newline at end of file"
_HUNK_RE = re.compile(
    r"@@ -([0-9]{1,9})(?:,([0-9]{1,9}))? \+([0-9]{1,9})(?:,([0-9]{1,9}))? @@(?: (.*))?"
)
_RUN_RE = re.compile(r"[ +\-\\]*")


def stray(line: str, lineno: int, default: str = "garbage") -> DiffError:
    """The error for a line that is not part of the diff where it stands."""
    stripped = line.lstrip()
    if stripped.startswith(("```", "~~~")):
        return DiffError("fence", f"markdown fence on line {lineno}")
    if stripped.startswith("*** "):
        return DiffError("begin_patch", f"'*** ...' patch wrapper on line {lineno}")
    return DiffError(default, f"unexpected text on line {lineno}")


def leftover(line: str, lineno: int) -> DiffError:
    """The error for a line after the last hunk of a section."""
    if line[:1] in (" ", "-", "+"):
        return DiffError("hunk_count_mismatch", f"line {lineno} beyond the hunk's counts")
    if line.startswith("\\"):
        return DiffError("bad_hunk", f"misplaced marker on line {lineno}")
    return stray(line, lineno)


def no_cr(line: str, lineno: int) -> None:
    if line.endswith("\r"):
        raise DiffError("crlf_header", f"CR at the end of header line {lineno}")


@dataclass
class _Body:
    old_left: int
    new_left: int
    lines: list[tuple[Op, str]] = field(default_factory=list)
    old_no_eol: bool = False
    new_no_eol: bool = False

    def open(self) -> bool:
        return self.old_left > 0 or self.new_left > 0

    def take(self, line: str, lineno: int) -> None:
        op = line[:1]
        if op not in (" ", "-", "+"):
            if line.startswith(("@@", DIFF_GIT)):
                raise DiffError("hunk_count_mismatch", f"hunk ends early on line {lineno}")
            raise stray(line, lineno, "bad_hunk")
        old, new = op != "+", op != "-"
        if (old and self.old_left == 0) or (new and self.new_left == 0):
            raise DiffError("hunk_count_mismatch", f"line {lineno} beyond the hunk's counts")
        self.old_left -= old
        self.new_left -= new
        self.lines.append((_OPS[op], line[1:]))

    def run(self, sec: list[str], i: int, base: int) -> int:
        """Takes the hunk's lines from ``sec[i]`` on, with their markers, until its counts
        are met or the section ends; returns the index after the last line taken. Same
        checks as :meth:`take`, with the common lines handled without a call each."""
        old_left, new_left, lines, n = self.old_left, self.new_left, self.lines, len(sec)
        while (old_left or new_left) and i < n:
            line = sec[i]
            op = line[:1]
            if op == " " and old_left and new_left:
                old_left -= 1
                new_left -= 1
                lines.append((" ", line[1:]))
            elif op == "-" and old_left:
                old_left -= 1
                lines.append(("-", line[1:]))
            elif op == "+" and new_left:
                new_left -= 1
                lines.append(("+", line[1:]))
            else:
                self.old_left, self.new_left = old_left, new_left
                self.take(line, base + i)  # refuses this line
                old_left, new_left = self.old_left, self.new_left
            i += 1
            if i < n and sec[i][:1] == "\\":
                self.old_left, self.new_left = old_left, new_left
                self.mark(sec[i], base + i)
                i += 1
        self.old_left, self.new_left = old_left, new_left
        return i

    def mark(self, line: str, lineno: int) -> None:
        """A ``\\ No newline at end of file`` after the last line of its side(s)."""
        no_cr(line, lineno)
        if line != _NO_EOL:
            raise DiffError("bad_hunk", f"unknown marker line {lineno}")
        op = self.lines[-1][0]
        if op in " -":
            if self.old_left or self.old_no_eol:
                raise DiffError("bad_hunk", f"misplaced marker on line {lineno}")
            self.old_no_eol = True
        if op in " +":
            if self.new_left or self.new_no_eol:
                raise DiffError("bad_hunk", f"misplaced marker on line {lineno}")
            self.new_no_eol = True


def _hunk_header(line: str, lineno: int) -> tuple[int, int, int, int, str]:
    no_cr(line, lineno)
    m = _HUNK_RE.fullmatch(line)
    if m is None:
        raise DiffError("bad_hunk", f"malformed hunk header on line {lineno}")
    old_start, new_start = int(m.group(1)), int(m.group(3))
    old_len = 1 if m.group(2) is None else int(m.group(2))
    new_len = 1 if m.group(4) is None else int(m.group(4))
    if (old_len and not old_start) or (new_len and not new_start):
        raise DiffError("bad_hunk", f"hunk starts at line 0 on line {lineno}")
    return old_start, old_len, new_start, new_len, m.group(5) or ""


def _whole_run(
    sec: list[str], ops: str, i: int, base: int, counts: tuple[int, int]
) -> tuple[_Body, int] | None:
    """The common hunk in one step: when the lines from ``sec[i]`` on are a run of
    `` ``/``-``/``+`` lines, each followed by at most one marker line, that holds exactly
    the header's ``counts`` (old, new), :meth:`_Body.run` takes that whole run and nothing
    else (each line uses up at least one count, so they run out at its last line and not
    before), with each marker checked against the counts left where it stands. Returns
    that body and the index after it; None when the hunk needs the line-by-line reading
    (it finds the error)."""
    m = _RUN_RE.match(ops, i)
    end = m.end() if m is not None else i
    run = ops[i:end]
    removed, added = run.count("-"), run.count("+")
    context = run.count(" ")
    if not run or run[0] == "\\" or "\\\\" in run:
        return None
    if context + removed != counts[0] or context + added != counts[1]:
        return None
    body = _Body(0, 0)
    lines, k = body.lines, 0
    while True:
        marker = run.find("\\", k)
        stop = len(run) if marker < 0 else marker
        texts = [line[1:] for line in sec[i + k : i + stop]]
        pairs = zip(run[k:stop], texts)  # noqa: B905 - python 3.9; one length by construction
        lines += cast("list[tuple[Op, str]]", list(pairs))
        if marker < 0:
            break
        before = run[:marker]
        body.old_left = counts[0] - before.count(" ") - before.count("-")
        body.new_left = counts[1] - before.count(" ") - before.count("+")
        body.mark(sec[i + marker], base + i + marker)
        k = marker + 1
    body.old_left = body.new_left = 0
    return body, end


def _read_hunk(sec: list[str], ops: str, i: int, base: int) -> tuple[Hunk, int]:
    old_start, old_len, new_start, new_len, section = _hunk_header(sec[i], base + i)
    header_line = base + i
    whole = _whole_run(sec, ops, i + 1, base, (old_len, new_len))
    if whole is not None:
        body, i = whole
    else:
        body = _Body(old_len, new_len)
        i = body.run(sec, i + 1, base)
        if body.open():
            raise DiffError("hunk_count_mismatch", f"hunk on line {header_line} is short")
    if old_len == new_len and all(op == " " for op in map(op_of, body.lines)):
        raise DiffError("bad_hunk", f"hunk on line {header_line} changes nothing")
    hunk = Hunk(
        old_start=old_start,
        old_len=old_len,
        new_start=new_start,
        new_len=new_len,
        lines=tuple(body.lines),
        old_no_eol=body.old_no_eol,
        new_no_eol=body.new_no_eol,
        section=section,
    )
    return hunk, i


def read_hunks(sec: list[str], i: int, base: int) -> tuple[list[Hunk], int]:
    hunks: list[Hunk] = []
    delta = 0
    # The first character of every line (``?`` for an empty one), for _whole_run.
    ops = "".join([line[:1] or "?" for line in sec])
    while i < len(sec) and sec[i].startswith("@@"):
        lineno = base + i
        hunk, i = _read_hunk(sec, ops, i, base)
        pos = lines_before(hunk.old_start, hunk.old_len)
        if hunks:
            last = hunks[-1]
            if last.old_no_eol or last.new_no_eol:
                raise DiffError("bad_hunk", f"hunk after the end of the file on line {lineno}")
            if pos <= lines_before(last.old_start, last.old_len) + last.old_len:
                raise DiffError("bad_hunk", f"hunk out of order or overlapping on line {lineno}")
        if lines_before(hunk.new_start, hunk.new_len) != pos + delta:
            raise DiffError("bad_hunk", f"inconsistent new position on line {lineno}")
        delta += hunk.new_len - hunk.old_len
        hunks.append(hunk)
    return hunks, i
