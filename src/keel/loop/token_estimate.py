"""A deterministic estimate of how many tokens a request takes (pure).

No tokenizer is shipped for every provider, so the estimate is the same simple rule
everywhere: one token per ``CHARS_PER_TOKEN`` characters (rounded up) of what is sent —
a message's content, its reasoning, each tool call's name and argument text — plus
``MESSAGE_OVERHEAD`` tokens per message for the role and framing; the offered tools
count as the characters of their JSON (name, description, schema). Four characters a
token is about right for English and code with the common BPE tokenizers and on the
high side for them, so a budget is reached early rather than late; the provider's
context-overflow error is the backstop (``keel.loop.context``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from keel.models.base import Message, ToolSpec

CHARS_PER_TOKEN = 4
MESSAGE_OVERHEAD = 4  # tokens of role and framing per message


def text_tokens(text: str | None) -> int:
    """Tokens of ``text``: its characters / 4, rounded up (0 for none)."""
    return -(-len(text) // CHARS_PER_TOKEN) if text else 0


def message_tokens(message: Message) -> int:
    """Tokens of one message as sent: overhead, content, reasoning, tool calls."""
    chars = len(message.content or "") + len(message.reasoning or "")
    for call in message.tool_calls:
        chars += len(call.id) + len(call.name) + len(call.arguments)
    chars += len(message.tool_call_id or "")
    return MESSAGE_OVERHEAD + -(-chars // CHARS_PER_TOKEN)


def specs_tokens(specs: Iterable[ToolSpec]) -> int:
    """Tokens of the offered tools: the characters of each one's JSON, / 4 rounded up."""
    chars = sum(
        len(json.dumps({"name": s.name, "description": s.description, "parameters": s.parameters}))
        for s in specs
    )
    return -(-chars // CHARS_PER_TOKEN)


def messages_tokens(messages: Iterable[Message]) -> int:
    """Tokens of ``messages`` counted afresh (tests compare the running totals to it)."""
    return sum(message_tokens(m) for m in messages)
