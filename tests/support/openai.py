"""The OpenAI-compatible APIs' answers as the loopback server plays them (recorded shapes
of both APIs, streamed and not), and a provider pointed at it."""

from __future__ import annotations

import json
import traceback
from typing import Any

from controller.errors import PatchboxError
from controller.providers import (
    OpenAIProvider,
    ProviderConfig,
    ToolResult,
    open_provider,
)
from tests.support.loopback import (
    LoopbackServer,
    Responder,
    json_reply,
    sse_event,
    sse_reply,
)

KEY = "sk-test-PLANTED-3f9a7c21e5d84b06"
PROMPT = "Make parse_items return [] for empty input."
APIS = ["chat", "responses"]
MODES = [(api, stream) for api in APIS for stream in (False, True)]
Call = tuple[str, str, str]
"""id, name, raw arguments text."""


def make_config(
    server: LoopbackServer, api: str = "chat", stream: bool = False, **fields: Any
) -> ProviderConfig:
    values: dict[str, Any] = {
        "api": api,
        "base_url": f"{server.url}/v1",
        "api_key": KEY,
        "model": "test-model",
        "stream": stream,
        "trust_env": False,
        "connect_timeout_seconds": 2.0,
        "read_timeout_seconds": 5.0,
        "request_deadline_seconds": 5.0,
        "max_attempts": 3,
        "backoff_seconds": 0.01,
        "max_backoff_seconds": 0.02,
        "max_retry_after_seconds": 5.0,
    }
    return ProviderConfig.model_validate(values | fields)


def named(server: LoopbackServer, api: str = "chat") -> str:
    """How an endpoint error begins: the API's name and the URL it tried."""
    if api == "chat":
        return f"chat completions at {server.url}/v1/chat/completions: "
    return f"responses at {server.url}/v1/responses: "


def provider_for(
    server: LoopbackServer, api: str = "chat", stream: bool = False, **fields: Any
) -> OpenAIProvider[Any]:
    return open_provider(make_config(server, api, stream, **fields), PROMPT)


# Recorded answers, shaped like the real APIs' (with fields the adapters do not read).


def chat_json(calls: list[Call], text: str | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
    if calls:
        message["tool_calls"] = [
            {"id": i, "type": "function", "function": {"name": n, "arguments": a}}
            for i, n, a in calls
        ]
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "test-model",
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": "tool_calls" if calls else "stop",
            }
        ],
        "usage": {"prompt_tokens": 120, "completion_tokens": 30, "total_tokens": 150},
        "system_fingerprint": "fp_1",
    }


def chat_sse(calls: list[Call], text: str | None = None) -> list[bytes]:
    def chunk(delta: dict[str, Any], finish: str | None = None, usage: Any = None) -> bytes:
        return sse_event(
            {
                "id": "chatcmpl-1",
                "object": "chat.completion.chunk",
                "model": "test-model",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
                "usage": usage,
            }
        )

    events = [chunk({"role": "assistant", "content": None})]
    if text:
        middle = len(text) // 2
        events += [chunk({"content": text[:middle]}), chunk({"content": text[middle:]})]
    for index, (call_id, name, arguments) in enumerate(calls):
        middle = len(arguments) // 2
        events.append(
            chunk(
                {
                    "tool_calls": [
                        {
                            "index": index,
                            "id": call_id,
                            "type": "function",
                            "function": {"name": name, "arguments": ""},
                        }
                    ]
                }
            )
        )
        for piece in (arguments[:middle], arguments[middle:]):
            events.append(
                chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
            )
    events.append(chunk({}, "tool_calls" if calls else "stop"))
    events.append(
        sse_event(
            {
                "id": "chatcmpl-1",
                "object": "chat.completion.chunk",
                "choices": [],
                "usage": {"prompt_tokens": 120, "completion_tokens": 30, "total_tokens": 150},
            }
        )
    )
    events.append(b"data: [DONE]\n\n")
    return events


def responses_output(calls: list[Call], text: str | None) -> list[dict[str, Any]]:
    output: list[dict[str, Any]] = [{"type": "reasoning", "id": "rs_1", "summary": []}]
    if text:
        output.append(
            {
                "type": "message",
                "id": "msg_1",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        )
    output += [
        {
            "type": "function_call",
            "id": f"fc_{i}",
            "call_id": i,
            "name": n,
            "arguments": a,
            "status": "completed",
        }
        for i, n, a in calls
    ]
    return output


def responses_json(
    calls: list[Call], text: str | None = None, status: str = "completed"
) -> dict[str, Any]:
    return {
        "id": "resp_1",
        "object": "response",
        "created_at": 1700000000,
        "status": status,
        "model": "test-model",
        "output": responses_output(calls, text),
        "usage": {"input_tokens": 120, "output_tokens": 30, "total_tokens": 150},
    }


def responses_sse(calls: list[Call], text: str | None = None) -> list[bytes]:
    events = [
        sse_event(
            {"type": "response.created", "response": responses_json([], None, "in_progress")},
            "response.created",
        )
    ]
    for index, item in enumerate(responses_output(calls, text)):
        events.append(
            sse_event(
                {"type": "response.output_item.added", "output_index": index, "item": item},
                "response.output_item.added",
            )
        )
        if item["type"] == "function_call":
            events.append(
                sse_event(
                    {
                        "type": "response.function_call_arguments.delta",
                        "output_index": index,
                        "delta": item["arguments"],
                    },
                    "response.function_call_arguments.delta",
                )
            )
        events.append(
            sse_event(
                {"type": "response.output_item.done", "output_index": index, "item": item},
                "response.output_item.done",
            )
        )
    events.append(
        sse_event(
            {"type": "response.completed", "response": responses_json(calls, text)},
            "response.completed",
        )
    )
    return events


def answer(api: str, stream: bool, calls: list[Call], text: str | None = None) -> Responder:
    if api == "chat":
        return sse_reply(chat_sse(calls, text)) if stream else json_reply(chat_json(calls, text))
    return (
        sse_reply(responses_sse(calls, text)) if stream else json_reply(responses_json(calls, text))
    )


READ = ("call_1", "read_file", '{"path": "src/parser.py", "startLine": 1}')
SEARCH = ("call_2", "search_text", '{"query": "def parse_items"}')


def result(call: Call, content: str) -> ToolResult:
    return ToolResult(call_id=call[0], name=call[1], content=content)


def key_free(error: BaseException) -> None:
    """The planted key is nowhere in the error, its args, its chain or its traceback."""
    text = "".join(traceback.format_exception(error))
    assert KEY not in text
    assert KEY not in repr(error)
    assert KEY not in repr(error.args)
    if isinstance(error, PatchboxError):
        assert KEY not in json.dumps(error.to_dict())
