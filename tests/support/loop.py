"""Fake tools for the tool loop: each call answered by tool name, no sandbox."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from controller.errors import SandboxError
from controller.tools.outcome import ToolOutcome


@dataclass
class FakeTools:
    """Answers each call from ``results`` by tool name (a default ``{}``); ``raises`` names
    a call id that raises as a broken sandbox would."""

    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    raises: str = ""
    effects: dict[str, str] = field(
        default_factory=lambda: {"replace_text": "write", "run_check": "process"}
    )

    def execute(self, turn: int, call_id: str, tool: str, raw: str) -> ToolOutcome:  # noqa: ARG002 - the Tools protocol
        if call_id == self.raises:
            raise SandboxError("the sandbox is gone")
        result = self.results.get(tool, {})
        ok = "error" not in result
        return ToolOutcome(
            turn,
            call_id,
            tool,
            ok,
            result=result if ok else None,
            error=result.get("error"),
            effect=self.effects.get(tool, "none") if ok else "none",
        )
