"""Model providers: the scripted one and the OpenAI-compatible adapters, behind one Protocol."""

from __future__ import annotations

from controller.errors import CancelledError, DuplicateToolCallIdError, ProviderError
from controller.providers.base import ModelTurn, Provider, ToolCall, ToolResult
from controller.providers.chat import ChatCompletionsProvider
from controller.providers.config import ProviderConfig
from controller.providers.openai import SYSTEM_PROMPT, OpenAIProvider
from controller.providers.responses import ResponsesProvider
from controller.providers.scripted import CallsFile, ScriptedProvider, load_calls, parse_calls


def open_provider(
    config: ProviderConfig, prompt: str, *, system_prompt: str = SYSTEM_PROMPT
) -> OpenAIProvider:
    """The adapter ``config.api`` names, ready for its first turn; the caller closes it."""
    kind = ChatCompletionsProvider if config.api == "chat" else ResponsesProvider
    return kind(config, prompt, system_prompt=system_prompt)


__all__ = [
    "SYSTEM_PROMPT",
    "CallsFile",
    "CancelledError",
    "ChatCompletionsProvider",
    "DuplicateToolCallIdError",
    "ModelTurn",
    "OpenAIProvider",
    "Provider",
    "ProviderConfig",
    "ProviderError",
    "ResponsesProvider",
    "ScriptedProvider",
    "ToolCall",
    "ToolResult",
    "load_calls",
    "open_provider",
    "parse_calls",
]
