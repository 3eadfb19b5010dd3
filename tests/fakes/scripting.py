"""Scripts for the fake model servers, and the HTTP plumbing they share.

A *script* says what the fake model answers, request by request. It is either
an ordered list whose items are steps or callables ``(request_json) -> step``
(one item used per model request), or a single callable used for every
request. A step is one of:

- ``Text``: reply with text;
- ``ToolCall``: call a tool, named exactly or by a kind ("shell", "edit",
  "write", "read", "agent", "patch") that the server resolves against the
  tools offered in the request;
- ``HttpError``: answer with an HTTP status and the API's own error body;
- ``Hang``: never answer (until the server closes), for timeout tests.

Each step carries its own ``Usage`` (what the server reports as token usage).
Stdlib only: the servers must run wherever the tests run.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Self

JSON = dict[str, Any]


@dataclass(frozen=True)
class Usage:
    """Token usage one response reports.

    Anthropic semantics: ``input_tokens`` excludes cache reads and writes.
    OpenAI semantics: ``input_tokens`` includes ``cache_read_tokens``
    (reported as ``input_tokens_details.cached_tokens``) and ``output_tokens``
    includes ``reasoning_tokens``. Each server uses the fields its API has.
    """

    input_tokens: int = 100
    output_tokens: int = 20
    cache_read_tokens: int = 0
    cache_write_5m_tokens: int = 0
    cache_write_1h_tokens: int = 0
    reasoning_tokens: int = 0

    @property
    def cache_write_tokens(self) -> int:
        return self.cache_write_5m_tokens + self.cache_write_1h_tokens


@dataclass(frozen=True)
class Text:
    text: str
    usage: Usage = field(default_factory=Usage)
    reasoning: str = ""  # a thinking block (Anthropic) or reasoning item (OpenAI) before the text


@dataclass(frozen=True)
class ToolCall:
    tool: str  # exact tool name, or a kind from TOOL_KINDS
    arguments: Mapping[str, Any]
    usage: Usage = field(default_factory=Usage)
    text: str = ""  # optional text before the call
    reasoning: str = ""


@dataclass(frozen=True)
class HttpError:
    status: int
    message: str = "scripted error"
    error_type: str = ""  # the API's error type; the server picks one from the status if empty
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Hang:
    """Accept the request and never answer (the handler waits for the server to close)."""


Step = Text | ToolCall | HttpError | Hang
StepSource = Step | Callable[[JSON], Step]
Script = Sequence[StepSource] | Callable[[JSON], Step]

# Tool kinds, with the names each CLI uses for them, in order of preference.
# Claude Code's tools are capitalised, OpenCode's and pi's lower case, Gemini CLI's its own
# (tests/fakes/gemini_server.py).
TOOL_KINDS: dict[str, tuple[str, ...]] = {
    "shell": ("Bash", "exec_command", "shell_command", "shell", "local_shell", "bash"),
    "edit": ("Edit", "MultiEdit", "edit"),
    "write": ("Write", "write"),
    "read": ("Read", "read"),
    "agent": ("Task", "Agent", "task"),
    "patch": ("apply_patch",),
}


def shell(
    command: str, *, usage: Usage | None = None, text: str = "", reasoning: str = ""
) -> ToolCall:
    """A shell call; each server maps ``command`` onto its shell tool's parameters."""
    return ToolCall("shell", {"command": command}, usage or Usage(), text, reasoning)


def by_prompt(
    plans: Mapping[str, Sequence[Step]],
    position: Callable[[JSON], tuple[str, int]],
    fallback: Step | None = None,
) -> Callable[[JSON], Step]:
    """A script that reacts to the conversation rather than to the request count.

    ``position(body)`` gives the latest real prompt in the request and how many
    model answers follow it. The first plan whose key occurs in that prompt
    gives the step at that index. Requests no plan covers get ``fallback``, or
    a 400 error naming the prompt. Side requests a CLI makes on its own
    (titles, sub-agents) thus never shift the script.
    """

    def script(body: JSON) -> Step:
        prompt, index = position(body)
        for key, steps in plans.items():
            if key in prompt:
                if index < len(steps):
                    return steps[index]
                break
        if fallback is not None:
            return fallback
        return HttpError(400, f"fake server: no scripted step {index} for prompt {prompt[:200]!r}")

    return script


def tool_names(tools: Iterable[JSON]) -> list[str]:
    return [str(t.get("name", "")) for t in tools if isinstance(t, dict)]


def resolve_tool(wanted: str, offered: Sequence[str]) -> str:
    """The offered tool name for ``wanted`` (an exact name or a kind)."""
    if wanted in offered:
        return wanted
    for candidate in TOOL_KINDS.get(wanted, ()):
        if candidate in offered:
            return candidate
    raise LookupError(f"no tool for {wanted!r} among {sorted(offered)}")


@dataclass
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: JSON | None  # parsed JSON body, None when there was none


@dataclass
class RecordedResponse:
    """What the server answered to one model request: the ground truth for parsers."""

    request_index: int  # index into ``server.requests``
    step: Step
    model: str
    response_id: str
    request_id: str
    tool_name: str = ""  # resolved tool name for a ToolCall


def new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:24]}"


class ScriptedServer:
    """A loopback HTTP server that answers model requests from a script.

    Use as a context manager: ``with Server(script) as srv: srv.url``. It
    records every request (``requests``) and what it answered to each model
    request (``responses``). Requests a script does not cover get an error
    answer and are listed in ``unscripted``.
    """

    api_prefix = "/v1"

    def __init__(self, script: Script, *, host: str = "127.0.0.1", port: int = 0) -> None:
        self._script = script
        self._position = 0
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self.requests: list[RecordedRequest] = []
        self.responses: list[RecordedResponse] = []
        self.unscripted: list[RecordedRequest] = []
        self._httpd = ThreadingHTTPServer((host, port), self._handler_class())
        self._httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------

    @property
    def url(self) -> str:
        """Base URL without the API prefix, e.g. http://127.0.0.1:41234."""
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def api_url(self) -> str:
        return self.url + self.api_prefix

    def start(self) -> Self:
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name=type(self).__name__, daemon=True
        )
        self._thread.start()
        return self

    def close(self) -> None:
        self._closing.set()  # releases hanging handlers
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread:
            self._thread.join(timeout=5)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def serve_until_interrupted(self) -> None:
        print(self.url, flush=True)
        try:
            self._httpd.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            self._closing.set()
            self._httpd.server_close()

    # -- script --------------------------------------------------------------

    @property
    def model_requests(self) -> list[JSON]:
        """Bodies of the requests that the script answered, in order."""
        return [self.requests[r.request_index].body or {} for r in self.responses]

    def next_step(self, body: JSON) -> Step | None:
        with self._lock:
            if callable(self._script):
                return self._script(body)
            if self._position >= len(self._script):
                return None
            source = self._script[self._position]
            self._position += 1
        return source(body) if callable(source) else source

    def record(self, request: RecordedRequest) -> int:
        with self._lock:
            self.requests.append(request)
            return len(self.requests) - 1

    # -- HTTP ------------------------------------------------------------------

    def handle(self, handler: Exchange) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _dispatch(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    body = None
                recorded = RecordedRequest(
                    self.command, self.path, dict(self.headers.items()), body
                )
                index = server.record(recorded)
                server.handle(Exchange(self, recorded, index, server._closing))

            do_GET = do_POST = do_HEAD = do_PUT = do_DELETE = do_PATCH = _dispatch

            def log_message(self, format: str, *args: Any) -> None:
                pass  # keep test output quiet

        return Handler


class Exchange:
    """One request being answered: helpers to write JSON or SSE back."""

    def __init__(
        self,
        handler: BaseHTTPRequestHandler,
        request: RecordedRequest,
        index: int,
        closing: threading.Event,
    ) -> None:
        self.handler = handler
        self.request = request
        self.index = index
        self._closing = closing

    @property
    def path(self) -> str:
        return self.request.path.split("?", 1)[0]

    @property
    def body(self) -> JSON:
        return self.request.body if isinstance(self.request.body, dict) else {}

    def send_json(
        self, status: int, payload: Any, headers: Mapping[str, str] | None = None
    ) -> None:
        data = json.dumps(payload).encode()
        h = self.handler
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            h.send_header(name, value)
        h.end_headers()
        if h.command != "HEAD":
            h.wfile.write(data)
        h.wfile.flush()

    def send_events(
        self, events: Iterable[tuple[str, JSON]], headers: Mapping[str, str] | None = None
    ) -> None:
        """Server-sent events; the connection closes after the last one."""
        h = self.handler
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.send_header("Cache-Control", "no-cache")
        h.send_header("Connection", "close")
        for name, value in (headers or {}).items():
            h.send_header(name, value)
        h.end_headers()
        h.close_connection = True
        for event, data in events:
            h.wfile.write(f"event: {event}\ndata: {json.dumps(data)}\n\n".encode())
            h.wfile.flush()

    def hang(self) -> None:
        self._closing.wait()
        self.handler.close_connection = True
