"""A model's turn made valid before anything of it is stored or acted on.

What a provider sends is untrusted text: a lone surrogate (``"\\ud800"`` in its JSON,
in the content, the reasoning, a tool's name or inside a call's argument text), an
empty or repeated call id, a finish reason no profile normalised. ``valid_turn``
replaces each lone surrogate with U+FFFD — inside the argument text too, where JSON
spells it as an escape — gives every call a distinct id, records an unknown finish
reason as the provider's own word and treats it as ``stop``, and lists what it
changed, so ``model_responded`` records both the valid turn and the fact that it was
changed (``sanitized``). Pure: no I/O.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from typing import Any, get_args

from keel.core.text import valid_data, valid_text
from keel.models.base import FinishReason, ModelTurn, ToolCall

_ESCAPED_SURROGATE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
FINISH_REASONS: frozenset[str] = frozenset(get_args(FinishReason))


def valid_turn(turn: ModelTurn) -> tuple[ModelTurn, list[str]]:
    """``turn`` with valid text and distinct call ids, and what was changed (one line each)."""
    fixes: list[str] = []
    content = _fixed(turn.content, "content", fixes)
    reasoning = _fixed(turn.reasoning, "reasoning", fixes)
    refusal = _fixed(turn.refusal, "refusal", fixes)
    provider_finish = _fixed(turn.provider_finish_reason, "provider_finish_reason", fixes)
    finish: Any = turn.finish_reason
    if finish not in FINISH_REASONS:
        fixes.append(f"finish_reason: {finish!r} is not a known reason; treated as 'stop'")
        provider_finish = provider_finish or _fixed(str(finish), "finish_reason", fixes)
        finish = "stop"
    model = _fixed(turn.model, "model", fixes) or ""
    calls: list[ToolCall] = []
    seen: set[str] = set()
    for index, call in enumerate(turn.tool_calls):
        where = f"tool_calls[{index}]"
        call_id = _fixed(call.id, f"{where}.id", fixes) or ""
        if not call_id or call_id in seen:
            fresh = _fresh_id(call_id or f"call_{index}", seen)
            fixes.append(f"{where}.id: {'empty' if not call_id else 'repeated'}; now {fresh!r}")
            call_id = fresh
        seen.add(call_id)
        name = _fixed(call.name, f"{where}.name", fixes) or ""
        arguments = _valid_arguments(call.arguments, f"{where}.arguments", fixes)
        calls.append(ToolCall(id=call_id, name=name, arguments=arguments))
    if not fixes:
        return turn, fixes
    valid = replace(
        turn,
        content=content,
        reasoning=reasoning,
        model=model,
        tool_calls=tuple(calls),
        refusal=refusal,
        provider_finish_reason=provider_finish,
        finish_reason=finish,
    )
    return valid, fixes


def _fixed(text: str | None, where: str, fixes: list[str]) -> str | None:
    if text is None:
        return None
    if not isinstance(text, str):  # a provider adapter let something else through
        fixes.append(f"{where}: {type(text).__name__} turned into text")
        text = str(text)
    fixed, count = valid_text(text)
    if count:
        fixes.append(f"{where}: {count} lone surrogate(s) replaced with U+FFFD")
    return fixed


def _valid_arguments(raw: Any, where: str, fixes: list[str]) -> str:
    text = _fixed(raw if isinstance(raw, str) or raw is None else json.dumps(raw), where, fixes)
    text = text or ""
    if _ESCAPED_SURROGATE.search(text) is None:
        return text
    try:
        parsed = json.loads(text)
    except (ValueError, RecursionError):
        return text  # not JSON: the call is refused as such, and the text stays as sent
    fixed = valid_data(parsed)
    if fixed is parsed:
        return text  # the escapes were proper pairs
    fixes.append(f"{where}: lone surrogate escape(s) replaced with U+FFFD")
    return json.dumps(fixed, ensure_ascii=False)


def _fresh_id(base: str, seen: set[str]) -> str:
    number = 2
    while f"{base}#{number}" in seen:
        number += 1
    return f"{base}#{number}" if base in seen else base


__all__ = ["valid_turn"]
