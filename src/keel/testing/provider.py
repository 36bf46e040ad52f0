"""`FakeProvider`: a real chat-completions HTTP server on 127.0.0.1 with scripted replies.

Tests drive Keel's real HTTP adapter against it, so timeouts, dropped connections and
error bodies are exercised on a socket rather than in a patched client. Replies are
served first in, first out; each request takes the next one. Every request body is kept
in `requests` so a test can check what the harness sent.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

CHAT_PATHS = frozenset({"/chat/completions", "/v1/chat/completions"})


@dataclass(frozen=True, kw_only=True)
class _Reply:
    """One scripted answer: an HTTP status and body, or a hang / disconnect."""

    status: int = 200
    body: str = ""
    headers: Mapping[str, str] = field(default_factory=dict)
    delay: float = 0.0
    disconnect: bool = False


class FakeProvider:
    """A chat-completions server with a queue of scripted replies.

    Use as a context manager; `base_url` is ``http://127.0.0.1:PORT/v1``. A request with
    no reply left gets HTTP 500 saying so, which makes a test with a short script fail
    loudly rather than hang.
    """

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self._replies: deque[_Reply] = deque()
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # --- lifecycle ---------------------------------------------------------------------

    def start(self) -> FakeProvider:
        if self._server is not None:
            return self
        server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        server.daemon_threads = True
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def close(self) -> None:
        self._closing.set()  # wakes hung handlers
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = None
        self._thread = None

    def __enter__(self) -> FakeProvider:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("FakeProvider is not started; use it as a context manager")
        return int(self._server.server_address[1])

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def pending(self) -> int:
        """Scripted replies not yet served."""
        with self._lock:
            return len(self._replies)

    # --- scripting ---------------------------------------------------------------------

    def reply(
        self,
        content: str | None = None,
        tool_calls: Sequence[tuple[str, str | Mapping[str, Any]]] = (),
        *,
        usage: tuple[int, int] | None = None,
        reasoning_content: str | None = None,
        model: str | None = None,
        delay: float = 0.0,
    ) -> FakeProvider:
        """Queue a successful completion. A tool call's arguments are sent verbatim when
        a string, serialised when a mapping; `usage` is (prompt, completion) tokens and
        is left out of the response when None; `delay` waits before answering."""
        index = len(self.requests) + self.pending
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if reasoning_content is not None:
            message["reasoning_content"] = reasoning_content
        if tool_calls:
            message["tool_calls"] = [
                {
                    "id": f"call_fake_{index}_{i}",
                    "type": "function",
                    "function": {
                        "name": name,
                        "arguments": args if isinstance(args, str) else json.dumps(args),
                    },
                }
                for i, (name, args) in enumerate(tool_calls)
            ]
        payload: dict[str, Any] = {
            "id": f"chatcmpl-fake-{index}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model or "fake-model",
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": "tool_calls" if tool_calls else "stop",
                }
            ],
        }
        if usage is not None:
            payload["usage"] = {
                "prompt_tokens": usage[0],
                "completion_tokens": usage[1],
                "total_tokens": usage[0] + usage[1],
            }
        return self._queue(_Reply(body=json.dumps(payload), delay=delay))

    def fail(
        self, status: int, message: str, *, headers: Mapping[str, str] | None = None
    ) -> FakeProvider:
        """Queue an OpenAI-style error: ``{"error": {"message": …}}`` with `status`."""
        body = {"error": {"message": message, "type": "fake_error", "code": status}}
        return self._queue(_Reply(status=status, body=json.dumps(body), headers=headers or {}))

    def hang(self, seconds: float) -> FakeProvider:
        """Queue a reply that answers only after `seconds` (with a 504), for timeouts."""
        body = {"error": {"message": f"FakeProvider: answered after hanging {seconds}s"}}
        return self._queue(_Reply(status=504, body=json.dumps(body), delay=seconds))

    def disconnect(self) -> FakeProvider:
        """Queue a dropped connection: the request is read, the socket closed unanswered."""
        return self._queue(_Reply(disconnect=True))

    def raw(
        self, status: int, body_text: str, *, headers: Mapping[str, str] | None = None
    ) -> FakeProvider:
        """Queue a reply with exactly this status and body (e.g. a proxy's HTML page)."""
        return self._queue(_Reply(status=status, body=body_text, headers=headers or {}))

    def _queue(self, reply: _Reply) -> FakeProvider:
        with self._lock:
            self._replies.append(reply)
        return self

    # --- serving (called from handler threads) -------------------------------------------

    def _take(self, body: dict[str, Any], headers: dict[str, str]) -> _Reply:
        with self._lock:
            self.requests.append(body)
            self.headers.append(headers)
            if self._replies:
                return self._replies.popleft()
            count = len(self.requests)
        message = f"FakeProvider: no scripted reply left (request {count})"
        return _Reply(status=500, body=json.dumps({"error": {"message": message}}))


def _handler_for(provider: FakeProvider) -> type[BaseHTTPRequestHandler]:
    class ChatCompletionsHandler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length)
            if self.path not in CHAT_PATHS:
                self._send(_Reply(status=404, body=_error(f"no route {self.path}")))
                return
            try:
                body = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError):
                self._send(_Reply(status=400, body=_error("request body is not JSON")))
                return
            reply = provider._take(body, {k.lower(): v for k, v in self.headers.items()})
            if reply.delay and provider._closing.wait(reply.delay):
                reply = _Reply(disconnect=True)  # server closing: do not keep the client
            if reply.disconnect:
                self.close_connection = True
                with contextlib.suppress(OSError):
                    self.connection.shutdown(socket.SHUT_RDWR)
                return
            self._send(reply)

        def _send(self, reply: _Reply) -> None:
            data = reply.body.encode("utf-8")
            try:
                self.send_response(reply.status)
                self.send_header("Content-Type", _content_type(reply.body))
                self.send_header("Content-Length", str(len(data)))
                for name, value in reply.headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)
            except OSError:  # the client gave up (timed out) before the answer
                self.close_connection = True

        def log_message(self, format: str, *args: Any) -> None:
            """Silent: nothing below the CLI prints."""

    return ChatCompletionsHandler


def _error(message: str) -> str:
    return json.dumps({"error": {"message": f"FakeProvider: {message}"}})


def _content_type(body: str) -> str:
    try:
        json.loads(body)
    except json.JSONDecodeError:
        return "text/html; charset=utf-8"
    return "application/json"
