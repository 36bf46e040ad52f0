"""Server-sent events from a streaming chat-completions answer, folded into one payload.

`read_events` turns text lines (the body split at line breaks, terminators removed)
into events: ``:`` comments and keep-alives are skipped, consecutive ``data:`` lines are
joined with a newline, ``event:`` names the event, a blank line ends it.
`StreamAccumulator` folds the ``chat.completion.chunk`` objects those events carry into
one payload shaped like a non-streaming response, so the provider profile's
`parse_response` reads both alike.

What counts as a complete answer is decided here and nowhere else: a ``data: [DONE]``
event or a finish reason. A stream that ends without either was cut (a dropped
connection, a proxy's idle timeout) and raises `StreamCut`: the whole attempt is
retried and nothing of it is kept. An ``{"error": …}`` object inside the stream raises
`StreamError` carrying the exact text, for the adapter to classify like an HTTP error —
unless the answer had already ended with a finish reason, which then stands.

Cost: at most one JSON decode per data line and no per-character work in Python; the
text the chunks of one stream share is decoded once (`_ChunkShape`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from keel.models.base import StreamDelta

DONE = "[DONE]"


class StreamCut(Exception):
    """The stream ended before the answer did (no ``[DONE]``, no finish reason), or it
    carried data that is not a JSON object. Never escapes the adapter: it is one failed
    attempt, retried whole."""


class StreamError(Exception):
    """The stream carried an error object; `text` is the event's exact data, `error`
    the parsed object. Never escapes the adapter, which classifies it like an HTTP
    error body."""

    def __init__(self, text: str, error: Any) -> None:
        super().__init__(text)
        self.text = text
        self.error = error


SSEEvent = tuple[str, str, bool]
"""One server-sent event: ``(event name, data, complete)``; `complete` is False for an
event the body ended in before its blank line (its data may be cut short). A plain
tuple: one is made per streamed piece, and a named tuple costs twice as much."""


def body_lines(chunks: Iterable[bytes], encoding: str = "utf-8") -> Iterator[str]:
    """The lines of a body arriving as `chunks` of bytes, without their terminators
    (CR LF, LF or CR, as SSE allows), decoded with bad bytes replaced.

    What ``httpx.Response.iter_lines`` gives, from the bytes directly: one split and
    one decode per chunk's complete lines, no text decoder between. A line break is
    ASCII, never part of a multi-byte character, so decoding whole lines is exact
    however the chunks cut the body; a CR ending one chunk and a LF opening the next
    are one break. The last line is given even without a break after it.
    """
    tail: list[bytes] = []  # the line not ended yet, in pieces (none holds a break)
    after_cr = False  # the previous chunk ended in CR: a LF opening this one is its pair
    for piece in chunks:
        data = piece[1:] if after_cr and piece[:1] == b"\n" else piece
        if not data:
            continue
        last = data[-1]
        after_cr = last == 13
        if b"\n" not in data and b"\r" not in data:
            tail.append(data)
            continue
        if tail:
            tail.append(data)
            data = b"".join(tail)
            tail.clear()
        lines = data.splitlines()  # bytes split at CR, LF and CR LF only
        if last != 10 and last != 13:  # noqa: PLR1714 - two int compares beat a tuple
            tail.append(lines.pop())
        for line in lines:
            yield line.decode(encoding, "replace")
    if tail:
        yield b"".join(tail).decode(encoding, "replace")


def read_events(lines: Iterable[str]) -> Iterator[SSEEvent]:
    """The events in `lines`, each yielded as soon as its blank line is read.

    Lines come without terminators (``httpx.Response.iter_lines``). ``id:`` and
    ``retry:`` fields are ignored: a chat answer is never resumed by id.
    """
    data: str | None = None
    name = "message"
    for line in lines:
        if not line:
            if data is not None:
                yield name, data, True
                data = None
            name = "message"
            continue
        field, value = _field(line)
        if field == "data":
            data = value if data is None else data + "\n" + value
        elif field == "event":
            name = value or "message"
    if data is not None:
        yield name, data, False


def _field(line: str) -> tuple[str, str]:
    """A non-blank line's field name and value (one leading space dropped); a comment
    (keep-alives, OpenRouter's ": OPENROUTER PROCESSING") has no name."""
    if line.startswith("data: "):
        return "data", line[6:]
    if line[0] == ":":
        return "", ""
    field, _, value = line.partition(":")
    return field, value[1:] if value.startswith(" ") else value


class StreamAccumulator:
    """Folds a streaming answer into one non-streaming-shaped payload.

    Only choice 0 is read (Keel never asks for more). Content, refusal and each reasoning
    field named in `reasoning_fields` are concatenated under their own names; tool-call
    deltas are merged by their ``index`` (id, type and name from the first delta that
    has them, arguments concatenated); the last chunk carrying ``usage`` gives the usage.
    `on_delta`, when given, is called with every non-empty piece, tagged with `attempt`.
    """

    _LEARN_TRIES = 3  # chunks tried as a `_ChunkShape` before parsing every one in full

    def __init__(
        self,
        reasoning_fields: Sequence[str] = ("reasoning_content", "reasoning"),
        *,
        on_delta: Callable[[StreamDelta], None] | None = None,
        attempt: int = 1,
    ) -> None:
        self._reasoning_fields = tuple(reasoning_fields)
        self._on_delta = on_delta
        self._attempt = attempt
        self._shape: _ChunkShape | None = None
        self._learn_tries = self._LEARN_TRIES
        self._head: dict[str, Any] = {}
        self._content: list[str] = []
        self._refusal: list[str] = []
        self._reasoning: dict[str, list[str]] = {}
        self._calls: dict[int, dict[str, Any]] = {}
        self._last_call = 0
        self._usage: Any = None
        self._finish_reason: Any = None
        self._chunks = 0
        self._answered = False
        self.done = False

    # --- input ------------------------------------------------------------------------

    def feed_lines(self, lines: Iterable[str]) -> None:
        """Read body lines until they run out; call `payload` afterwards.

        This is `read_events` with each event handled where it completes: the loop runs
        once per line of every streamed piece, so it avoids a generator and a call per
        event (the same rules, via `_field`).
        """
        data: str | None = None
        name = "message"
        for line in lines:
            if line:
                field, value = _field(line)
                if field == "data":
                    data = value if data is None else data + "\n" + value
                elif field == "event":
                    name = value or "message"
                continue
            if data is not None:
                shape = self._shape
                delta = shape.delta_of(data) if shape is not None and name == "message" else None
                if delta is not None:  # the common case: one more piece of the answer
                    self._chunks += 1
                    self._add_delta(delta)
                else:
                    self.add_event((name, data, True))
                data = None
            name = "message"
        if data is not None:
            self.add_event((name, data, False))

    def add_event(self, event: SSEEvent) -> None:
        """One SSE event. Raises `StreamError` for an error object and `StreamCut` for
        data that is not a JSON object; a half-written last event is dropped (the
        missing end then shows as a cut)."""
        name, data, complete = event
        if data == DONE:
            self.done = True
            return
        try:
            chunk = json.loads(data)
        except ValueError:
            if not complete:
                return
            raise StreamCut(f"the stream carried data that is not JSON: {data[:200]!r}") from None
        if not isinstance(chunk, dict):
            raise StreamCut(f"the stream carried data that is not a JSON object: {data[:200]!r}")
        if name == "error" or chunk.get("error"):
            if self._finish_reason:
                # The answer had already ended: the error only restates why (OpenRouter
                # sends "Token limit reached" after finish_reason "length"), and it may
                # carry the usage.
                self._usage = chunk.get("usage") or self._usage
                return
            # OpenRouter's mid-stream failure carries both an error and a choice with
            # finish_reason "error": the error says what happened.
            raise StreamError(data, chunk.get("error") or chunk)
        if self._shape is None and self._learn_tries and complete:
            self._learn_tries -= 1
            self._shape = _ChunkShape.learn(data, chunk)
        self.add_chunk(chunk)

    def add_chunk(self, chunk: dict[str, Any]) -> None:
        """One ``chat.completion.chunk`` object."""
        self._chunks += 1
        if not self._head:
            for key in ("id", "created", "model", "system_fingerprint"):
                if key in chunk:
                    self._head[key] = chunk[key]
        usage = chunk.get("usage")
        if usage:
            self._usage = usage
        choices = chunk.get("choices")
        if not choices or not isinstance(choices, list):
            return
        choice = choices[0]
        if not isinstance(choice, dict) or choice.get("index", 0) != 0:
            return
        self._answered = True
        delta = choice.get("delta")
        if delta and isinstance(delta, dict):
            self._add_delta(delta)
        reason = choice.get("finish_reason")
        if reason:
            self._finish_reason = reason

    def _add_delta(self, delta: dict[str, Any]) -> None:
        content = delta.get("content")
        if content and isinstance(content, str):
            self._content.append(content)
            if self._on_delta is not None:
                self._on_delta(StreamDelta(kind="content", text=content, attempt=self._attempt))
            if len(delta) == 1:
                return
        for field in self._reasoning_fields:
            piece = delta.get(field)
            if piece and isinstance(piece, str):
                self._reasoning.setdefault(field, []).append(piece)
                if self._on_delta is not None:
                    self._on_delta(StreamDelta(kind="reasoning", text=piece, attempt=self._attempt))
        refusal = delta.get("refusal")
        if refusal and isinstance(refusal, str):
            self._refusal.append(refusal)
        calls = delta.get("tool_calls")
        if calls and isinstance(calls, list):
            for call in calls:
                if isinstance(call, dict):
                    self._add_call_delta(call)

    def _add_call_delta(self, delta: dict[str, Any]) -> None:
        call_id = delta.get("id")
        index = delta.get("index")
        if not isinstance(index, int) or isinstance(index, bool):
            index = self._index_of_untagged(call_id)
        self._last_call = index
        call = self._calls.get(index)
        if call is None:
            call = self._calls[index] = {"id": None, "type": "function", "name": None, "args": []}
        if call_id and isinstance(call_id, str) and call["id"] is None:
            call["id"] = call_id
        kind = delta.get("type")
        if kind and isinstance(kind, str):
            call["type"] = kind
        function = delta.get("function")
        if not isinstance(function, dict):
            return
        named = False
        name = function.get("name")
        if name and isinstance(name, str) and call["name"] is None:
            call["name"] = name
            named = True
        arguments = function.get("arguments")
        if arguments is not None and not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False)  # a server sent the object
        if arguments:
            call["args"].append(arguments)
        if self._on_delta is not None and (arguments or named):
            self._on_delta(
                StreamDelta(
                    kind="tool_call",
                    text=arguments or "",
                    attempt=self._attempt,
                    index=index,
                    name=call["name"],
                )
            )

    def _index_of_untagged(self, call_id: Any) -> int:
        """Where a tool-call delta without an ``index`` belongs (some servers omit it):
        the call with its id, a new call for a new id, else the call last added to."""
        if not call_id:
            return self._last_call
        for index, call in self._calls.items():
            if call["id"] == call_id:
                return index
        return max(self._calls, default=-1) + 1

    # --- output -----------------------------------------------------------------------

    @property
    def complete(self) -> bool:
        """Whether the answer ended: ``[DONE]`` came or a finish reason did."""
        return self.done or bool(self._finish_reason)

    def payload(self) -> dict[str, Any]:
        """The answer as a non-streaming chat-completions response (with no choices
        when no chunk carried one, which `parse_response` refuses).

        Raises `StreamCut` when the stream ended before the answer did.
        """
        if not self.complete:
            raise StreamCut(
                f"the stream ended after {self._chunks} chunk(s) without [DONE] "
                "or a finish reason (connection cut mid-answer)"
            )
        message: dict[str, Any] = {
            "role": "assistant",
            "content": "".join(self._content) if self._content else None,
        }
        for field, parts in self._reasoning.items():
            message[field] = "".join(parts)
        if self._refusal:
            message["refusal"] = "".join(self._refusal)
        if self._calls:
            message["tool_calls"] = [
                {
                    "id": call["id"],
                    "type": call["type"],
                    "function": {"name": call["name"], "arguments": "".join(call["args"])},
                }
                for _, call in sorted(self._calls.items())
            ]
        payload: dict[str, Any] = {**self._head, "object": "chat.completion"}
        payload["choices"] = (
            [{"index": 0, "message": message, "finish_reason": self._finish_reason}]
            if self._answered
            else []
        )
        if self._usage is not None:
            payload["usage"] = self._usage
        return payload


_DECODER = json.JSONDecoder()
# The C scanner `raw_decode` calls (set by `JSONDecoder.__init__`, not in the type stubs),
# called directly: its Python wrapper is a third of the cost of decoding a small delta.
# It raises StopIteration where `raw_decode` raises ValueError.
_SCAN: Callable[[str, int], tuple[Any, int]] = _DECODER.scan_once  # type: ignore[attr-defined]
_CHOICES = '"choices":'
_DELTA = '"delta":'


class _ChunkShape:
    """The text every chunk of one stream shares around its delta, learned from one
    chunk: `before` runs up to the value of ``choices[0].delta``, `after` from the end
    of that value to the end of the ``choices`` array.

    Learned only when provable: replacing the delta's text by ``{}`` in the learning
    chunk must give that chunk with an empty ``choices[0].delta`` (its delta is not
    empty, so a ``"delta":`` key found elsewhere fails the check). JSON is read left to
    right, so in a later chunk starting with `before` the value that follows is its
    ``choices[0].delta``; when `after` follows that, its choice is the learning chunk's
    (index 0, no finish reason) with this delta, and only the delta and the members
    after the choices (a usage object, an error) can matter.
    """

    __slots__ = ("after", "before")

    def __init__(self, before: str, after: str) -> None:
        self.before = before
        self.after = after

    @classmethod
    def learn(cls, data: str, chunk: dict[str, Any]) -> _ChunkShape | None:
        choices = chunk.get("choices")
        if not isinstance(choices, list) or len(choices) != 1:
            return None
        choice = choices[0]
        if not isinstance(choice, dict) or choice.get("index", 0) != 0:
            return None
        delta = choice.get("delta")
        if not delta or not isinstance(delta, dict) or choice.get("finish_reason"):
            return None
        try:
            array = _skip_space(data, data.index(_CHOICES) + len(_CHOICES))
            start = _skip_space(data, data.index(_DELTA, array) + len(_DELTA))
            _, end = _DECODER.raw_decode(data, start)
            _, stop = _DECODER.raw_decode(data, array)
            probe = json.loads(data[:start] + "{}" + data[end:])
        except ValueError:
            return None
        if probe != {**chunk, "choices": [{**choice, "delta": {}}]} or not end < stop:
            return None
        return cls(data[:start], data[end:stop])

    def delta_of(self, data: str) -> dict[str, Any] | None:
        """The delta of chunk `data` when it has this shape and carries nothing else
        that matters; None when it must be parsed in full (a finish reason, a usage
        object, an error, any other text)."""
        before = self.before
        if not data.startswith(before):
            return None
        try:
            delta, end = _SCAN(data, len(before))
        except StopIteration:
            return None
        after = self.after
        if type(delta) is not dict or not data.startswith(after, end):
            return None
        end += len(after)
        last = len(data) - 1
        if end == last and data[last] == "}":
            return delta
        # What follows the choices matters only when it holds an error or a usage object:
        # OpenAI sends "usage":null and a random "obfuscation" string in every chunk.
        if (
            end < last
            and data[end] == ","
            and data[last] == "}"
            and data.find('"error"', end) < 0
            and data.count('"usage":', end) == data.count('"usage":null', end)
        ):
            return delta
        return None


def _skip_space(text: str, at: int) -> int:
    while at < len(text) and text[at] in " \t\r\n":
        at += 1
    return at


__all__ = [
    "DONE",
    "SSEEvent",
    "StreamAccumulator",
    "StreamCut",
    "StreamError",
    "body_lines",
    "read_events",
]
