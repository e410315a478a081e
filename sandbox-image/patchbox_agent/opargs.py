"""The operations' arguments read and checked (an :class:`OpError` for a bad one), and the
line reader ``read_file`` bounds."""

from __future__ import annotations

from . import jail
from .bounds import (
    DEFAULT_RUN_OUTPUT,
    MAX_LINE_BYTES,
    MAX_READ_BYTES,
    MAX_RUN_OUTPUT,
    MAX_RUN_SECONDS,
    NOT_TEXT,
)
from .globs import Glob, GlobError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import IO, Any


class OpError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def bad(message: str) -> OpError:
    return OpError("TOOL_ARGUMENTS_INVALID", message)


def int_arg(args: dict[str, Any], key: str, default: int, lo: int, hi: int) -> int:
    value = args.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise bad(f"{key} must be an integer in [{lo}, {hi}]")
    return value


def run_args(args: dict[str, Any]) -> tuple[list[str], dict[str, str], float, int]:
    argv = args.get("argv")
    if (
        not isinstance(argv, list)
        or not argv
        or not all(isinstance(a, str) and "\x00" not in a for a in argv)
    ):
        raise bad("argv must be a non-empty list of strings")
    env = args.get("env", {})
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise bad("env must map strings to strings")
    timeout = args.get("timeoutSeconds", 60)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise bad("timeoutSeconds must be a number")
    if not 0 < timeout <= MAX_RUN_SECONDS:
        raise bad("timeoutSeconds out of range")
    cap = int_arg(args, "outputLimit", DEFAULT_RUN_OUTPUT, 0, MAX_RUN_OUTPUT)
    return argv, env, float(timeout), cap


def read_lines(fh: IO[bytes], start: int, end: int) -> tuple[list[str], int, bool]:
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
            raise jail.PathDeniedError(NOT_TEXT)
        total += 1
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise jail.PathDeniedError(NOT_TEXT) from exc
        if start <= total <= end and not truncated:
            if size + len(raw) > MAX_READ_BYTES:
                truncated = True
            else:
                lines.append(text)
                size += len(raw)
    return lines, total, truncated


def glob_arg(args: dict[str, Any]) -> Glob | None:
    pattern = args.get("glob")
    if pattern is None:
        return None
    if not isinstance(pattern, str):
        raise bad("glob must be a string")
    try:
        return Glob(pattern)
    except GlobError as exc:
        raise bad(str(exc)) from exc


def filter_dirs(by_dir: dict[str, list[str]], keep: Glob) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for directory, names in by_dir.items():
        prefix = f"{directory}/" if directory else ""
        kept = [n for n in names if keep(prefix + n)]
        if kept:
            out[directory] = kept
    return out
