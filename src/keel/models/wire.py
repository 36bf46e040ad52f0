"""The chat-completions wire format: the request body sent and the answer read back.

Pure: no I/O. The transport (`keel.models.openai_compat`) posts `request_body` and feeds
what comes back — a JSON response or a stream assembled into the same shape
(`keel.models.stream`) — to `parse_response`. Provider differences come from the
`ProviderProfile`, never from branches on a provider's name here.

What is sent must be valid for the strictest server, whatever the history holds: the
history is repaired first (`repair_history`), and no field outside the chat-completions
schema is ever sent — a model's reasoning only as the profile's `echo_field`, only when
the profile requires it (DeepSeek's thinking mode) and only on assistant messages that
made tool calls (https://api-docs.deepseek.com/guides/thinking_mode).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, cast

from keel.core.errors import ModelError
from keel.models.base import FinishReason, Message, TokenUsage, ToolCall, ToolSpec
from keel.models.profiles import RETRY, ProviderProfile

NO_RESULT = "(no result recorded for this call)"
"""The content of the tool message supplied for a call that has no recorded answer."""

EARLIER_RESULT_PREFIX = "[tool result for an earlier call] "
"""How a tool answer that no call of its assistant turn asked for is shown instead."""

_EXCERPT_CHARS = 500


# --- the history ----------------------------------------------------------------------


def repair_history(messages: Sequence[Message]) -> tuple[Message, ...]:
    """`messages` made valid for a strict chat-completions server. Pure.

    The rules, each because a strict server answers 400 otherwise:

    1. Every assistant tool call has an id: an empty id, or one repeated within the
       same message, becomes ``call_m{message_index}_{call_index}`` — stable, so the
       same history is always sent the same way (prompt caches keep hitting).
    2. Every call's arguments are the text of a JSON object: malformed text, or JSON
       that is not an object, is sent as ``{}``. The tool message that answered the call
       already tells the model what was wrong.
    3. An assistant message with tool calls is followed at once by exactly one tool
       message per call, in call order. Answers are looked for between the assistant
       message and the next assistant message, matched by the call's original id (empty
       ids in order): an answer found later in that span — after a harness note, say —
       is moved up; the first answer to an id counts; a call with no answer gets a tool
       message saying ``(no result recorded for this call)``.
    4. A tool message answering no call of the assistant turn before it (an orphan, or
       a second answer to one id) becomes, where it stands, a user message
       ``[tool result for an earlier call] …``: what it says is kept, never dropped.
    5. Nothing else moves: system messages stay where they are (first, when they came
       first), and messages that need no change are returned as they were.
    """
    source = tuple(messages)
    repaired: list[Message] = []
    used: set[int] = set()
    for index, message in enumerate(source):
        if index in used:
            continue
        if message.role == "tool":
            repaired.append(_as_note(message))
        elif message.role == "assistant" and message.tool_calls:
            calls = _repaired_calls(index, message.tool_calls)
            repaired.append(
                message if calls == message.tool_calls else replace(message, tool_calls=calls)
            )
            end = next(
                (k for k in range(index + 1, len(source)) if source[k].role == "assistant"),
                len(source),
            )
            for original, call in zip(message.tool_calls, calls, strict=True):
                repaired.append(_answer(source, index + 1, end, used, original.id, call.id))
        else:
            repaired.append(message)
    return tuple(repaired)


def _repaired_calls(index: int, calls: tuple[ToolCall, ...]) -> tuple[ToolCall, ...]:
    seen: set[str] = set()
    taken = {call.id for call in calls}
    fixed: list[ToolCall] = []
    for position, call in enumerate(calls):
        call_id = call.id
        if not call_id or call_id in seen:
            call_id = f"call_m{index}_{position}"
            while call_id in taken or call_id in seen:  # a model chose that id itself
                call_id += "_"
        seen.add(call_id)
        arguments = call.arguments if _is_object_text(call.arguments) else "{}"
        if call_id == call.id and arguments == call.arguments:
            fixed.append(call)
        else:
            fixed.append(replace(call, id=call_id, arguments=arguments))
    return tuple(fixed)


def _is_object_text(text: object) -> bool:
    if not isinstance(text, str):
        return False
    try:
        return isinstance(json.loads(text), dict)
    except (ValueError, RecursionError):
        return False


def _answer(
    source: tuple[Message, ...],
    start: int,
    end: int,
    used: set[int],
    original_id: str,
    call_id: str,
) -> Message:
    """The tool message answering `original_id` within ``source[start:end]`` (marked used),
    re-addressed to `call_id`; a "no result" message when there is none."""
    for k in range(start, end):
        candidate = source[k]
        if k in used or candidate.role != "tool":
            continue
        if (candidate.tool_call_id or "") == (original_id or ""):
            used.add(k)
            if candidate.tool_call_id == call_id:
                return candidate
            return replace(candidate, tool_call_id=call_id)
    return Message(role="tool", tool_call_id=call_id, content=NO_RESULT)


def _as_note(message: Message) -> Message:
    return Message(role="user", content=EARLIER_RESULT_PREFIX + (message.content or ""))


# --- the request ----------------------------------------------------------------------


def request_body(
    profile: ProviderProfile,
    model: str,
    messages: Sequence[Message],
    tools: Sequence[ToolSpec],
    *,
    stream: bool,
) -> dict[str, Any]:
    """The chat-completions request body for `messages` (repaired first).

    Keys: ``model``, ``messages``, ``stream``; ``tools`` when any are offered;
    ``stream_options`` when streaming and the profile has them. Nothing else.
    """
    body: dict[str, Any] = {
        "model": model,
        "messages": [wire_message(profile, m) for m in repair_history(messages)],
        "stream": stream,
    }
    if tools:
        body["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": tool.name,
                    "description": tool.description,
                    "parameters": tool.parameters,
                },
            }
            for tool in tools
        ]
    if stream and profile.stream_options is not None:
        body["stream_options"] = dict(profile.stream_options)
    return body


def wire_message(profile: ProviderProfile, message: Message) -> dict[str, Any]:
    """One (already repaired) message as the provider expects it.

    An assistant message with tool calls may have null content; any other message's
    content is text (``""`` when empty). Reasoning goes out as `profile.echo_field` only
    when the profile echoes it and only on a message that made tool calls — there always,
    as ``""`` when none was recorded: DeepSeek's thinking mode answers 400 when such a
    message lacks the field, and accepts it empty (a history from another model, a turn
    that streamed no reasoning).
    """
    if message.role == "tool":
        return {
            "role": "tool",
            "tool_call_id": message.tool_call_id or "",
            "content": message.content or "",
        }
    if message.role == "assistant" and message.tool_calls:
        wire: dict[str, Any] = {
            "role": "assistant",
            "content": message.content,
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }
                for call in message.tool_calls
            ],
        }
        if profile.echo_reasoning:
            reasoning = message.reasoning if isinstance(message.reasoning, str) else ""
            wire[profile.echo_field] = reasoning
        return wire
    return {"role": message.role, "content": message.content or ""}


# --- the response ---------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class ParsedResponse:
    """One chat-completions answer, normalised by the provider profile.

    `provider_finish_reason` is the provider's own word when it differs from
    `finish_reason` (None otherwise); `retry` says the provider's finish reason means
    "interrupted, ask again" (DeepSeek's ``insufficient_system_resource``).
    """

    content: str | None
    reasoning: str | None
    tool_calls: tuple[ToolCall, ...]
    usage: TokenUsage
    finish_reason: FinishReason
    provider_finish_reason: str | None
    refusal: str | None
    model: str
    retry: bool


def parse_response(
    profile: ProviderProfile, payload: Mapping[str, Any], *, model: str, step: int
) -> ParsedResponse:
    """The first choice of a chat-completions `payload`, read through `profile`.

    A call without an id gets ``call_{step}_{index}``; object arguments are serialised
    to JSON text. Usage counts that are missing, negative or not integers read as 0; the
    cached part is at most the input and the reasoning part at most the output. The
    finish reason is mapped by the profile (unknown: ``stop``, the word kept; missing:
    ``tool_calls`` when calls came, else ``stop``); a non-empty ``message.refusal``
    makes it ``refusal``. Raises `ModelError` when the payload has no choice or the
    first choice no message, quoting the provider.
    """
    choices = payload.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
        raise ModelError(f"{model}: the response has no choices: {_provider_words(payload)}")
    choice = cast(Mapping[str, Any], choices[0])
    message = choice.get("message")
    if not isinstance(message, Mapping):
        raise ModelError(
            f"{model}: the response's first choice has no message: {_provider_words(payload)}"
        )
    calls = _tool_calls(message, step)
    finish, provider_word, retry = _finish(profile, choice.get("finish_reason"), bool(calls))
    refusal = message.get("refusal")
    refusal = refusal if isinstance(refusal, str) and refusal.strip() else None
    if refusal is not None:
        finish, retry = "refusal", False
        raw = choice.get("finish_reason")
        provider_word = raw if isinstance(raw, str) and raw and raw != "refusal" else None
    reported = payload.get("model")
    return ParsedResponse(
        content=_text(message.get("content")),
        reasoning=_reasoning(profile, message),
        tool_calls=calls,
        usage=_usage(profile, payload.get("usage")),
        finish_reason=finish,
        provider_finish_reason=provider_word,
        refusal=refusal,
        model=reported if isinstance(reported, str) and reported else model,
        retry=retry,
    )


def _finish(
    profile: ProviderProfile, raw: object, has_calls: bool
) -> tuple[FinishReason, str | None, bool]:
    """(normalised reason, the provider's word when it differs, ask again?)."""
    if not isinstance(raw, str) or not raw:
        return ("tool_calls" if has_calls else "stop"), None, False
    mapped = profile.finish_reasons.get(raw)
    if mapped == RETRY:
        return ("tool_calls" if has_calls else "stop"), raw, True
    finish: FinishReason = _as_finish_reason(mapped) if mapped is not None else "stop"
    return finish, (raw if raw != finish else None), False


def _as_finish_reason(word: str) -> FinishReason:
    if word in ("stop", "tool_calls", "length", "content_filter", "refusal"):
        return cast(FinishReason, word)
    return "stop"  # a profile table naming something else: treated like an unknown word


def _text(value: object) -> str | None:
    """Text content: a string, or the text parts of a content-parts list."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):  # [{"type": "text", "text": "…"}, …]
        parts = [
            part["text"]
            for part in value
            if isinstance(part, Mapping) and isinstance(part.get("text"), str)
        ]
        return "".join(parts) if parts else None
    return None


def _reasoning(profile: ProviderProfile, message: Mapping[str, Any]) -> str | None:
    for field in profile.reasoning_fields:
        text = _text(message.get(field))
        if text:
            return text
    return None


def _tool_calls(message: Mapping[str, Any], step: int) -> tuple[ToolCall, ...]:
    raw = message.get("tool_calls")
    if not isinstance(raw, list):
        legacy = message.get("function_call")  # OpenAI's deprecated single function call
        raw = [{"function": legacy}] if isinstance(legacy, Mapping) else []
    calls: list[ToolCall] = []
    for index, item in enumerate(raw):
        if not isinstance(item, Mapping):
            continue
        function = item.get("function")
        function = function if isinstance(function, Mapping) else {}
        arguments = function.get("arguments")
        if arguments is None:
            arguments = ""
        elif not isinstance(arguments, str):  # some servers send the object itself
            arguments = json.dumps(arguments, ensure_ascii=False)
        call_id = item.get("id")
        name = function.get("name")
        calls.append(
            ToolCall(
                id=call_id if isinstance(call_id, str) and call_id else f"call_{step}_{index}",
                name=name if isinstance(name, str) else "",
                arguments=arguments,
            )
        )
    return tuple(calls)


def _usage(profile: ProviderProfile, raw: object) -> TokenUsage:
    if not isinstance(raw, Mapping):
        return TokenUsage(input_tokens=0, output_tokens=0)
    input_tokens = _count(raw.get("prompt_tokens"))
    output_tokens = _count(raw.get("completion_tokens"))
    cached = _first_count(raw, profile.cached_tokens_paths)
    reasoning = _first_count(raw, profile.reasoning_tokens_paths)
    return TokenUsage(
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        cached_input_tokens=min(cached, input_tokens),
        reasoning_tokens=min(reasoning, output_tokens),
    )


def _first_count(usage: Mapping[str, Any], paths: tuple[tuple[str, ...], ...]) -> int:
    """The count at the first path that holds an integer (0 if none does)."""
    for path in paths:
        value: object = usage
        for key in path:
            value = value.get(key) if isinstance(value, Mapping) else None
        if isinstance(value, int) and not isinstance(value, bool):
            return max(value, 0)
    return 0


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _provider_words(payload: Mapping[str, Any]) -> str:
    """The provider's own error message in `payload`, else an excerpt of the payload."""
    error = payload.get("error")
    if isinstance(error, Mapping) and isinstance(error.get("message"), str):
        return str(error["message"])
    if isinstance(error, str) and error:
        return error
    for key in ("message", "detail"):
        if isinstance(payload.get(key), str) and payload[key]:
            return str(payload[key])
    text = json.dumps(payload, ensure_ascii=False, default=str)
    return text if len(text) <= _EXCERPT_CHARS else text[:_EXCERPT_CHARS] + "…"


__all__ = [
    "EARLIER_RESULT_PREFIX",
    "NO_RESULT",
    "ParsedResponse",
    "parse_response",
    "repair_history",
    "request_body",
    "wire_message",
]
