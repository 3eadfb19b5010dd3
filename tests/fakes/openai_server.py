"""A scripted OpenAI Responses API on loopback, for running Codex CLI offline.

    with OpenAIServer([shell("ls"), Text("done")]) as srv:
        codex exec -c model_provider=fake \
            -c 'model_providers.fake.base_url="<srv.api_url>"' ...

``POST /v1/responses`` answers from the script with server-sent events
(``response.created``, one ``response.output_item.done`` per item,
``response.completed`` with usage), or one JSON response when the request does
not ask for a stream. Run it alone with ``python -m tests.fakes.openai_server``
(it prints its URL and replies "ok" to everything).
"""

from __future__ import annotations

import json
import time
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
)

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    404: "invalid_request_error",
    429: "rate_limit_exceeded",
    500: "server_error",
    503: "server_error",
}

TOOL_OUTPUT_TYPES = {"function_call_output", "custom_tool_call_output", "local_shell_call_output"}


def last_is_tool_result(body: JSON) -> bool:
    """True when the request's last input item is the output of a tool call."""
    items = body.get("input") or []
    return (
        bool(items) and isinstance(items[-1], dict) and items[-1].get("type") in TOOL_OUTPUT_TYPES
    )


def offered_tools(body: JSON) -> dict[str, JSON]:
    """The request's tools by name (function tools and freeform/custom ones alike)."""
    tools: dict[str, JSON] = {}
    for tool in body.get("tools") or []:
        if isinstance(tool, dict):
            name = tool.get("name") or (tool.get("function") or {}).get("name") or tool.get("type")
            tools[str(name)] = tool
    return tools


def user_texts(body: JSON) -> list[str]:
    """Texts of the user messages in ``input``, in order (environment context included)."""
    texts = []
    for item in body.get("input") or []:
        if (
            isinstance(item, dict)
            and item.get("type", "message") == "message"
            and item.get("role") == "user"
        ):
            for part in item.get("content") or []:
                if isinstance(part, dict) and part.get("type") == "input_text":
                    texts.append(str(part.get("text", "")))
    return texts


def last_user_text(body: JSON) -> str:
    prompts = [t for t in user_texts(body) if not t.lstrip().startswith("<")]
    return prompts[-1] if prompts else ""


def conversation_position(body: JSON) -> tuple[str, int]:
    """The latest real prompt and the number of model answers after it.

    Each answer ends either in a tool call or in the final message, so the
    tool calls after the prompt count the answers already given.
    """
    items = [i for i in body.get("input") or [] if isinstance(i, dict)]
    for index in range(len(items) - 1, -1, -1):
        item = items[index]
        if item.get("type", "message") == "message" and item.get("role") == "user":
            texts = [p.get("text", "") for p in item.get("content") or [] if isinstance(p, dict)]
            text = "\n".join(t for t in texts if not t.lstrip().startswith("<"))
            if text:
                calls = sum(
                    1
                    for i in items[index + 1 :]
                    if i.get("type") in ("function_call", "custom_tool_call", "local_shell_call")
                )
                return text, calls
    return "", 0


def by_prompt(
    plans: Mapping[str, Sequence[Step]], fallback: Step | None = None
) -> Callable[[JSON], Step]:
    """See ``scripting.by_prompt``: steps chosen by prompt and position in the conversation."""
    return scripting.by_prompt(plans, conversation_position, fallback)


def codex_provider_args(server: ScriptedServer, **settings: str) -> list[str]:
    """`-c` options that make codex use ``server`` as its model provider "fake" (the key
    in $FAKE_KEY); ``settings`` are more provider keys as TOML values, e.g.
    ``request_max_retries="0"``."""
    provider = {
        "name": '"fake"',
        "base_url": f'"{server.api_url}"',
        "wire_api": '"responses"',
        "env_key": '"FAKE_KEY"',
        **settings,
    }
    pairs = ["model_provider=fake"]
    pairs += [f"model_providers.fake.{key}={value}" for key, value in provider.items()]
    return [arg for pair in pairs for arg in ("-c", pair)]


def shell_arguments(tool_name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """Map a generic ``{"command": str}`` onto the shell tool Codex offered."""
    command = arguments.get("command")
    if not isinstance(command, str):
        return arguments
    rest = {k: v for k, v in arguments.items() if k != "command"}
    if tool_name == "exec_command":
        return {"cmd": command, **rest}
    if tool_name in ("shell", "local_shell"):
        return {"command": ["bash", "-lc", command], **rest}
    return arguments


def usage_json(usage: Usage) -> JSON:
    return {
        "input_tokens": usage.input_tokens,
        "input_tokens_details": {"cached_tokens": usage.cache_read_tokens},
        "output_tokens": usage.output_tokens,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
        "total_tokens": usage.input_tokens + usage.output_tokens,
    }


class OpenAIServer(ScriptedServer):
    def handle(self, ex: Exchange) -> None:
        path, method = ex.path, ex.request.method
        if method == "POST" and path == "/v1/responses":
            self._answer_responses(ex)
        elif method in ("GET", "HEAD") and path == "/v1/models":
            ex.send_json(200, {"object": "list", "data": [], "models": []})
        elif method in ("GET", "HEAD"):
            ex.send_json(200, {})
        else:
            self._error(
                ex,
                HttpError(404, f"fake server: no route for {method} {path}"),
                new_id("req_fake_"),
            )

    def _answer_responses(self, ex: Exchange) -> None:
        step = self.next_step(ex.body)
        request_id = new_id("req_fake_")
        if step is None:
            self.unscripted.append(ex.request)
            self._error(ex, HttpError(400, "fake server: script exhausted"), request_id)
            return
        model = str(ex.body.get("model", "gpt-5-codex"))
        record = RecordedResponse(ex.index, step, model, new_id("resp_fake_"), request_id)
        if isinstance(step, ToolCall):
            try:
                record.tool_name = resolve_tool(step.tool, list(offered_tools(ex.body)))
            except LookupError as error:  # the script asked for a tool this request does not offer
                self.unscripted.append(ex.request)
                self._error(ex, HttpError(400, f"fake server: {error}"), request_id)
                return
        with self._lock:
            self.responses.append(record)
        headers = {"x-request-id": request_id}
        if isinstance(step, HttpError):
            self._error(ex, step, request_id)
        elif isinstance(step, Hang):
            ex.hang()
        elif ex.body.get("stream"):
            ex.send_events(self._events(record, ex.body), headers)
        else:
            ex.send_json(200, self._response(record, ex.body, "completed"), headers)

    def _error(self, ex: Exchange, error: HttpError, request_id: str) -> None:
        kind = error.error_type or ERROR_TYPES.get(error.status, "server_error")
        body = {"error": {"message": error.message, "type": kind, "param": None, "code": kind}}
        ex.send_json(error.status, body, {"x-request-id": request_id, **error.headers})

    def _items(self, record: RecordedResponse, body: JSON) -> list[JSON]:
        step = record.step
        items: list[JSON] = []
        if isinstance(step, (Text, ToolCall)) and step.reasoning:
            summary = [{"type": "summary_text", "text": step.reasoning}]
            items.append({"type": "reasoning", "id": new_id("rs_fake_"), "summary": summary})
        text = step.text if isinstance(step, (Text, ToolCall)) else ""
        if text:
            content = [{"type": "output_text", "text": text, "annotations": []}]
            items.append(
                {
                    "type": "message",
                    "id": new_id("msg_fake_"),
                    "role": "assistant",
                    "status": "completed",
                    "content": content,
                }
            )
        if isinstance(step, ToolCall):
            name, arguments = record.tool_name, dict(step.arguments)
            if step.tool == "shell":
                arguments = shell_arguments(name, arguments)
            call_id = new_id("call_fake_")
            if offered_tools(body)[name].get("type") == "custom":  # freeform tool, e.g. apply_patch
                items.append(
                    {
                        "type": "custom_tool_call",
                        "id": new_id("ctc_fake_"),
                        "call_id": call_id,
                        "name": name,
                        "input": str(arguments.get("input", "")),
                        "status": "completed",
                    }
                )
            else:
                items.append(
                    {
                        "type": "function_call",
                        "id": new_id("fc_fake_"),
                        "call_id": call_id,
                        "name": name,
                        "arguments": json.dumps(arguments),
                        "status": "completed",
                    }
                )
        return items

    def _response(
        self, record: RecordedResponse, body: JSON, status: str, items: list[JSON] | None = None
    ) -> JSON:
        usage = record.step.usage if isinstance(record.step, (Text, ToolCall)) else Usage()
        return {
            "id": record.response_id,
            "object": "response",
            "created_at": int(time.time()),
            "status": status,
            "model": record.model,
            "output": self._items(record, body) if items is None else items,
            "usage": usage_json(usage) if status == "completed" else None,
        }

    def _events(self, record: RecordedResponse, body: JSON) -> Iterator[tuple[str, JSON]]:
        yield (
            "response.created",
            {
                "type": "response.created",
                "response": self._response(record, body, "in_progress", []),
            },
        )
        items = self._items(record, body)
        for index, item in enumerate(items):
            # As the API streams an item: added (empty), its pieces, done (whole). Codex reads
            # the done items; pi builds each item from the added one and its deltas.
            yield (
                "response.output_item.added",
                {"type": "response.output_item.added", "output_index": index,
                 "item": _started(item)},
            )  # fmt: skip
            yield from _item_pieces(item, index)
            yield (
                "response.output_item.done",
                {"type": "response.output_item.done", "output_index": index, "item": item},
            )
        yield (
            "response.completed",
            {
                "type": "response.completed",
                "response": self._response(record, body, "completed", items),
            },
        )


def _started(item: JSON) -> JSON:
    """An output item as `response.output_item.added` announces it: nothing in it yet."""
    if item["type"] == "message":
        return {**item, "status": "in_progress", "content": []}
    if item["type"] == "reasoning":
        return {**item, "summary": []}
    if item["type"] == "function_call":
        return {**item, "status": "in_progress", "arguments": ""}
    return item


def _item_pieces(item: JSON, index: int) -> Iterator[tuple[str, JSON]]:
    """The events between an item's added and done: its text or arguments as deltas."""
    item_id = item.get("id", "")
    if item["type"] == "message":
        for part_index, part in enumerate(item.get("content") or []):
            empty = {**part, "text": ""}
            where = {"item_id": item_id, "output_index": index, "content_index": part_index}
            yield (
                "response.content_part.added",
                {"type": "response.content_part.added", **where, "part": empty},
            )
            yield (
                "response.output_text.delta",
                {"type": "response.output_text.delta", **where, "delta": part["text"]},
            )
            yield (
                "response.output_text.done",
                {"type": "response.output_text.done", **where, "text": part["text"]},
            )
            yield (
                "response.content_part.done",
                {"type": "response.content_part.done", **where, "part": part},
            )
    elif item["type"] == "reasoning":
        for part_index, part in enumerate(item.get("summary") or []):
            where = {"item_id": item_id, "output_index": index, "summary_index": part_index}
            empty = {**part, "text": ""}
            yield (
                "response.reasoning_summary_part.added",
                {"type": "response.reasoning_summary_part.added", **where, "part": empty},
            )
            yield (
                "response.reasoning_summary_text.delta",
                {"type": "response.reasoning_summary_text.delta", **where, "delta": part["text"]},
            )
            yield (
                "response.reasoning_summary_text.done",
                {"type": "response.reasoning_summary_text.done", **where, "text": part["text"]},
            )
    elif item["type"] == "function_call":
        where = {"item_id": item_id, "output_index": index}
        arguments = item.get("arguments", "")
        yield (
            "response.function_call_arguments.delta",
            {"type": "response.function_call_arguments.delta", **where, "delta": arguments},
        )
        yield (
            "response.function_call_arguments.done",
            {"type": "response.function_call_arguments.done", **where, "arguments": arguments},
        )


def _main() -> None:
    OpenAIServer(lambda body: Text("ok")).serve_until_interrupted()


if __name__ == "__main__":
    _main()
