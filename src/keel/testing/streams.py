"""A scripted completion as a provider streams it (``text/event-stream``), for FakeProvider.

Pure text building: the chunk shapes follow what OpenAI and DeepSeek send
(``chat.completion.chunk`` objects, a usage-only last chunk when asked, ``[DONE]``),
so Keel's stream reader meets in tests what it meets in production.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from typing import Any

ARGUMENT_PIECE = 8  # characters of tool-call arguments per streamed delta
DONE = "data: [DONE]\n\n"


def stream_events(turn: Mapping[str, Any], *, include_usage: bool) -> list[str]:
    """A scripted completion as a provider streams it, one ``data:`` event per chunk.

    A role chunk; reasoning, content and refusal text a word per delta; each tool call
    by index (the first delta with id, type, name and a first piece of the arguments,
    then the rest in pieces); a chunk with the finish reason; with `include_usage` and
    a scripted usage, a last chunk with no choices and the usage; then ``[DONE]``.
    """
    choice = turn["choices"][0]
    message: Mapping[str, Any] = choice["message"]
    head = {
        "id": turn["id"],
        "object": "chat.completion.chunk",
        "created": turn["created"],
        "model": turn["model"],
    }

    def chunk(delta: Mapping[str, Any], finish: str | None = None) -> dict[str, Any]:
        choices = [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]
        return {**head, "choices": choices}

    chunks = [chunk({"role": "assistant", "content": ""})]
    for name in ("reasoning_content", "reasoning", "content", "refusal"):
        text = message.get(name)
        if isinstance(text, str):
            chunks += [chunk({name: piece}) for piece in _words(text)]
    for i, call in enumerate(message.get("tool_calls") or ()):
        arguments = call["function"]["arguments"]
        pieces = [
            arguments[at : at + ARGUMENT_PIECE] for at in range(0, len(arguments), ARGUMENT_PIECE)
        ] or [""]
        first: dict[str, Any] = {"index": i}
        if "id" in call:
            first["id"] = call["id"]
        first["type"] = "function"
        first["function"] = {"name": call["function"]["name"], "arguments": pieces[0]}
        chunks.append(chunk({"tool_calls": [first]}))
        chunks += [
            chunk({"tool_calls": [{"index": i, "function": {"arguments": piece}}]})
            for piece in pieces[1:]
        ]
    chunks.append(chunk({}, choice["finish_reason"]))
    if include_usage and "usage" in turn:
        chunks.append({**head, "choices": [], "usage": turn["usage"]})
    return [f"data: {json.dumps(c, separators=(',', ':'))}\n\n" for c in chunks] + [DONE]


_WORD = re.compile(r"\S+\s*|\s+")


def _words(text: str) -> Iterator[str]:
    return (m.group() for m in _WORD.finditer(text))


def is_done(event: str) -> bool:
    """Whether `event` is the stream's ``data: [DONE]`` terminator."""
    return event.strip().replace(" ", "") == "data:[DONE]"
