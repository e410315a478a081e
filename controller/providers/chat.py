"""OpenAI-compatible Chat Completions: ``POST {base}/chat/completions``.

The conversation is a ``messages`` list: the system prompt, the task as the user message,
then for each turn the assistant message (with its ``tool_calls``) followed by one
``role: tool`` message per result (a nudge, :meth:`OpenAIProvider.nudge`, is a user message).
Only the first choice is read. A streamed answer must end with ``data: [DONE]``: one that
ends before it was cut short, a disconnect that is retried. Tool calls are assembled from
their deltas by ``index``.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from controller.errors import ProviderError, TransientProviderError
from controller.providers.base import ModelTurn, ToolCall, ToolResult, new_turn
from controller.providers.config import ProviderConfig
from controller.providers.items import AssistantMessage, ChatBody, ChatItem, ChatTool, Message
from controller.providers.openai import SYSTEM_PROMPT, OpenAIProvider
from controller.providers.replies import (
    Reply,
    Wire,
    decode_json,
    error_code,
    parse_with,
    sse_events,
    usage_counts,
)
from controller.tools.schemas import ToolSchema, tool_schemas

MAX_TOOL_CALLS = 1024
"""The highest tool-call index accepted in a stream, plus one."""

_USAGE_NAMES = {
    "prompt_tokens": "input_tokens",
    "completion_tokens": "output_tokens",
    "total_tokens": "total_tokens",
}


class _Usage(Wire):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    total_tokens: int | None = None


class _Function(Wire):
    name: str
    arguments: str


class _ToolCall(Wire):
    id: str
    type: Literal["function"] = "function"
    function: _Function


class _Message(Wire):
    content: str | None = None
    tool_calls: list[_ToolCall] | None = None


class _Choice(Wire):
    message: _Message


class _Completion(Wire):
    choices: list[_Choice] = Field(min_length=1)
    usage: _Usage | None = None


class _FunctionDelta(Wire):
    name: str | None = None
    arguments: str | None = None


class _ToolCallDelta(Wire):
    index: int = Field(ge=0, lt=MAX_TOOL_CALLS)
    id: str | None = None
    type: Literal["function"] | None = None
    function: _FunctionDelta | None = None


class _Delta(Wire):
    content: str | None = None
    tool_calls: list[_ToolCallDelta] | None = None


class _ChunkChoice(Wire):
    index: int = 0
    delta: _Delta


class _Chunk(Wire):
    choices: list[_ChunkChoice] = Field(default_factory=list)
    usage: _Usage | None = None


def _call(call_id: str, name: str, arguments: str) -> ToolCall:
    return parse_with(ToolCall, {"id": call_id, "name": name, "arguments": arguments}, "tool call")


class ChatCompletionsProvider(OpenAIProvider[ChatItem]):
    """A :class:`~controller.providers.base.Provider` over Chat Completions."""

    label = "chat completions"
    path: ClassVar[str] = "/chat/completions"

    def __init__(
        self, config: ProviderConfig, prompt: str, *, system_prompt: str = SYSTEM_PROMPT
    ) -> None:
        super().__init__(config, prompt, system_prompt=system_prompt)
        self._messages: list[ChatItem] = [
            {"role": "system", "content": self._system_prompt},
            {"role": "user", "content": self._prompt},
        ]
        self._tools: list[ChatTool] = []
        self._offer(tool_schemas())

    def _offer(self, tools: list[ToolSchema]) -> None:
        self._messages[0] = {"role": "system", "content": self._system_prompt}
        self._tools = [{"type": "function", "function": schema} for schema in tools]

    @staticmethod
    def _result_items(results: list[ToolResult]) -> list[ChatItem]:
        return [{"role": "tool", "tool_call_id": r.call_id, "content": r.content} for r in results]

    @staticmethod
    def _user_item(text: str) -> Message:
        return {"role": "user", "content": text}

    def _body(self, items: list[ChatItem]) -> ChatBody:
        body: ChatBody = {
            "model": self._config.model,
            "messages": self._messages + items,
            "tools": self._tools,
            "stream": self._config.stream,
        }
        if self._config.stream:
            body["stream_options"] = {"include_usage": True}
        return body

    def _commit(self, items: list[ChatItem], answer: list[ChatItem]) -> None:
        self._messages.extend(items)
        self._messages.extend(answer)

    def _parse(self, reply: Reply) -> tuple[ModelTurn, list[ChatItem]]:
        if reply.content_type == "text/event-stream":
            calls, text, usage = self._parse_stream(reply.body)
        else:
            calls, text, usage = self._parse_json(reply.body)
        turn = new_turn(calls, text or None, usage_counts(usage, _USAGE_NAMES, len(reply.body)))
        message: AssistantMessage = {"role": "assistant", "content": turn.text}
        if turn.tool_calls:
            message["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                }
                for c in turn.tool_calls
            ]
        return turn, [message]

    @staticmethod
    def _parse_json(body: bytes) -> tuple[list[ToolCall], str | None, _Usage | None]:
        completion = parse_with(_Completion, decode_json(body, "answer"), "answer")
        message = completion.choices[0].message
        calls = [
            _call(c.id, c.function.name, c.function.arguments) for c in message.tool_calls or []
        ]
        return calls, message.content, completion.usage

    @staticmethod
    def _parse_stream(body: bytes) -> tuple[list[ToolCall], str | None, _Usage | None]:
        text: list[str] = []
        parts: dict[int, _Assembly] = {}
        usage: _Usage | None = None
        for chunk in _chunks(body):
            usage = chunk.usage or usage
            for choice in chunk.choices:
                if choice.index != 0:
                    continue
                if choice.delta.content:
                    text.append(choice.delta.content)
                for delta in choice.delta.tool_calls or []:
                    parts.setdefault(delta.index, _Assembly()).add(delta)
        calls = [parts[index].call(index) for index in sorted(parts)]
        return calls, "".join(text) or None, usage


class _Assembly:
    """One streamed tool call, put together from its deltas."""

    def __init__(self) -> None:
        self.id = ""
        self.name = ""
        self.arguments: list[str] = []

    def add(self, delta: _ToolCallDelta) -> None:
        self.id = self.id or (delta.id or "")
        if delta.function is not None:
            self.name = self.name or (delta.function.name or "")
            self.arguments.append(delta.function.arguments or "")

    def call(self, index: int) -> ToolCall:
        if not self.id or not self.name:
            raise ProviderError(f"streamed tool call {index} has no id or name")
        return _call(self.id, self.name, "".join(self.arguments))


def _chunks(body: bytes) -> list[_Chunk]:
    """The chunks of a stream up to ``data: [DONE]``, which must come."""
    chunks: list[_Chunk] = []
    for _, data in sse_events(body):
        if data.strip() == "[DONE]":
            return chunks
        value = decode_json(data.encode("utf-8"), "stream event")
        if isinstance(value, dict) and "error" in value:
            code = error_code(data.encode("utf-8"))
            raise ProviderError("stream reported an error" + (f" ({code})" if code else ""))
        chunks.append(parse_with(_Chunk, value, "stream event"))
    raise TransientProviderError(
        "the server disconnected mid-stream (the event stream ended before [DONE])"
    )
