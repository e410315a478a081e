"""The conversation items the OpenAI-compatible adapters send (:mod:`.chat`,
:mod:`.responses`), as typed dictionaries: each is serialised as it is written, key by key."""

from __future__ import annotations

from typing import Literal, NotRequired, TypedDict

from controller.tools.schemas import ToolSchema


class Message(TypedDict):
    """A text message (the task, a nudge, the model's text in the Responses API)."""

    role: Literal["system", "user", "assistant"]
    content: str


# -- Chat Completions --------------------------------------------------------------------


class ChatFunction(TypedDict):
    name: str
    arguments: str


class ChatToolCall(TypedDict):
    id: str
    type: Literal["function"]
    function: ChatFunction


class AssistantMessage(TypedDict):
    role: Literal["assistant"]
    content: str | None
    tool_calls: NotRequired[list[ChatToolCall]]


class ToolMessage(TypedDict):
    role: Literal["tool"]
    tool_call_id: str
    content: str


ChatItem = Message | AssistantMessage | ToolMessage


class ChatTool(TypedDict):
    type: Literal["function"]
    function: ToolSchema


class StreamOptions(TypedDict):
    include_usage: bool


class ChatBody(TypedDict):
    model: str
    messages: list[ChatItem]
    tools: list[ChatTool]
    stream: bool
    stream_options: NotRequired[StreamOptions]


# -- Responses ---------------------------------------------------------------------------


class FunctionCall(TypedDict):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str


class FunctionCallOutput(TypedDict):
    type: Literal["function_call_output"]
    call_id: str
    output: str


ResponsesItem = Message | FunctionCall | FunctionCallOutput


class ResponsesTool(ToolSchema):
    """A tool's function definition, flat, after its ``type`` and ``strict``."""

    type: Literal["function"]
    strict: bool


class ResponsesBody(TypedDict):
    model: str
    instructions: str
    input: list[ResponsesItem]
    tools: list[ResponsesTool]
    stream: bool
    store: bool
