"""The strict server's request rules: each broken rule gives one precise message."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from keel.testing.chat_rules import check_request, missing_reasoning
from keel.testing.recorded import fixture_names, load_fixture

READ = {
    "type": "function",
    "function": {
        "name": "read_file",
        "description": "Read a file.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
    },
}


def call(call_id: str = "call_1", arguments: Any = '{"path": "a.txt"}') -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": "read_file", "arguments": arguments},
    }


def answer(call_id: str = "call_1", content: Any = "hello") -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def body(*messages: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {
        "model": "gpt-4o",
        "messages": list(messages) or [{"role": "user", "content": "hi"}],
        **fields,
    }


SYSTEM = {"role": "system", "content": "Be careful."}
USER = {"role": "user", "content": "read a.txt"}
ASKS = {"role": "assistant", "content": None, "tool_calls": [call()]}


def conversation(**fields: Any) -> dict[str, Any]:
    """A valid conversation with every role, a tool call and its answer, and tools."""
    return body(
        copy.deepcopy(SYSTEM),
        copy.deepcopy(USER),
        copy.deepcopy(ASKS),
        answer(),
        {"role": "assistant", "content": "It says hello."},
        {"role": "user", "content": "thanks"},
        **{"tools": [copy.deepcopy(READ)], **fields},
    )


# --- valid bodies ----------------------------------------------------------------------------


@pytest.mark.parametrize("provider", ["openai", "deepseek", "compatible", "openai-compatible"])
def test_a_well_formed_conversation_breaks_no_rule(provider: str) -> None:
    assert check_request(conversation(), provider) == []


def test_every_known_top_level_field_is_accepted() -> None:
    fields = {
        "tool_choice": "auto",
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0.2,
        "max_tokens": 100,
        "max_completion_tokens": 100,
        "top_p": 1,
        "stop": ["\n"],
        "n": 1,
        "seed": 7,
        "response_format": {"type": "text"},
        "parallel_tool_calls": True,
        "user": "u",
        "reasoning_effort": "low",
        "thinking": {"type": "enabled"},
        "frequency_penalty": 0,
        "presence_penalty": 0,
        "logprobs": False,
        "top_logprobs": 0,
    }
    assert check_request(conversation(**fields)) == []


def test_parallel_calls_answered_in_any_order_are_valid() -> None:
    asks = {"role": "assistant", "content": "two reads", "tool_calls": [call("a"), call("b")]}
    assert check_request(body(USER, asks, answer("b"), answer("a"))) == []


def test_unknown_provider_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown provider 'anthropic'"):
        check_request(conversation(), "anthropic")


# --- top level -------------------------------------------------------------------------------


def test_unknown_top_level_fields_are_named() -> None:
    assert check_request(conversation(functions=[], stream_usage=True)) == [
        "unknown top-level field 'functions'",
        "unknown top-level field 'stream_usage'",
    ]


@pytest.mark.parametrize("model", [None, "", 4])
def test_model_must_be_a_non_empty_string(model: Any) -> None:
    assert check_request(conversation(model=model)) == ["'model' must be a non-empty string"]


def test_stream_must_be_a_boolean() -> None:
    assert check_request(conversation(stream="yes")) == [
        "'stream' must be true or false, got 'yes'"
    ]


@pytest.mark.parametrize("stream", [None, False])
def test_stream_options_need_stream_true(stream: bool | None) -> None:
    fields: dict[str, Any] = {"stream_options": {"include_usage": True}}
    if stream is not None:
        fields["stream"] = stream
    assert check_request(conversation(**fields)) == [
        "'stream_options' is only allowed when 'stream' is true"
    ]


def test_stream_options_must_be_well_formed() -> None:
    assert check_request(conversation(stream=True, stream_options=[])) == [
        "'stream_options' must be an object"
    ]
    assert check_request(conversation(stream=True, stream_options={"include_usage": 1})) == [
        "'stream_options.include_usage' must be true or false"
    ]


# --- messages --------------------------------------------------------------------------------


def test_messages_must_be_a_non_empty_list() -> None:
    assert check_request({"model": "m", "messages": []}) == ["'messages' must not be empty"]
    assert check_request({"model": "m"}) == ["'messages' must be a list of messages"]
    assert check_request({"model": "m", "messages": ["hi"]}) == ["messages[0] must be an object"]


def test_roles_must_be_known() -> None:
    problems = check_request(body({"role": "function", "content": "x"}))
    assert problems == ["messages[0].role 'function' is not one of assistant, system, tool, user"]


def test_the_developer_role_is_openais_only() -> None:
    developer = {"role": "developer", "content": "Be brief."}
    assert check_request(body(developer, USER), "openai") == []
    assert check_request(body(developer, USER), "deepseek") == [
        "messages[0].role 'developer' is not one of assistant, system, tool, user"
    ]


@pytest.mark.parametrize(
    ("message", "problem"),
    [
        (
            {"role": "user", "content": "hi", "tool_call_id": "x"},
            "messages[0] (user): field 'tool_call_id' is not allowed on a user message",
        ),
        (
            {"role": "system", "content": "hi", "reasoning": "x"},
            "messages[0] (system): field 'reasoning' is not allowed on a system message",
        ),
        (
            {"role": "assistant", "content": "hi", "tool_call_id": "x"},
            "messages[0] (assistant): field 'tool_call_id' is not allowed on an assistant message",
        ),
    ],
)
def test_each_role_takes_only_its_own_fields(message: dict[str, Any], problem: str) -> None:
    assert check_request(body(message)) == [problem]


def test_names_and_refusals_are_allowed_where_the_api_has_them() -> None:
    messages = (
        {"role": "user", "content": "hi", "name": "ana"},
        {"role": "assistant", "content": "no", "refusal": "I cannot help with that."},
    )
    assert check_request(body(*messages)) == []


def test_reasoning_content_is_sent_back_to_deepseek_only() -> None:
    turn = {**ASKS, "reasoning_content": "I should read the file."}
    request = body(USER, turn, answer())
    assert check_request(request, "deepseek") == []
    expected = (
        "messages[1] (assistant): field 'reasoning_content' is not allowed on an assistant "
        "message (only DeepSeek takes reasoning back)"
    )
    assert check_request(request, "openai") == [expected]
    assert check_request(request, "compatible") == [expected]


def test_deepseek_reasoning_content_must_be_a_string() -> None:
    turn = {**ASKS, "reasoning_content": ["thinking"]}
    assert check_request(body(USER, turn, answer()), "deepseek") == [
        "messages[1] (assistant): 'reasoning_content' must be a string, got an array"
    ]


def test_system_messages_only_at_the_start() -> None:
    assert check_request(body(SYSTEM, SYSTEM, USER)) == []
    assert check_request(body(USER, SYSTEM)) == [
        "messages[1] (system): a system message may only come at the start, before any "
        "user, assistant or tool message"
    ]


@pytest.mark.parametrize(
    ("content", "kind"), [(None, "null"), (["hi"], "an array"), ({"text": "hi"}, "an object")]
)
def test_user_system_and_tool_content_must_be_strings(content: Any, kind: str) -> None:
    assert check_request(body({"role": "user", "content": content})) == [
        f"messages[0] (user): 'content' must be a string, got {kind}"
    ]
    assert check_request(body(USER, ASKS, answer(content=content))) == [
        f"messages[2] (tool): 'content' must be a string, got {kind}"
    ]


def test_assistant_content_may_be_null_only_with_tool_calls() -> None:
    assert check_request(body(USER, {"role": "assistant", "content": None})) == [
        "messages[1] (assistant): 'content' may be null or missing only when tool_calls are present"
    ]
    assert check_request(body(USER, {"role": "assistant"})) == [
        "messages[1] (assistant): 'content' may be null or missing only when tool_calls are present"
    ]
    assert check_request(body(USER, {"role": "assistant", "tool_calls": [call()]}, answer())) == []
    assert check_request(body(USER, {"role": "assistant", "content": 3})) == [
        "messages[1] (assistant): 'content' must be a string or null, got a number"
    ]


def test_tool_calls_must_be_a_non_empty_list() -> None:
    assert check_request(body(USER, {"role": "assistant", "content": "x", "tool_calls": []})) == [
        "messages[1] (assistant): 'tool_calls' must be a non-empty list when present"
    ]


# --- tool calls and their answers ------------------------------------------------------------


def test_a_tool_message_must_answer_the_immediately_preceding_assistant() -> None:
    assert check_request(body(USER, answer())) == [
        "messages[1] (tool): tool_call_id 'call_1' does not answer a tool call of the "
        "immediately preceding assistant message (there is none with tool calls)"
    ]
    late = body(USER, ASKS, answer(), {"role": "user", "content": "more"}, answer())
    assert check_request(late) == [
        "messages[4] (tool): tool_call_id 'call_1' does not answer a tool call of the "
        "immediately preceding assistant message (there is none with tool calls)"
    ]


def test_a_tool_message_must_answer_one_of_that_assistants_call_ids() -> None:
    assert check_request(body(USER, ASKS, answer(), answer("call_9"))) == [
        "messages[3] (tool): tool_call_id 'call_9' does not answer a tool call of the "
        "immediately preceding assistant message (messages[1] called 'call_1')"
    ]


def test_one_tool_message_per_call_id() -> None:
    assert check_request(body(USER, ASKS, answer(), answer())) == [
        "messages[3] (tool): a second tool message for call 'call_1' (first at messages[2])"
    ]


def test_tool_call_id_must_be_a_non_empty_string() -> None:
    assert check_request(body(USER, ASKS, answer(), {"role": "tool", "content": "x"})) == [
        "messages[3] (tool): 'tool_call_id' must be a non-empty string"
    ]


def test_every_tool_call_is_answered_before_any_other_message() -> None:
    unanswered = (
        "messages[1] (assistant): tool call 'call_1' is not answered: a tool message with "
        "tool_call_id 'call_1' must follow it before any other message"
    )
    assert check_request(body(USER, ASKS)) == [unanswered]
    assert check_request(body(USER, ASKS, {"role": "user", "content": "well?"})) == [unanswered]
    interrupted = body(
        USER,
        {"role": "assistant", "content": None, "tool_calls": [call("a"), call("b")]},
        answer("a"),
        {"role": "user", "content": "hurry"},
        answer("b"),
    )
    assert check_request(interrupted) == [
        "messages[1] (assistant): tool call 'b' is not answered: a tool message with "
        "tool_call_id 'b' must follow it before any other message",
        "messages[4] (tool): tool_call_id 'b' does not answer a tool call of the immediately "
        "preceding assistant message (there is none with tool calls)",
    ]


@pytest.mark.parametrize("call_id", ["", None, 7])
def test_tool_call_ids_must_be_non_empty_strings(call_id: Any) -> None:
    turn = {"role": "assistant", "content": None, "tool_calls": [call(call_id)]}
    assert check_request(body(USER, turn)) == [
        f"messages[1] (assistant).tool_calls[0].id must be a non-empty string, got {call_id!r}"
    ]


def test_tool_call_ids_are_unique_in_the_request() -> None:
    again = body(USER, ASKS, answer(), copy.deepcopy(ASKS), answer())
    assert check_request(again) == [
        "messages[3] (assistant).tool_calls[0].id 'call_1' is already used in messages[1]"
    ]


def test_tool_call_type_must_be_function() -> None:
    turn = {"role": "assistant", "content": None, "tool_calls": [{**call(), "type": "tool"}]}
    assert check_request(body(USER, turn, answer())) == [
        "messages[1] (assistant).tool_calls[0].type must be 'function', got 'tool'"
    ]


def test_tool_call_needs_a_function_with_a_name() -> None:
    no_function = {"id": "call_1", "type": "function"}
    turn = {"role": "assistant", "content": None, "tool_calls": [no_function]}
    assert check_request(body(USER, turn, answer())) == [
        "messages[1] (assistant).tool_calls[0].function must be an object with name and arguments"
    ]
    nameless = {"id": "call_1", "type": "function", "function": {"arguments": "{}"}}
    turn = {"role": "assistant", "content": None, "tool_calls": [nameless]}
    assert check_request(body(USER, turn, answer())) == [
        "messages[1] (assistant).tool_calls[0].function.name must be a non-empty string, got None"
    ]


@pytest.mark.parametrize(
    ("arguments", "problem"),
    [
        (
            '{"path": "a.txt"',
            "is not valid JSON (Expecting ',' delimiter at character 16): '{\"path\": \"a.txt\"'",
        ),
        ("[1, 2]", "must be a JSON object, got an array"),
        ('"a.txt"', "must be a JSON object, got a string"),
        ({"path": "a.txt"}, "must be a string, got an object"),
    ],
)
def test_tool_call_arguments_are_a_string_holding_a_json_object(
    arguments: Any, problem: str
) -> None:
    turn = {"role": "assistant", "content": None, "tool_calls": [call(arguments=arguments)]}
    assert check_request(body(USER, turn, answer())) == [
        f"messages[1] (assistant).tool_calls[0].function.arguments {problem}"
    ]


def test_empty_object_arguments_are_valid() -> None:
    turn = {"role": "assistant", "content": None, "tool_calls": [call(arguments="{}")]}
    assert check_request(body(USER, turn, answer())) == []


# --- tools -----------------------------------------------------------------------------------


def test_tools_must_be_functions_with_a_name_and_object_parameters() -> None:
    tools = [
        {"type": "retrieval", "function": READ["function"]},
        {"type": "function", "function": {"name": "read file", "parameters": {}}},
        {"type": "function", "function": {"name": "ok", "parameters": "object"}},
        {"type": "function"},
        {"type": "function", "function": {"name": "write_file"}, "strict": True},
    ]
    assert check_request(conversation(tools=tools)) == [
        "tools[0].type must be 'function', got 'retrieval'",
        "tools[1].function.name must be 1-64 letters, digits, '_' or '-', got 'read file'",
        "tools[2].function.parameters must be a JSON schema object, got a string",
        "tools[3].function must be an object",
        "tools[4]: unknown field 'strict'",
    ]


def test_tool_names_are_unique() -> None:
    assert check_request(conversation(tools=[READ, READ])) == [
        "tools[1].function.name 'read_file' is already used by tools[0]"
    ]


def test_tool_choice_needs_tools() -> None:
    request = body(USER, tool_choice="auto")
    assert check_request(request) == ["'tool_choice' is only allowed when 'tools' are given"]
    assert check_request(conversation(tool_choice="auto")) == []


def test_tools_must_be_a_list() -> None:
    assert check_request(conversation(tools={"read_file": READ})) == ["'tools' must be a list"]


# --- DeepSeek thinking mode --------------------------------------------------------------------


def test_missing_reasoning_lists_tool_calling_turns_without_reasoning_content() -> None:
    thought = {**ASKS, "reasoning_content": "read it first"}
    second = {"role": "assistant", "content": None, "tool_calls": [call("call_2")]}
    request = body(
        USER,
        thought,
        answer(),
        second,
        answer("call_2"),
        {"role": "assistant", "content": "done"},  # no tool calls: not required
    )
    assert missing_reasoning(request) == [3]
    assert check_request(request, "deepseek") == []


def test_missing_reasoning_is_empty_when_every_tool_turn_carries_it() -> None:
    thought = {**ASKS, "reasoning_content": ""}
    assert missing_reasoning(body(USER, thought, answer())) == []
    assert missing_reasoning({"model": "m"}) == []


# --- real requests ---------------------------------------------------------------------------

RECORDED = [n for n in fixture_names() if load_fixture(n).request is not None]


@pytest.mark.parametrize("name", RECORDED)
def test_requests_real_providers_accepted_break_no_rule(name: str) -> None:
    exchange = load_fixture(name)
    assert exchange.request is not None
    provider = exchange.provider if exchange.provider in ("deepseek", "openai") else "compatible"
    assert check_request(exchange.request, provider) == []
    if provider == "deepseek":
        assert missing_reasoning(exchange.request) == []


def test_a_recorded_thinking_mode_request_without_its_reasoning_is_caught() -> None:
    names = [n for n in RECORDED if n.startswith("deepseek_thinking")]
    assert names, "tests/fixtures/providers should hold a recorded DeepSeek thinking-mode request"
    request = copy.deepcopy(dict(load_fixture(names[-1]).request or {}))
    turns = [
        i
        for i, m in enumerate(request["messages"])
        if m["role"] == "assistant" and m.get("tool_calls")
    ]
    assert turns, "the last thinking-mode fixture should carry a tool-calling turn"
    for i in turns:
        del request["messages"][i]["reasoning_content"]
    assert missing_reasoning(request) == turns
    assert check_request(request, "deepseek") == []
