"""What a tool call answers: the result as the model gets it (its bookkeeping left out
unless asked for), a refusal, and the fields the job's ledger reads; a check's result."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, NotRequired, Required, TypedDict, cast

from controller.sandbox.egress import RequestView


class ToolErrorInfo(TypedDict):
    """A call the executor refused, as the model gets it."""

    code: str
    message: str
    retryable: bool


class PatchedFileFields(TypedDict, total=False):
    path: Required[str]
    oldPath: str | None
    sha256After: str | None


class ChangesFields(TypedDict, total=False):
    added: list[str]
    modified: list[str]
    removed: list[str]


class CheckChanges(TypedDict):
    """The files a check changed (:class:`~controller.sandbox.base.FileChanges`)."""

    added: list[str]
    removed: list[str]
    modified: list[str]
    count: int


class CheckOutput(TypedDict):
    """A check run as the model (and the evidence) gets it."""

    verdict: str
    """The check's own verdict in words (:func:`verdict`): ``tests: failed, exit 1``."""
    checkId: str
    status: Literal["passed", "failed", "timed_out"]
    exitCode: int | None
    signal: int | None
    durationMs: int
    output: str
    outputTruncated: bool
    changes: CheckChanges | None
    reused: bool
    argv: list[str]
    """The command that ran, each declared argument replaced by its values."""
    network: NotRequired[list[RequestView]]
    """Every request it made through the job's proxy (a check with an ``egress``)."""


class ResultFields(TypedDict, total=False):
    """What the job's ledger reads of a result (each tool's result has some of these)."""

    path: str
    sha256After: str
    files: list[PatchedFileFields]
    changes: ChangesFields | None
    version: int
    reused: bool


@dataclass(frozen=True)
class ToolOutcome:
    """What the model gets back for one call, plus what the ledger needs."""

    turn: int
    call_id: str
    tool: str
    ok: bool
    result: dict[str, Any] | None = None
    """The result's JSON object, as the model gets it (the agent's camelCase keys)."""
    error: ToolErrorInfo | None = None
    effect: str = "none"
    """``none``, ``write`` (workspace changed) or ``process`` (a check ran)."""
    details: bool = False
    """The call asked for the result's bookkeeping (``details``): hashes, versions, counts."""

    def for_model(self) -> Mapping[str, object]:
        """What the model gets: ``{"result": ...}`` (the result as :func:`shown` shows it)
        for a call that ran, ``{"error": ...}`` for a refused one. A check that ran is a
        result whatever its verdict: its ``verdict`` says how the check itself went."""
        if self.ok:
            return {"result": shown(self.tool, self.result or {}, details=self.details)}
        return {"error": self.error}

    @property
    def verdict(self) -> str | None:
        """A check run's own verdict (``tests: failed, exit 1``); None for other calls."""
        if not self.ok or self.tool != "run_check" or self.result is None:
            return None
        value = self.result.get("verdict")
        return value if isinstance(value, str) else None

    @property
    def fields(self) -> ResultFields:
        """The fields of the result the ledger reads (none for a refused call)."""
        return cast("ResultFields", self.result or {})


BOOKKEEPING: dict[str, frozenset[str]] = {
    "list_files": frozenset({"version"}),
    "search_text": frozenset({"filesScanned", "version", "cached"}),
    "replace_text": frozenset({"sha256Before", "sha256After", "version"}),
    "apply_patch": frozenset({"version"}),
}
"""The result fields a model does not need unless it asks (``details``); the job's ledger
reads them from the whole result either way."""
FILE_BOOKKEEPING = frozenset({"sha256Before", "sha256After"})
"""The same for each file of an ``apply_patch`` result."""


def shown(tool: str, result: Mapping[str, Any], *, details: bool = False) -> dict[str, Any]:
    """A result as the model gets it: without the bookkeeping of :data:`BOOKKEEPING` unless
    ``details``; a check's result without its empty fields (no signal, no changes, not
    reused)."""
    if tool == "run_check":
        empty = {"signal": None, "changes": None, "reused": False}
        return {k: v for k, v in result.items() if k not in empty or empty[k] != v}
    if details:
        return dict(result)
    hidden = BOOKKEEPING.get(tool, frozenset())
    out = {k: v for k, v in result.items() if k not in hidden}
    if tool == "apply_patch" and isinstance(out.get("files"), list):
        out["files"] = [
            {k: v for k, v in f.items() if k not in FILE_BOOKKEEPING} if isinstance(f, dict) else f
            for f in out["files"]
        ]
    return out


def numbered(content: str, first: int) -> str:
    """``content``'s lines, each after its number (from ``first``) and a tab."""
    lines = content.splitlines(keepends=True)
    return "".join(f"{first + n}\t{line}" for n, line in enumerate(lines))
