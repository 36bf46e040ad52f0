"""The chat-completions request rules a strict server enforces, as a checker for tests.

`check_request` returns one precise message per broken rule (an empty list: a strict
server would take the body). The rules are those OpenAI's and DeepSeek's servers answer
with HTTP 400 — unknown fields, a tool message that answers nothing, a tool call left
unanswered, arguments that are not a JSON object — so a test that asserts an empty list
catches a request a real provider would refuse, without a real provider. Messages name
the place (``messages[3].tool_calls[0].function.arguments``) and what is expected.

DeepSeek's thinking mode adds a rule that depends on the responses, not on the request
alone (an assistant turn that called tools in thinking mode must carry its
``reasoning_content`` back): `missing_reasoning` lists the turns that do not, so a test
that knows the turns were thinking-mode turns can assert the documented rule.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal

Provider = Literal["deepseek", "openai", "compatible", "openai-compatible"]

TOP_LEVEL_FIELDS = frozenset(
    {
        "model",
        "messages",
        "tools",
        "tool_choice",
        "stream",
        "stream_options",
        "temperature",
        "max_tokens",
        "max_completion_tokens",
        "top_p",
        "stop",
        "n",
        "seed",
        "response_format",
        "parallel_tool_calls",
        "user",
        "reasoning_effort",
        "thinking",
        "frequency_penalty",
        "presence_penalty",
        "logprobs",
        "top_logprobs",
    }
)

_MESSAGE_FIELDS: Mapping[str, frozenset[str]] = {
    "system": frozenset({"role", "content", "name"}),
    "developer": frozenset({"role", "content", "name"}),
    "user": frozenset({"role", "content", "name"}),
    "assistant": frozenset({"role", "content", "tool_calls", "name", "refusal"}),
    "tool": frozenset({"role", "content", "tool_call_id"}),
}
_TOOL_CALL_FIELDS = frozenset({"id", "type", "function"})
_FUNCTION_CALL_FIELDS = frozenset({"name", "arguments"})
_TOOL_FIELDS = frozenset({"type", "function"})
_FUNCTION_FIELDS = frozenset({"name", "description", "parameters", "strict"})
_FUNCTION_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_REASONING_FIELD = "reasoning_content"


def check_request(body: Mapping[str, Any], provider: str = "compatible") -> list[str]:
    """Every rule of a strict chat-completions server that `body` breaks, one message each.

    `provider` is ``deepseek``, ``openai`` or ``compatible`` (any other OpenAI-compatible
    server): only DeepSeek takes ``reasoning_content`` on assistant messages, only OpenAI
    knows the ``developer`` role.
    """
    kind = _provider(provider)
    problems: list[str] = []
    for name in sorted(set(body) - TOP_LEVEL_FIELDS):
        problems.append(f"unknown top-level field {name!r}")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        problems.append("'model' must be a non-empty string")
    stream = body.get("stream")
    if "stream" in body and not isinstance(stream, bool):
        problems.append(f"'stream' must be true or false, got {stream!r}")
    if "stream_options" in body:
        if stream is not True:
            problems.append("'stream_options' is only allowed when 'stream' is true")
        options = body["stream_options"]
        if not isinstance(options, Mapping):
            problems.append("'stream_options' must be an object")
        elif not isinstance(options.get("include_usage", False), bool):
            problems.append("'stream_options.include_usage' must be true or false")
    problems += _check_messages(body.get("messages"), kind)
    problems += _check_tools(body)
    return problems


def missing_reasoning(body: Mapping[str, Any]) -> list[int]:
    """Indexes of assistant messages that made tool calls but carry no ``reasoning_content``.

    DeepSeek's thinking mode (api-docs.deepseek.com/guides/thinking_mode): between two
    user messages, an assistant turn that made tool calls must have its reasoning passed
    back in every later request, or the server answers 400.
    """
    messages = body.get("messages")
    if not isinstance(messages, Sequence) or isinstance(messages, str):
        return []
    return [
        i
        for i, message in enumerate(messages)
        if isinstance(message, Mapping)
        and message.get("role") == "assistant"
        and message.get("tool_calls")
        and not isinstance(message.get(_REASONING_FIELD), str)
    ]


# --- messages --------------------------------------------------------------------------


def _provider(provider: str) -> str:
    kind = "compatible" if provider == "openai-compatible" else provider
    if kind not in ("deepseek", "openai", "compatible"):
        raise ValueError(f"unknown provider {provider!r}: use deepseek, openai or compatible")
    return kind


def _allowed_fields(role: str, kind: str) -> frozenset[str]:
    allowed = _MESSAGE_FIELDS[role]
    if role == "assistant" and kind == "deepseek":
        return allowed | {_REASONING_FIELD}
    return allowed


def _check_messages(messages: object, kind: str) -> list[str]:
    if not isinstance(messages, list):
        return ["'messages' must be a list of messages"]
    if not messages:
        return ["'messages' must not be empty"]
    problems: list[str] = []
    known = set(_MESSAGE_FIELDS) - (set() if kind == "openai" else {"developer"})
    seen_other_role = False
    call_ids: dict[str, int] = {}  # every tool call id in the request -> its message
    answering: _OpenCalls | None = None  # the assistant turn whose answers may follow
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, Mapping):
            problems.append(f"{where} must be an object")
            continue
        role = message.get("role")
        if role not in known:
            problems.append(f"{where}.role {role!r} is not one of {', '.join(sorted(known))}")
            continue
        where = f"{where} ({role})"
        for name in sorted(set(message) - _allowed_fields(role, kind)):
            hint = (
                " (only DeepSeek takes reasoning back)"
                if name == _REASONING_FIELD and role == "assistant"
                else ""
            )
            article = "an" if role == "assistant" else "a"
            problems.append(
                f"{where}: field {name!r} is not allowed on {article} {role} message{hint}"
            )
        if role in ("system", "developer"):
            if seen_other_role:
                problems.append(
                    f"{where}: a {role} message may only come at the start, before any "
                    "user, assistant or tool message"
                )
        else:
            seen_other_role = True
        if role == "tool":
            problems += _check_tool_message(message, where, i, answering)
            continue
        if answering is not None:
            problems += answering.unanswered()
            answering = None
        if role == "assistant":
            problems += _check_assistant(message, where, i, kind, call_ids)
            calls = message.get("tool_calls")
            if isinstance(calls, list) and calls:
                answering = _OpenCalls(i, calls)
        else:
            problems += _check_content(message, where)
    if answering is not None:
        problems += answering.unanswered()
    return problems


class _OpenCalls:
    """The tool calls of one assistant message, and which tool messages answered them."""

    def __init__(self, index: int, calls: list[Any]) -> None:
        self.index = index
        self.ids = [c.get("id") for c in calls if isinstance(c, Mapping)]
        self.answered: dict[str, int] = {}

    def unanswered(self) -> list[str]:
        return [
            f"messages[{self.index}] (assistant): tool call {call_id!r} is not answered: "
            f"a tool message with tool_call_id {call_id!r} must follow it before any "
            "other message"
            for call_id in self.ids
            if isinstance(call_id, str) and call_id and call_id not in self.answered
        ]


def _check_tool_message(
    message: Mapping[str, Any], where: str, index: int, open_calls: _OpenCalls | None
) -> list[str]:
    problems = _check_content(message, where)
    call_id = message.get("tool_call_id")
    if not isinstance(call_id, str) or not call_id:
        return [*problems, f"{where}: 'tool_call_id' must be a non-empty string"]
    if open_calls is None:
        problems.append(
            f"{where}: tool_call_id {call_id!r} does not answer a tool call of the "
            "immediately preceding assistant message (there is none with tool calls)"
        )
    elif call_id not in open_calls.ids:
        called = ", ".join(repr(c) for c in open_calls.ids)
        problems.append(
            f"{where}: tool_call_id {call_id!r} does not answer a tool call of the "
            f"immediately preceding assistant message (messages[{open_calls.index}] "
            f"called {called})"
        )
    elif call_id in open_calls.answered:
        problems.append(
            f"{where}: a second tool message for call {call_id!r} "
            f"(first at messages[{open_calls.answered[call_id]}])"
        )
    else:
        open_calls.answered[call_id] = index
    return problems


def _check_content(message: Mapping[str, Any], where: str) -> list[str]:
    content = message.get("content")
    if not isinstance(content, str):
        return [f"{where}: 'content' must be a string, got {_kind(content)}"]
    return []


def _check_assistant(
    message: Mapping[str, Any], where: str, index: int, kind: str, call_ids: dict[str, int]
) -> list[str]:
    problems: list[str] = []
    calls = message.get("tool_calls")
    content = message.get("content")
    if "tool_calls" in message and (not isinstance(calls, list) or not calls):
        problems.append(f"{where}: 'tool_calls' must be a non-empty list when present")
        calls = None
    if content is None and not calls:
        problems.append(
            f"{where}: 'content' may be null or missing only when tool_calls are present"
        )
    elif content is not None and not isinstance(content, str):
        problems.append(f"{where}: 'content' must be a string or null, got {_kind(content)}")
    if kind == "deepseek" and _REASONING_FIELD in message:
        reasoning = message[_REASONING_FIELD]
        if reasoning is not None and not isinstance(reasoning, str):
            problems.append(
                f"{where}: 'reasoning_content' must be a string, got {_kind(reasoning)}"
            )
    for j, call in enumerate(calls or ()):
        problems += _check_tool_call(call, f"{where}.tool_calls[{j}]", index, call_ids)
    return problems


def _check_tool_call(call: object, where: str, index: int, call_ids: dict[str, int]) -> list[str]:
    if not isinstance(call, Mapping):
        return [f"{where} must be an object"]
    problems = [
        f"{where}: unknown field {name!r}" for name in sorted(set(call) - _TOOL_CALL_FIELDS)
    ]
    call_id = call.get("id")
    if not isinstance(call_id, str) or not call_id:
        problems.append(f"{where}.id must be a non-empty string, got {call_id!r}")
    elif call_id in call_ids:
        problems.append(f"{where}.id {call_id!r} is already used in messages[{call_ids[call_id]}]")
    else:
        call_ids[call_id] = index
    if call.get("type") != "function":
        problems.append(f"{where}.type must be 'function', got {call.get('type')!r}")
    function = call.get("function")
    if not isinstance(function, Mapping):
        return [*problems, f"{where}.function must be an object with name and arguments"]
    problems += [
        f"{where}.function: unknown field {name!r}"
        for name in sorted(set(function) - _FUNCTION_CALL_FIELDS)
    ]
    name = function.get("name")
    if not isinstance(name, str) or not name:
        problems.append(f"{where}.function.name must be a non-empty string, got {name!r}")
    arguments = function.get("arguments")
    if not isinstance(arguments, str):
        problems.append(f"{where}.function.arguments must be a string, got {_kind(arguments)}")
    else:
        problems += _check_arguments(arguments, f"{where}.function.arguments")
    return problems


def _check_arguments(arguments: str, where: str) -> list[str]:
    try:
        parsed = json.loads(arguments)
    except json.JSONDecodeError as exc:
        return [f"{where} is not valid JSON ({exc.msg} at character {exc.pos}): {arguments[:80]!r}"]
    if not isinstance(parsed, dict):
        return [f"{where} must be a JSON object, got {_kind(parsed)}"]
    return []


# --- tools -----------------------------------------------------------------------------


def _check_tools(body: Mapping[str, Any]) -> list[str]:
    if "tools" not in body:
        if "tool_choice" in body:
            return ["'tool_choice' is only allowed when 'tools' are given"]
        return []
    tools = body["tools"]
    if not isinstance(tools, list):
        return ["'tools' must be a list"]
    problems: list[str] = []
    names: dict[str, int] = {}
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, Mapping):
            problems.append(f"{where} must be an object")
            continue
        problems += [f"{where}: unknown field {n!r}" for n in sorted(set(tool) - _TOOL_FIELDS)]
        if tool.get("type") != "function":
            problems.append(f"{where}.type must be 'function', got {tool.get('type')!r}")
        function = tool.get("function")
        if not isinstance(function, Mapping):
            problems.append(f"{where}.function must be an object")
            continue
        problems += [
            f"{where}.function: unknown field {n!r}"
            for n in sorted(set(function) - _FUNCTION_FIELDS)
        ]
        name = function.get("name")
        if not isinstance(name, str) or not _FUNCTION_NAME.fullmatch(name):
            problems.append(
                f"{where}.function.name must be 1-64 letters, digits, '_' or '-', got {name!r}"
            )
        elif name in names:
            problems.append(
                f"{where}.function.name {name!r} is already used by tools[{names[name]}]"
            )
        else:
            names[name] = i
        if "description" in function and not isinstance(function["description"], str):
            problems.append(f"{where}.function.description must be a string")
        if "parameters" in function and not isinstance(function["parameters"], Mapping):
            problems.append(
                f"{where}.function.parameters must be a JSON schema object, "
                f"got {_kind(function['parameters'])}"
            )
    return problems


def _kind(value: object) -> str:
    """JSON's name for the type of `value`, as a server's message says it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, list | tuple):
        return "an array"
    return type(value).__name__
