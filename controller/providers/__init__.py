"""Model providers: the scripted one and the OpenAI-compatible adapters, behind one Protocol.

The names below are imported on first use: a job driven by a calls file never loads the HTTP
stack (httpx and what it brings; docs/performance.md has what that costs at every start).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from controller.errors import CancelledError, DuplicateToolCallIdError, ProviderError
    from controller.providers.base import ModelTurn, Nudgeable, Provider, ToolCall, ToolResult
    from controller.providers.chat import ChatCompletionsProvider
    from controller.providers.config import ProviderConfig
    from controller.providers.openai import SYSTEM_PROMPT, OpenAIProvider
    from controller.providers.responses import ResponsesProvider
    from controller.providers.scripted import (
        CallsFile,
        ScriptedProvider,
        load_calls,
        parse_calls,
        read_calls,
    )

_WHERE = {
    "CancelledError": "controller.errors",
    "DuplicateToolCallIdError": "controller.errors",
    "ProviderError": "controller.errors",
    "ModelTurn": "controller.providers.base",
    "Nudgeable": "controller.providers.base",
    "Provider": "controller.providers.base",
    "ToolCall": "controller.providers.base",
    "ToolResult": "controller.providers.base",
    "ChatCompletionsProvider": "controller.providers.chat",
    "ProviderConfig": "controller.providers.config",
    "SYSTEM_PROMPT": "controller.providers.openai",
    "OpenAIProvider": "controller.providers.openai",
    "ResponsesProvider": "controller.providers.responses",
    "CallsFile": "controller.providers.scripted",
    "ScriptedProvider": "controller.providers.scripted",
    "load_calls": "controller.providers.scripted",
    "parse_calls": "controller.providers.scripted",
    "read_calls": "controller.providers.scripted",
}


if not TYPE_CHECKING:  # the type checker sees the imports above, and nothing else

    def __getattr__(name: str) -> Any:
        where = _WHERE.get(name)
        if where is None:
            msg = f"module {__name__!r} has no attribute {name!r}"
            raise AttributeError(msg)
        return getattr(importlib.import_module(where), name)


def configured_provider(table: Mapping[str, Any]) -> ProviderConfig:
    """The operator's provider: the host configuration's ``[provider]`` table with the
    environment on top, or the environment alone (``UsageError`` naming what is missing)."""
    from controller.providers.config import ProviderConfig

    return ProviderConfig.from_mapping(table) if table else ProviderConfig.from_env()


def provider_given(table: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> bool:
    """Whether the operator gave any provider setting: a ``[provider]`` table, or a variable
    of :data:`~controller.providers.config.ENV_NAMES` other than the key's (a key alone,
    set for other tools, configures nothing)."""
    import os

    from controller.providers.config import ENV_NAMES

    env = os.environ if environ is None else environ
    return bool(table) or any(
        env.get(name) for field, name in ENV_NAMES.items() if field != "api_key"
    )


def open_provider(
    config: ProviderConfig, prompt: str, *, system_prompt: str | None = None
) -> ChatCompletionsProvider | ResponsesProvider:
    """The adapter ``config.api`` names, ready for its first turn; the caller closes it."""
    from controller.providers.chat import ChatCompletionsProvider
    from controller.providers.openai import SYSTEM_PROMPT
    from controller.providers.responses import ResponsesProvider

    prompt_text = system_prompt or SYSTEM_PROMPT
    if config.api == "chat":
        return ChatCompletionsProvider(config, prompt, system_prompt=prompt_text)
    return ResponsesProvider(config, prompt, system_prompt=prompt_text)


__all__ = [
    "SYSTEM_PROMPT",
    "CallsFile",
    "CancelledError",
    "ChatCompletionsProvider",
    "DuplicateToolCallIdError",
    "ModelTurn",
    "Nudgeable",
    "OpenAIProvider",
    "Provider",
    "ProviderConfig",
    "ProviderError",
    "ResponsesProvider",
    "ScriptedProvider",
    "ToolCall",
    "ToolResult",
    "configured_provider",
    "load_calls",
    "open_provider",
    "parse_calls",
    "provider_given",
    "read_calls",
]
