"""OpenAI-compatible Responses: ``POST {base}/responses``, stateless (``store: false``).

The system prompt goes in ``instructions``; ``input`` holds the task as a user message, then
for each turn the model's text as an assistant message and its ``function_call`` items,
followed by one ``function_call_output`` item per result. Output items other than
``message`` and ``function_call`` (reasoning, for instance) are skipped. A nudge is a user
message. A streamed answer must reach ``response.completed`` (or ``response.incomplete``;
one that ends before is a disconnect, retried); its response object is read
as a non-streamed answer, with the ``response.output_item.done`` items standing in when the
server leaves its ``output`` empty.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from controller.errors import ProviderError, TransientProviderError
from controller.providers.base import ModelTurn, ToolCall, ToolResult, new_turn
from controller.providers.config import ProviderConfig
from controller.providers.items import (
    FunctionCall,
    Message,
    ResponsesBody,
    ResponsesItem,
    ResponsesTool,
)
from controller.providers.openai import SYSTEM_PROMPT, OpenAIProvider
from controller.providers.replies import (
    Reply,
    Wire,
    decode_json,
    parse_with,
    sse_events,
    token,
    usage_counts,
)
from controller.tools.schemas import ToolSchema, tool_schemas

_USAGE_NAMES = {
    "input_tokens": "input_tokens",
    "output_tokens": "output_tokens",
    "total_tokens": "total_tokens",
}
_DONE_STATUS = frozenset({"completed", "incomplete"})


class _Usage(Wire):
    input_tokens: int | None = None
    output_tokens: int | None = None
    total_tokens: int | None = None


class _Part(Wire):
    type: str
    text: str | None = None
    refusal: str | None = None


class _MessageItem(Wire):
    type: Literal["message"]
    content: list[_Part]


class _FunctionCallItem(Wire):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str


class _Response(Wire):
    status: str | None = None
    output: list[dict[str, object]]
    usage: _Usage | None = None
    error: dict[str, object] | None = None


class _StreamEvent(Wire):
    type: str
    response: dict[str, object] | None = None
    item: dict[str, object] | None = None
    code: str | None = None
    error: dict[str, object] | None = None


def _code_of(error: dict[str, object] | None) -> str:
    code = token(error.get("code")) if error is not None else None
    return f" ({code})" if code else ""


class ResponsesProvider(OpenAIProvider[ResponsesItem]):
    """A :class:`~controller.providers.base.Provider` over the Responses API."""

    label = "responses"
    path: ClassVar[str] = "/responses"

    def __init__(
        self, config: ProviderConfig, prompt: str, *, system_prompt: str = SYSTEM_PROMPT
    ) -> None:
        super().__init__(config, prompt, system_prompt=system_prompt)
        self._input: list[ResponsesItem] = [{"role": "user", "content": prompt}]
        self._tools: list[ResponsesTool] = []
        self._offer(tool_schemas())

    def _offer(self, tools: list[ToolSchema]) -> None:
        self._tools = [
            {
                "type": "function",
                "strict": False,
                "name": schema["name"],
                "description": schema["description"],
                "parameters": schema["parameters"],
            }
            for schema in tools
        ]

    @staticmethod
    def _user_item(text: str) -> Message:
        return {"role": "user", "content": text}

    @staticmethod
    def _result_items(results: list[ToolResult]) -> list[ResponsesItem]:
        return [
            {"type": "function_call_output", "call_id": r.call_id, "output": r.content}
            for r in results
        ]

    def _body(self, items: list[ResponsesItem]) -> ResponsesBody:
        return {
            "model": self._config.model,
            "instructions": self._system_prompt,
            "input": self._input + items,
            "tools": self._tools,
            "stream": self._config.stream,
            "store": False,
        }

    def _commit(self, items: list[ResponsesItem], answer: list[ResponsesItem]) -> None:
        self._input.extend(items)
        self._input.extend(answer)

    def _parse(self, reply: Reply) -> tuple[ModelTurn, list[ResponsesItem]]:
        if reply.content_type == "text/event-stream":
            response, items = self._parse_stream(reply.body)
        else:
            response = decode_json(reply.body, "answer")
            items = []
        parsed = parse_with(_Response, response, "answer")
        if parsed.status == "failed":
            raise ProviderError("the response failed" + _code_of(parsed.error))
        if parsed.status is not None and parsed.status not in _DONE_STATUS:
            status = token(parsed.status) or "unknown"
            raise ProviderError(f"unexpected response status {status!r}")
        calls: list[ToolCall] = []
        text: list[str] = []
        for item in parsed.output or items:
            kind = item.get("type")
            if kind == "function_call":
                call = parse_with(_FunctionCallItem, item, "function_call item")
                calls.append(
                    parse_with(
                        ToolCall,
                        {"id": call.call_id, "name": call.name, "arguments": call.arguments},
                        "function_call item",
                    )
                )
            elif kind == "message":
                message = parse_with(_MessageItem, item, "message item")
                text.extend(
                    (p.text if p.type == "output_text" else p.refusal) or ""
                    for p in message.content
                    if p.type in ("output_text", "refusal")
                )
        turn = new_turn(
            calls, "".join(text) or None, usage_counts(parsed.usage, _USAGE_NAMES, len(reply.body))
        )
        answer: list[ResponsesItem] = []
        if turn.text is not None:
            answer.append({"role": "assistant", "content": turn.text})
        answer.extend(_function_call(c) for c in turn.tool_calls)
        return turn, answer

    @staticmethod
    def _parse_stream(body: bytes) -> tuple[object, list[dict[str, object]]]:
        items: list[dict[str, object]] = []
        for _, data in sse_events(body):
            event = parse_with(
                _StreamEvent, decode_json(data.encode("utf-8"), "stream event"), "stream event"
            )
            if event.type in ("response.completed", "response.incomplete"):
                return event.response, items
            if event.type == "response.output_item.done" and event.item is not None:
                items.append(event.item)
            elif event.type == "response.failed":
                error = (event.response or {}).get("error")
                raise ProviderError(
                    "the response failed" + _code_of(error if isinstance(error, dict) else None)
                )
            elif event.type == "error":
                raise ProviderError(
                    "stream reported an error"
                    + _code_of(event.error or ({"code": event.code} if event.code else None))
                )
        raise TransientProviderError(
            "the server disconnected mid-stream (the event stream ended before response.completed)"
        )


def _function_call(call: ToolCall) -> FunctionCall:
    return {
        "type": "function_call",
        "call_id": call.id,
        "name": call.name,
        "arguments": call.arguments,
    }
