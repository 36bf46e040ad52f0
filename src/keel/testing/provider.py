"""`FakeProvider`: a real chat-completions HTTP server on 127.0.0.1 with scripted replies.

Tests drive Keel's real HTTP adapter against it, so timeouts, dropped connections,
error bodies and streams are exercised on a socket rather than in a patched client.
Replies are served first in, first out; each request takes the next one. Every request
body is kept in `requests` (its headers in `headers`, the client's port in
`peer_ports`) and checked against the rules a strict server enforces
(`keel.testing.chat_rules`): what it would refuse is listed in `violations`.

It speaks HTTP/1.1 as a provider does: connections persist (a client's pool reuses
them: compare `peer_ports`, count `connections`), plain answers carry a Content-Length,
and a request with ``"stream": true`` answered by a scripted turn gets a
``text/event-stream`` of ``chat.completion.chunk`` events in chunked transfer encoding,
each event flushed as it is written (with TCP_NODELAY, so a client sees it at once).
"""

from __future__ import annotations

import contextlib
import json
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

from keel.testing.chat_rules import check_request
from keel.testing.recorded import RecordedExchange, split_events
from keel.testing.streams import is_done, stream_events

CHAT_PATHS = frozenset({"/chat/completions", "/v1/chat/completions"})
_SECRET_HEADERS = frozenset({"authorization", "api-key", "x-api-key", "proxy-authorization"})
# Framing belongs to this server, not to a recorded answer (whose body is stored decoded).
_FRAMING_HEADERS = frozenset({"content-length", "transfer-encoding", "content-encoding"})

ToolCallScript = (
    tuple[str, str | Mapping[str, Any]] | tuple[str, str | Mapping[str, Any], str | None]
)


@dataclass(frozen=True, kw_only=True)
class _StreamShape:
    """How a streamed answer is written: keep-alive comments before each event, a
    connection closed after `cut_after` events (never [DONE]), a pause before each event."""

    keepalive: bool = False
    cut_after: int | None = None
    delay_per_event: float = 0.0


@dataclass(frozen=True, kw_only=True)
class _Reply:
    """One scripted answer: an HTTP status and body, or a hang / disconnect. `turn` is a
    scripted completion, which a streaming request gets as chunk events."""

    status: int = 200
    body: str = ""
    headers: Mapping[str, str] = field(default_factory=dict)
    delay: float = 0.0
    disconnect: bool = False
    turn: Mapping[str, Any] | None = None
    shape: _StreamShape = _StreamShape()


@dataclass(frozen=True, kw_only=True)
class SentEvent:
    """One server-sent event as written: `request` indexes `FakeProvider.requests`, `at`
    is ``time.perf_counter()`` just before the event is handed to the socket (so a delay
    measured from it to a client's receipt includes the send itself)."""

    request: int
    data: str
    at: float


class _Headers(dict[str, str]):
    """A request's headers (lower-case names); credentials are kept but never shown."""

    def __repr__(self) -> str:
        shown = {k: "<redacted>" if k in _SECRET_HEADERS else v for k, v in self.items()}
        return repr(shown)


class FakeProvider:
    """A chat-completions server with a queue of scripted replies.

    Use as a context manager; `base_url` is ``http://127.0.0.1:PORT/v1``. A request with
    no reply left gets HTTP 500 saying so (unless `respond_with` set a responder), which
    makes a test with a short script fail loudly rather than hang. `rules` picks the
    provider whose request rules are checked (``deepseek``, ``openai``, ``compatible``;
    default: ``deepseek`` for a model named so, else ``compatible``); `strict` answers a
    request that breaks one with HTTP 400, as a strict server does, keeping the script.

    Leaving the context raises `AssertionError` listing the broken rules when any request
    broke one (and the block itself raised nothing), so every test that talks to a
    FakeProvider checks what Keel sent; a test that sends bad requests on purpose passes
    ``allow_violations=True`` and inspects `violations` itself.
    """

    def __init__(
        self, *, rules: str | None = None, strict: bool = False, allow_violations: bool = False
    ) -> None:
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.peer_ports: list[int] = []
        self.violations: list[tuple[int, str]] = []
        self.sent_events: list[SentEvent] = []
        self.rules = rules
        self.strict = strict
        self.allow_violations = allow_violations
        self._served = 0
        self._connections = 0
        self._open: set[socket.socket] = set()
        self._replies: deque[_Reply] = deque()
        self._responder: Callable[[dict[str, Any]], None] | None = None
        self._lock = threading.RLock()
        self._closing = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def __repr__(self) -> str:
        where = self.base_url if self._server is not None else "not started"
        return f"<FakeProvider {where}: {len(self.requests)} requests, {self.pending} pending>"

    # --- lifecycle ---------------------------------------------------------------------

    def start(self) -> FakeProvider:
        if self._server is not None:
            return self
        server = _Server(("127.0.0.1", 0), _handler_for(self))
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving and drop every open connection, so no pooled client can reach a
        handler of this server after it is closed."""
        self._closing.set()  # wakes hung handlers
        if self._server is not None:
            self._server.shutdown()
            with self._lock:
                still_open = list(self._open)
            for sock in still_open:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
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
        if exc_type is None and self.violations and not self.allow_violations:
            listed = "\n".join(f"  request {i}: {problem}" for i, problem in self.violations)
            raise AssertionError(f"Keel sent requests a strict server would reject:\n{listed}")

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

    @property
    def served(self) -> int:
        """Answers written to the end (a dropped or cut answer does not count)."""
        with self._lock:
            return self._served

    @property
    def connections(self) -> int:
        """TCP connections accepted so far: fewer than requests means connections reused."""
        with self._lock:
            return self._connections

    # --- scripting ---------------------------------------------------------------------

    def reply(
        self,
        content: str | None = None,
        tool_calls: Sequence[ToolCallScript] = (),
        *,
        usage: tuple[int, int] | Mapping[str, Any] | None = None,
        reasoning_content: str | None = None,
        reasoning: str | None = None,
        refusal: str | None = None,
        finish_reason: str | None = None,
        model: str | None = None,
        delay: float = 0.0,
        keepalive: bool = False,
        cut_after: int | None = None,
        delay_per_event: float = 0.0,
    ) -> FakeProvider:
        """Queue a successful completion (streamed when the request asks for a stream).

        A tool call is (name, arguments) or (name, arguments, id): arguments are sent
        verbatim when a string, serialised when a mapping; an id of None leaves the id
        out. `usage` is (prompt, completion) tokens, or the provider's whole ``usage``
        object as it would send it (cached and reasoning token details included); left
        out when None. `reasoning_content` is DeepSeek's reasoning field, `reasoning`
        OpenRouter's and vLLM's. `finish_reason` defaults to ``tool_calls`` or ``stop``.
        `delay` waits before answering; `keepalive`, `cut_after` and `delay_per_event`
        shape a streamed answer (see `_StreamShape`).
        """
        index = len(self.requests) + self.pending
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if reasoning_content is not None:
            message["reasoning_content"] = reasoning_content
        if reasoning is not None:
            message["reasoning"] = reasoning
        if refusal is not None:
            message["refusal"] = refusal
        if tool_calls:
            message["tool_calls"] = [
                _scripted_call(script, f"call_fake_{index}_{i}")
                for i, script in enumerate(tool_calls)
            ]
        turn: dict[str, Any] = {
            "id": f"chatcmpl-fake-{index}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model or "fake-model",
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": finish_reason or ("tool_calls" if tool_calls else "stop"),
                }
            ],
        }
        if isinstance(usage, tuple):
            turn["usage"] = {
                "prompt_tokens": usage[0],
                "completion_tokens": usage[1],
                "total_tokens": usage[0] + usage[1],
            }
        elif usage is not None:
            turn["usage"] = dict(usage)
        shape = _StreamShape(
            keepalive=keepalive, cut_after=cut_after, delay_per_event=delay_per_event
        )
        return self._queue(_Reply(body=json.dumps(turn), delay=delay, turn=turn, shape=shape))

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
        self,
        status: int,
        body_text: str,
        *,
        headers: Mapping[str, str] | None = None,
        delay: float = 0.0,
        keepalive: bool = False,
        cut_after: int | None = None,
        delay_per_event: float = 0.0,
    ) -> FakeProvider:
        """Queue a reply with exactly this status and body (a proxy's HTML page, a
        recorded answer). With a ``text/event-stream`` content type the body is written
        event by event (pieces ending in a blank line), shaped like `reply`'s streams;
        framing headers of a recording (length, transfer and content encoding) are
        replaced by this server's own."""
        kept = {k: v for k, v in (headers or {}).items() if k.lower() not in _FRAMING_HEADERS}
        shape = _StreamShape(
            keepalive=keepalive, cut_after=cut_after, delay_per_event=delay_per_event
        )
        return self._queue(
            _Reply(status=status, body=body_text, headers=kept, delay=delay, shape=shape)
        )

    def raw_fixture(
        self,
        exchange: RecordedExchange,
        *,
        delay: float = 0.0,
        keepalive: bool = False,
        cut_after: int | None = None,
        delay_per_event: float = 0.0,
    ) -> FakeProvider:
        """Queue a recorded provider answer (`keel.testing.recorded.load_fixture`) as it
        was served: its status, headers and exact body text."""
        return self.raw(
            exchange.status,
            exchange.body,
            headers=exchange.headers,
            delay=delay,
            keepalive=keepalive,
            cut_after=cut_after,
            delay_per_event=delay_per_event,
        )

    def respond_with(self, responder: Callable[[dict[str, Any]], None] | None) -> FakeProvider:
        """When a request finds no scripted reply, call ``responder(body)`` first: it
        queues the answer with `reply`, `fail` … (it runs holding the provider's lock, so
        concurrent requests each get their own). For workloads whose answers depend on
        the conversation, such as many runs at once."""
        with self._lock:
            self._responder = responder
        return self

    def _queue(self, reply: _Reply) -> FakeProvider:
        with self._lock:
            self._replies.append(reply)
        return self

    # --- serving (called from handler threads) -------------------------------------------

    def _take(self, body: Any, headers: _Headers, peer_port: int) -> tuple[int, _Reply]:
        with self._lock:
            index = len(self.requests)
            self.requests.append(body)
            self.headers.append(headers)
            self.peer_ports.append(peer_port)
            problems = (
                check_request(body, self._rules_for(body))
                if isinstance(body, dict)
                else ["the request body is not a JSON object"]
            )
            self.violations.extend((index, problem) for problem in problems)
            if problems and self.strict:
                return index, _Reply(status=400, body=_invalid_request(problems))
            if not self._replies and self._responder is not None:
                self._responder(body)
            if self._replies:
                return index, self._replies.popleft()
        message = f"FakeProvider: no scripted reply left (request {index + 1})"
        return index, _Reply(status=500, body=json.dumps({"error": {"message": message}}))

    def _rules_for(self, body: Mapping[str, Any]) -> str:
        if self.rules is not None:
            return self.rules
        return "deepseek" if "deepseek" in str(body.get("model", "")).lower() else "compatible"

    def _sent(self, request: int, data: str) -> None:
        with self._lock:  # recorded before the write: a client never sees an unlisted event
            at = time.perf_counter()
            self.sent_events.append(SentEvent(request=request, data=data, at=at))

    def _answered(self, count: int) -> None:
        with self._lock:
            self._served += count

    def _track(self, sock: socket.socket, *, opened: bool) -> None:
        with self._lock:
            self._connections += opened
            (self._open.add if opened else self._open.discard)(sock)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away is ordinary here; anything else is reported."""
        if isinstance(sys.exc_info()[1], OSError):
            return
        super().handle_error(request, client_address)


def _handler_for(provider: FakeProvider) -> type[BaseHTTPRequestHandler]:
    class ChatCompletionsHandler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def setup(self) -> None:
            super().setup()
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            provider._track(self.connection, opened=True)

        def finish(self) -> None:
            provider._track(self.connection, opened=False)
            with contextlib.suppress(OSError):
                super().finish()

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
            headers = _Headers({k.lower(): v for k, v in self.headers.items()})
            index, reply = provider._take(body, headers, int(self.client_address[1]))
            if reply.delay and provider._closing.wait(reply.delay):
                reply = _Reply(disconnect=True)  # server closing: do not keep the client
            if reply.disconnect:
                self._drop()
                return
            streams = isinstance(body, dict) and body.get("stream") is True
            if reply.turn is not None and streams:
                options = body.get("stream_options")
                usage = isinstance(options, dict) and options.get("include_usage") is True
                self._stream(index, reply, stream_events(reply.turn, include_usage=usage))
            elif _is_event_stream(reply):
                self._stream(index, reply, split_events(reply.body))
            else:
                self._send(reply)

        def _send(self, reply: _Reply) -> None:
            data = reply.body.encode("utf-8")
            try:
                self.send_response(reply.status)
                if not _has_header(reply.headers, "content-type"):
                    self.send_header("Content-Type", _content_type(reply.body))
                self.send_header("Content-Length", str(len(data)))
                for name, value in reply.headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self._last_write(data)
            except OSError:  # the client gave up (timed out) before the answer
                self.close_connection = True

        def _stream(self, index: int, reply: _Reply, events: Sequence[str]) -> None:
            """Write `events` one chunk each, flushed as written (or cut, as scripted)."""
            shape = reply.shape
            if shape.cut_after is not None:
                events = [e for e in events if not is_done(e)][: shape.cut_after]
            try:
                self.send_response(reply.status)
                if not _has_header(reply.headers, "content-type"):
                    self.send_header("Content-Type", "text/event-stream; charset=utf-8")
                    self.send_header("Cache-Control", "no-cache")
                self.send_header("Transfer-Encoding", "chunked")
                for name, value in reply.headers.items():
                    self.send_header(name, value)
                self.end_headers()
                for event in events:
                    if shape.delay_per_event and provider._closing.wait(shape.delay_per_event):
                        self._drop()
                        return
                    if shape.keepalive:
                        self._chunk(": keep-alive\n\n")
                    provider._sent(index, event)
                    self._chunk(event)
                if shape.cut_after is not None:
                    self._drop()  # no closing chunk: the client sees a cut stream
                    return
                self._last_write(b"0\r\n\r\n")
            except OSError:
                self.close_connection = True

        def _last_write(self, data: bytes) -> None:
            """Counted as served before the client can see the end of the answer."""
            provider._answered(1)
            try:
                self.wfile.write(data)
            except OSError:
                provider._answered(-1)
                raise

        def _chunk(self, text: str) -> None:
            data = text.encode("utf-8")
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

        def _drop(self) -> None:
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)

        def log_message(self, format: str, *args: Any) -> None:
            """Silent: nothing below the CLI prints."""

    return ChatCompletionsHandler


def _scripted_call(script: ToolCallScript, default_id: str) -> dict[str, Any]:
    name, arguments = script[0], script[1]
    call_id = script[2] if len(script) == 3 else default_id
    call: dict[str, Any] = {} if call_id is None else {"id": call_id}
    call["type"] = "function"
    call["function"] = {
        "name": name,
        "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
    }
    return call


def _is_event_stream(reply: _Reply) -> bool:
    return any(
        k.lower() == "content-type" and v.lower().startswith("text/event-stream")
        for k, v in reply.headers.items()
    )


def _has_header(headers: Mapping[str, str], name: str) -> bool:
    return any(k.lower() == name for k in headers)


def _invalid_request(problems: Sequence[str]) -> str:
    error = {
        "message": "; ".join(problems),
        "type": "invalid_request_error",
        "param": None,
        "code": "invalid_request_error",
    }
    return json.dumps({"error": error})


def _error(message: str) -> str:
    return json.dumps({"error": {"message": f"FakeProvider: {message}"}})


def _content_type(body: str) -> str:
    try:
        json.loads(body)
    except json.JSONDecodeError:
        return "text/html; charset=utf-8"
    return "application/json"
