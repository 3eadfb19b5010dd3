"""A scripted Anthropic Messages API on loopback, for running Claude Code offline.

    with AnthropicServer([shell("ls"), Text("done")]) as srv:
        env["ANTHROPIC_BASE_URL"] = srv.url

``POST /v1/messages`` (``?beta=true`` too) answers from the script, streaming
when the request asks for it. Other endpoints Claude Code may touch get small
sensible answers so the CLI never waits on them. Run it alone with
``python -m tests.fakes.anthropic_server`` (it prints its URL and replies
"ok" to everything).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from tests.fakes import scripting
from tests.fakes.scripting import (
    JSON,
    Exchange,
    Hang,
    HttpError,
    RecordedResponse,
    ScriptedServer,
    Step,
    Text,
    ToolCall,
    Usage,
    new_id,
    resolve_tool,
    tool_names,
)

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}


def last_is_tool_result(body: JSON) -> bool:
    """True when the request's last message is a user turn carrying a tool_result."""
    messages = body.get("messages") or []
    if not messages or messages[-1].get("role") != "user":
        return False
    content = messages[-1].get("content")
    return isinstance(content, list) and any(
        isinstance(block, dict) and block.get("type") == "tool_result" for block in content
    )


def last_user_text(body: JSON) -> str:
    """The text of the last user message (tool results and system reminders left out)."""
    for message in reversed(body.get("messages") or []):
        if message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, str):
            return content
        texts = [
            b.get("text", "")
            for b in content or []
            if isinstance(b, dict)
            and b.get("type") == "text"
            and not b.get("text", "").startswith("<system-reminder>")
        ]
        return "\n".join(texts)
    return ""


def _is_prompt(message: JSON) -> bool:
    content = message.get("content")
    if message.get("role") != "user":
        return False
    if isinstance(content, str):
        return True
    blocks = [b for b in content or [] if isinstance(b, dict)]
    return not any(b.get("type") == "tool_result" for b in blocks) and any(
        b.get("type") == "text" and not b.get("text", "").startswith("<system-reminder>")
        for b in blocks
    )


def conversation_position(body: JSON) -> tuple[str, int]:
    """The latest real prompt and the number of assistant messages after it."""
    messages = body.get("messages") or []
    for i in range(len(messages) - 1, -1, -1):
        if _is_prompt(messages[i]):
            answered = sum(1 for m in messages[i + 1 :] if m.get("role") == "assistant")
            return last_user_text({"messages": messages[: i + 1]}), answered
    return "", 0


def by_prompt(
    plans: Mapping[str, Sequence[Step]], fallback: Step | None = None
) -> Callable[[JSON], Step]:
    """See ``scripting.by_prompt``: steps chosen by prompt and position in the conversation."""
    return scripting.by_prompt(plans, conversation_position, fallback)


def system_text(body: JSON) -> str:
    system = body.get("system")
    if isinstance(system, str):
        return system
    return "\n".join(b.get("text", "") for b in system or [] if isinstance(b, dict))


def usage_json(usage: Usage, *, output_tokens: int) -> JSON:
    return {
        "input_tokens": usage.input_tokens,
        "cache_creation_input_tokens": usage.cache_write_tokens,
        "cache_read_input_tokens": usage.cache_read_tokens,
        "cache_creation": {
            "ephemeral_5m_input_tokens": usage.cache_write_5m_tokens,
            "ephemeral_1h_input_tokens": usage.cache_write_1h_tokens,
        },
        "output_tokens": output_tokens,
        "service_tier": "standard",
    }


def shell_arguments(arguments: dict[str, Any]) -> dict[str, Any]:
    return {"description": "Run a command", **arguments}


def _takes(tools: list[JSON], name: str, parameter: str) -> bool:
    """Whether the offered tool `name` has `parameter` (Claude Code's and OpenCode's shell
    tools want a description; pi's takes none)."""
    for tool in tools:
        if tool.get("name") == name:
            schema = tool.get("input_schema") or {}
            return parameter in (schema.get("properties") or {})
    return False


class AnthropicServer(ScriptedServer):
    def handle(self, ex: Exchange) -> None:
        path, method = ex.path, ex.request.method
        if method == "POST" and path == "/v1/messages":
            self._answer_messages(ex)
        elif method == "POST" and path == "/v1/messages/count_tokens":
            ex.send_json(200, {"input_tokens": max(1, len(json.dumps(ex.body)) // 4)})
        elif method in ("GET", "HEAD"):
            ex.send_json(200, {"data": [], "has_more": False} if path.startswith("/v1/") else {})
        else:
            self._error(
                ex,
                HttpError(404, f"fake server: no route for {method} {path}"),
                new_id("req_fake_"),
            )

    def _answer_messages(self, ex: Exchange) -> None:
        step = self.next_step(ex.body)
        request_id = new_id("req_fake_")
        if step is None:
            self.unscripted.append(ex.request)
            self._error(ex, HttpError(400, "fake server: script exhausted"), request_id)
            return
        model = str(ex.body.get("model", "claude-sonnet-4-5"))
        message_id = new_id("msg_fake_")
        record = RecordedResponse(ex.index, step, model, message_id, request_id)
        if isinstance(step, ToolCall):
            try:
                record.tool_name = resolve_tool(step.tool, tool_names(ex.body.get("tools") or []))
            except LookupError as error:  # the script asked for a tool this request does not offer
                self.unscripted.append(ex.request)
                self._error(ex, HttpError(400, f"fake server: {error}"), request_id)
                return
        with self._lock:
            self.responses.append(record)
        if isinstance(step, HttpError):
            self._error(ex, step, request_id)
        elif isinstance(step, Hang):
            ex.hang()
        elif ex.body.get("stream"):
            ex.send_events(self._events(record), {"request-id": request_id})
        else:
            ex.send_json(200, self._message(record), {"request-id": request_id})

    def _error(self, ex: Exchange, error: HttpError, request_id: str) -> None:
        kind = error.error_type or ERROR_TYPES.get(error.status, "api_error")
        body = {
            "type": "error",
            "error": {"type": kind, "message": error.message},
            "request_id": request_id,
        }
        ex.send_json(error.status, body, {"request-id": request_id, **error.headers})

    def _blocks(self, record: RecordedResponse) -> list[JSON]:
        step = record.step
        blocks: list[JSON] = []
        if isinstance(step, (Text, ToolCall)) and step.reasoning:
            blocks.append(
                {"type": "thinking", "thinking": step.reasoning, "signature": uuid.uuid4().hex}
            )
        if isinstance(step, Text):
            blocks.append({"type": "text", "text": step.text})
        elif isinstance(step, ToolCall):
            if step.text:
                blocks.append({"type": "text", "text": step.text})
            arguments = dict(step.arguments)
            if step.tool == "shell" and _takes(
                self._tools(record), record.tool_name, "description"
            ):
                arguments = shell_arguments(arguments)
            blocks.append(
                {
                    "type": "tool_use",
                    "id": new_id("toolu_fake_"),
                    "name": record.tool_name,
                    "input": arguments,
                }
            )
        return blocks

    def _tools(self, record: RecordedResponse) -> list[JSON]:
        body = self.requests[record.request_index].body or {}
        return [tool for tool in body.get("tools") or [] if isinstance(tool, dict)]

    def _message(self, record: RecordedResponse) -> JSON:
        usage = record.step.usage if isinstance(record.step, (Text, ToolCall)) else Usage()
        return {
            "id": record.response_id,
            "type": "message",
            "role": "assistant",
            "model": record.model,
            "content": self._blocks(record),
            "stop_reason": "tool_use" if isinstance(record.step, ToolCall) else "end_turn",
            "stop_sequence": None,
            "usage": usage_json(usage, output_tokens=usage.output_tokens),
        }

    def _events(self, record: RecordedResponse) -> Iterator[tuple[str, JSON]]:
        message = self._message(record)
        usage = record.step.usage if isinstance(record.step, (Text, ToolCall)) else Usage()
        start = {
            **message,
            "content": [],
            "stop_reason": None,
            "usage": usage_json(usage, output_tokens=1),
        }
        yield "message_start", {"type": "message_start", "message": start}
        for index, block in enumerate(message["content"]):
            if block["type"] == "text":
                yield (
                    "content_block_start",
                    {
                        "type": "content_block_start",
                        "index": index,
                        "content_block": {"type": "text", "text": ""},
                    },
                )
                yield (
                    "content_block_delta",
                    {
                        "type": "content_block_delta",
                        "index": index,
                        "delta": {"type": "text_delta", "text": block["text"]},
                    },
                )
            elif block["type"] == "thinking":
                start_block = {"type": "thinking", "thinking": "", "signature": ""}
                yield (
                    "content_block_start",
                    {"type": "content_block_start", "index": index, "content_block": start_block},
                )
                yield (
                    "content_block_delta",
                    {
                        "type": "content_block_delta",
                        "index": index,
                        "delta": {"type": "thinking_delta", "thinking": block["thinking"]},
                    },
                )
                yield (
                    "content_block_delta",
                    {
                        "type": "content_block_delta",
                        "index": index,
                        "delta": {"type": "signature_delta", "signature": block["signature"]},
                    },
                )
            else:
                empty = {**block, "input": {}}
                yield (
                    "content_block_start",
                    {"type": "content_block_start", "index": index, "content_block": empty},
                )
                partial = json.dumps(block["input"])
                half = len(partial) // 2
                for piece in (partial[:half], partial[half:]):
                    json_delta = {"type": "input_json_delta", "partial_json": piece}
                    yield (
                        "content_block_delta",
                        {"type": "content_block_delta", "index": index, "delta": json_delta},
                    )
            yield "content_block_stop", {"type": "content_block_stop", "index": index}
        delta: JSON = {"stop_reason": message["stop_reason"], "stop_sequence": None}
        yield (
            "message_delta",
            {
                "type": "message_delta",
                "delta": delta,
                "usage": usage_json(usage, output_tokens=usage.output_tokens),
            },
        )
        yield "message_stop", {"type": "message_stop"}


def _main() -> None:
    AnthropicServer(lambda body: Text("ok")).serve_until_interrupted()


if __name__ == "__main__":
    _main()
