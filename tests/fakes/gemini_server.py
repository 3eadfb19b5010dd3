"""A scripted Gemini API (generativelanguage) on loopback, for running Gemini CLI offline.

    with GeminiServer([shell("ls"), Text("done")]) as srv:
        env["GOOGLE_GEMINI_BASE_URL"] = srv.url
        env["GEMINI_API_KEY"] = "fake"

``POST /v1beta/models/<model>:streamGenerateContent?alt=sse`` answers from the script with
server-sent events (``data: {candidates, usageMetadata, modelVersion, responseId}``, one
chunk per part, the usage on the last); ``:generateContent`` with one JSON response;
``:countTokens`` with an estimate; ``GET /v1beta/models`` with an empty list. Gemini CLI
also asks the model small questions of its own (which model to route to, whether the
model should speak next): those are ``generateContent`` calls with a JSON schema, and
they are answered by the script like any other request (``by_prompt`` scripts give them
a fallback). Run it alone with ``python -m tests.fakes.gemini_server`` (it prints its URL
and replies "ok" to everything).
"""

from __future__ import annotations

import json
import re
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

# google.rpc status names by HTTP status, as the API writes them in its error bodies.
ERROR_STATUSES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
}
_ROUTE_RE = re.compile(r"^/(v1beta|v1|v1alpha)/models/([^/:]+):(\w+)$")

# Gemini CLI's tools by kind (the names it offers in functionDeclarations).
GEMINI_TOOLS: dict[str, tuple[str, ...]] = {
    "shell": ("run_shell_command",),
    "edit": ("replace",),
    "write": ("write_file",),
    "read": ("read_file",),
}


def declared_tools(body: JSON) -> list[str]:
    """The function names the request offers (every tools[].functionDeclarations[].name)."""
    names: list[str] = []
    for tool in body.get("tools") or []:
        if isinstance(tool, dict):
            for declaration in tool.get("functionDeclarations") or []:
                if isinstance(declaration, dict) and isinstance(declaration.get("name"), str):
                    names.append(declaration["name"])
    return names


def _tool_for(wanted: str, offered: Sequence[str]) -> str:
    for candidate in GEMINI_TOOLS.get(wanted, ()):
        if candidate in offered:
            return candidate
    return resolve_tool(wanted, offered)


def _texts(content: JSON) -> list[str]:
    """The text parts of a content, without Gemini CLI's own context (`<session_context>`),
    which it sends as a part of the first user content."""
    return [
        str(part["text"])
        for part in content.get("parts") or []
        if isinstance(part, dict)
        and isinstance(part.get("text"), str)
        and not part.get("thought")
        and not part["text"].lstrip().startswith("<session_context>")
    ]


def _is_prompt(content: JSON) -> bool:
    """A user content with text of the user's and no function response."""
    if content.get("role") != "user":
        return False
    parts = [p for p in content.get("parts") or [] if isinstance(p, dict)]
    if any("functionResponse" in p for p in parts):
        return False
    return bool("\n".join(_texts(content)).strip())


def last_user_text(body: JSON) -> str:
    for content in reversed(body.get("contents") or []):
        if isinstance(content, dict) and _is_prompt(content):
            return "\n".join(_texts(content))
    return ""


def conversation_position(body: JSON) -> tuple[str, int]:
    """The latest real prompt and the number of model contents after it."""
    contents = [c for c in body.get("contents") or [] if isinstance(c, dict)]
    for index in range(len(contents) - 1, -1, -1):
        if _is_prompt(contents[index]):
            answered = sum(1 for c in contents[index + 1 :] if c.get("role") == "model")
            return "\n".join(_texts(contents[index])), answered
    return "", 0


def by_prompt(
    plans: Mapping[str, Sequence[Step]], fallback: Step | None = None
) -> Callable[[JSON], Step]:
    """See ``scripting.by_prompt``: steps chosen by prompt and position in the conversation."""
    return scripting.by_prompt(plans, conversation_position, fallback)


def wants_json(body: JSON) -> bool:
    """Whether the request asks for a JSON answer (responseMimeType application/json): the
    CLI's own side questions, and structured answers."""
    config = body.get("generationConfig") or body.get("config") or {}
    return isinstance(config, dict) and config.get("responseMimeType") == "application/json"


def usage_json(usage: Usage) -> JSON:
    """usageMetadata: promptTokenCount includes the cached tokens (cachedContentTokenCount);
    candidatesTokenCount and thoughtsTokenCount are apart from each other and from it."""
    prompt = usage.input_tokens + usage.cache_read_tokens
    metadata: JSON = {
        "promptTokenCount": prompt,
        "candidatesTokenCount": usage.output_tokens,
        "totalTokenCount": prompt + usage.output_tokens + usage.reasoning_tokens,
        "promptTokensDetails": [{"modality": "TEXT", "tokenCount": prompt}],
    }
    if usage.cache_read_tokens:
        metadata["cachedContentTokenCount"] = usage.cache_read_tokens
    if usage.reasoning_tokens:
        metadata["thoughtsTokenCount"] = usage.reasoning_tokens
    return metadata


def shell_arguments(arguments: dict[str, Any]) -> dict[str, Any]:
    return {"description": "Run a command", **arguments}


class GeminiServer(ScriptedServer):
    api_prefix = "/v1beta"

    def handle(self, ex: Exchange) -> None:
        path, method = ex.path, ex.request.method
        route = _ROUTE_RE.match(path)
        if (
            method == "POST"
            and route
            and route.group(3) in ("generateContent", "streamGenerateContent")
        ):
            self._answer(ex, route.group(2), stream=route.group(3) == "streamGenerateContent")
        elif method == "POST" and route and route.group(3) == "countTokens":
            ex.send_json(200, {"totalTokens": max(1, len(json.dumps(ex.body)) // 4)})
        elif method == "POST" and route and route.group(3) == "embedContent":
            ex.send_json(200, {"embedding": {"values": [0.0] * 8}})
        elif method in ("GET", "HEAD") and path.rstrip("/").endswith("/models"):
            ex.send_json(200, {"models": []})
        elif method in ("GET", "HEAD"):
            ex.send_json(200, {})
        else:
            self._error(ex, HttpError(404, f"fake server: no route for {method} {path}"))

    def _answer(self, ex: Exchange, model: str, *, stream: bool) -> None:
        step = self.next_step(ex.body)
        if step is None:
            self.unscripted.append(ex.request)
            self._error(ex, HttpError(400, "fake server: script exhausted"))
            return
        record = RecordedResponse(ex.index, step, model, new_id("resp_fake_"), new_id("req_fake_"))
        if isinstance(step, ToolCall):
            try:
                record.tool_name = _tool_for(step.tool, declared_tools(ex.body))
            except LookupError as error:  # the script asked for a tool this request does not offer
                self.unscripted.append(ex.request)
                self._error(ex, HttpError(400, f"fake server: {error}"))
                return
        with self._lock:
            self.responses.append(record)
        if isinstance(step, HttpError):
            self._error(ex, step)
        elif isinstance(step, Hang):
            ex.hang()
        elif stream:
            self._send_sse(ex, self._chunks(record))
        else:
            chunks = list(self._chunks(record))
            parts = [
                part for chunk in chunks for part in chunk["candidates"][0]["content"]["parts"]
            ]
            whole = {**chunks[-1]}
            whole["candidates"] = [
                {**chunks[-1]["candidates"][0], "content": {"role": "model", "parts": parts}}
            ]
            ex.send_json(200, whole)

    def _error(self, ex: Exchange, error: HttpError) -> None:
        status = error.error_type or ERROR_STATUSES.get(error.status, "INTERNAL")
        body = {"error": {"code": error.status, "message": error.message, "status": status}}
        ex.send_json(error.status, body, dict(error.headers))

    def _parts(self, record: RecordedResponse) -> list[JSON]:
        step = record.step
        parts: list[JSON] = []
        if isinstance(step, (Text, ToolCall)) and step.reasoning:
            parts.append({"text": step.reasoning, "thought": True})
        if isinstance(step, Text):
            parts.append({"text": step.text})
        elif isinstance(step, ToolCall):
            if step.text:
                parts.append({"text": step.text})
            arguments = dict(step.arguments)
            if step.tool == "shell" and record.tool_name == "run_shell_command":
                arguments = shell_arguments(arguments)
            parts.append({"functionCall": {"name": record.tool_name, "args": arguments}})
        return parts

    def _chunks(self, record: RecordedResponse) -> Iterator[JSON]:
        usage = record.step.usage if isinstance(record.step, (Text, ToolCall)) else Usage()
        parts = self._parts(record)
        for position, part in enumerate(parts):
            last = position == len(parts) - 1
            candidate: JSON = {"content": {"role": "model", "parts": [part]}, "index": 0}
            if last:
                candidate["finishReason"] = "STOP"
            chunk: JSON = {
                "candidates": [candidate],
                "modelVersion": record.model,
                "responseId": record.response_id,
            }
            if last:
                chunk["usageMetadata"] = usage_json(usage)
            yield chunk

    @staticmethod
    def _send_sse(ex: Exchange, chunks: Iterator[JSON]) -> None:
        """`alt=sse`: plain `data:` lines, no event names (what the API sends)."""
        h = ex.handler
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.send_header("Cache-Control", "no-cache")
        h.send_header("Connection", "close")
        h.end_headers()
        h.close_connection = True
        for chunk in chunks:
            h.wfile.write(f"data: {json.dumps(chunk)}\r\n\r\n".encode())
            h.wfile.flush()


def _main() -> None:
    GeminiServer(lambda body: Text("ok")).serve_until_interrupted()


if __name__ == "__main__":
    _main()
