"""Server-sent events and the folding of chat-completion chunks, on exact stream text."""

from __future__ import annotations

import json
from typing import Any

import pytest

from keel.models.base import StreamDelta
from keel.models.profiles import DEEPSEEK, OPENAI, OPENAI_COMPATIBLE
from keel.models.stream import (
    StreamAccumulator,
    StreamCut,
    StreamError,
    body_lines,
    read_events,
)
from keel.models.wire import parse_response

HEAD = '"id":"chatcmpl-1","object":"chat.completion.chunk","created":1750000000,"model":"m-1"'


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None, **extra: Any) -> str:
    """One ``data:`` line of an OpenAI-shaped chunk (compact JSON, as providers send)."""
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    body = json.dumps(choices, separators=(",", ":"))
    tail = "".join(f',"{k}":{json.dumps(v, separators=(",", ":"))}' for k, v in extra.items())
    return f'data: {{{HEAD},"choices":{body}{tail}}}'


def events(*lines: str) -> list[str]:
    """Lines as an SSE body hands them over: each event followed by a blank line."""
    out: list[str] = []
    for line in lines:
        out += [line, ""]
    return out


def fold(
    lines: list[str], fields: tuple[str, ...] = ("reasoning_content",), **kwargs: Any
) -> dict[str, Any]:
    accumulator = StreamAccumulator(fields, **kwargs)
    accumulator.feed_lines(lines)
    return accumulator.payload()


class FullParse(StreamAccumulator):
    """The same accumulator with the shared-shape shortcut off: every chunk parsed whole."""

    _LEARN_TRIES = 0


# --- the SSE reader ---------------------------------------------------------------------


def test_reader_skips_comments_and_joins_multi_line_data() -> None:
    lines = [
        ": keep-alive",
        "",
        ":OPENROUTER PROCESSING",
        "event: message",
        "id: 7",
        "retry: 1000",
        "data: {",
        'data:  "a": 1',
        "data:}",
        "",
        "",
        "event: error",
        'data: {"error": {"message": "boom"}}',
        "",
        "data: [DONE]",
    ]
    assert list(read_events(lines)) == [
        ("message", '{\n "a": 1\n}', True),
        ("error", '{"error": {"message": "boom"}}', True),
        ("message", "[DONE]", False),
    ]


def test_reader_yields_each_event_as_soon_as_its_blank_line_is_read() -> None:
    seen: list[str] = []

    def lines() -> Any:
        for line in ["data: one", "", "data: two", ""]:
            seen.append(line)
            yield line

    reader = read_events(lines())
    assert next(reader) == ("message", "one", True)
    assert seen == ["data: one", ""]


# --- body bytes to lines ----------------------------------------------------------------------

BODY = 'data: {"a":"é€😀"}\n\ndata: x\r\n\r\n: keep-alive\rdata: y\r\rlast'.encode()
BODY_LINES = ['data: {"a":"é€😀"}', "", "data: x", "", ": keep-alive", "data: y", "", "last"]


def every_split(body: bytes, cuts: int) -> list[list[bytes]]:
    """`body` cut into chunks at every choice of up to `cuts` positions (empty ones too)."""
    splits: list[list[bytes]] = [[body]]
    if cuts >= 1:
        splits += [[body[:i], body[i:]] for i in range(len(body) + 1)]
    if cuts >= 2:
        splits += [
            [body[:i], body[i:j], body[j:]]
            for i in range(len(body) + 1)
            for j in range(i, len(body) + 1)
        ]
    return splits


def test_body_lines_are_the_same_however_the_chunks_cut_characters_and_breaks() -> None:
    for chunks in every_split(BODY, 2):
        assert list(body_lines(chunks)) == BODY_LINES, chunks


def test_body_lines_end_only_at_cr_and_lf_not_at_unicode_line_separators() -> None:
    # JSON may carry U+2028 and U+0085 raw; a text splitter would cut the event in two.
    line = 'data: {"content":"a\u2028b\u0085c\x1cd"}'
    assert list(body_lines([line.encode() + b"\n\n"])) == [line, ""]


def test_body_lines_replace_bad_bytes_and_use_the_given_encoding() -> None:
    assert list(body_lines([b"data: a\xffb\n"])) == ["data: a\ufffdb"]
    assert list(body_lines([b"data: \xe9\n"], "latin-1")) == ["data: é"]


def test_body_lines_give_each_line_as_soon_as_its_break_arrives() -> None:
    reader = body_lines(iter([b"data: one\n", b"\n", b"data: tw", b"o\n"]))
    assert next(reader) == "data: one"
    assert next(reader) == ""
    assert next(reader) == "data: two"


# --- folding chunks -------------------------------------------------------------------------


def test_content_pieces_usage_from_the_last_chunk_and_done() -> None:
    lines = events(
        chunk({"role": "assistant", "content": ""}),
        chunk({"content": "Hel"}),
        ": keep-alive",
        chunk({"content": "lo"}),
        chunk({}, "stop"),
        chunk(None, usage={"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11}),
        "data: [DONE]",
    )
    payload = fold(lines)
    assert payload == {
        "id": "chatcmpl-1",
        "created": 1750000000,
        "model": "m-1",
        "object": "chat.completion",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hello"},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11},
    }


def test_tool_call_deltas_are_merged_by_index_even_interleaved() -> None:
    lines = events(
        chunk({"role": "assistant", "content": None}),
        chunk(
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "call_a",
                        "type": "function",
                        "function": {"name": "read_file", "arguments": ""},
                    }
                ]
            }
        ),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"pa'}}]}),
        chunk(
            {
                "tool_calls": [
                    {
                        "index": 1,
                        "id": "call_b",
                        "type": "function",
                        "function": {"name": "glob", "arguments": '{"pattern"'},
                    }
                ]
            }
        ),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": 'th": "a.py"}'}}]}),
        # A server that repeats the name and id on later pieces: neither is doubled.
        chunk(
            {
                "tool_calls": [
                    {
                        "index": 1,
                        "id": "call_b",
                        "function": {"name": "glob", "arguments": ': "*"}'},
                    }
                ]
            }
        ),
        chunk({}, "tool_calls"),
        "data: [DONE]",
    )
    message = fold(lines)["choices"][0]["message"]
    assert message["tool_calls"] == [
        {
            "id": "call_a",
            "type": "function",
            "function": {"name": "read_file", "arguments": '{"path": "a.py"}'},
        },
        {
            "id": "call_b",
            "type": "function",
            "function": {"name": "glob", "arguments": '{"pattern": "*"}'},
        },
    ]


def test_tool_call_deltas_without_index_follow_their_id() -> None:
    lines = events(
        chunk({"tool_calls": [{"id": "x", "function": {"name": "a", "arguments": "{"}}]}),
        chunk({"tool_calls": [{"function": {"arguments": "}"}}]}),
        chunk({"tool_calls": [{"id": "y", "function": {"name": "b", "arguments": "{}"}}]}),
        chunk({}, "tool_calls"),
    )
    calls = fold(lines)["choices"][0]["message"]["tool_calls"]
    assert [(c["id"], c["function"]["arguments"]) for c in calls] == [("x", "{}"), ("y", "{}")]


@pytest.mark.parametrize(
    ("profile", "field"),
    [(DEEPSEEK, "reasoning_content"), (OPENAI_COMPATIBLE, "reasoning")],
)
def test_reasoning_deltas_keep_the_field_the_profile_reads(profile: Any, field: str) -> None:
    lines = events(
        chunk({"role": "assistant", "content": None, field: ""}),
        chunk({"content": None, field: "Two plus "}),
        chunk({"content": None, field: "two."}),
        chunk({"content": "4"}),
        chunk({}, "stop"),
        "data: [DONE]",
    )
    payload = fold(lines, profile.reasoning_fields)
    assert payload["choices"][0]["message"][field] == "Two plus two."
    parsed = parse_response(profile, payload, model="m", step=0)
    assert (parsed.reasoning, parsed.content) == ("Two plus two.", "4")


def test_reasoning_is_not_read_for_a_profile_without_reasoning_fields() -> None:
    lines = events(chunk({"reasoning_content": "secret"}), chunk({"content": "x"}, "stop"))
    message = fold(lines, OPENAI.reasoning_fields)["choices"][0]["message"]
    assert "reasoning_content" not in message


def test_refusal_pieces_are_joined() -> None:
    lines = events(
        chunk({"refusal": "I can't "}),
        chunk({"refusal": "help with that."}),
        chunk({}, "stop"),
    )
    parsed = parse_response(OPENAI, fold(lines), model="m", step=0)
    assert parsed.refusal == "I can't help with that."
    assert parsed.finish_reason == "refusal"


def test_on_delta_gets_every_piece_tagged_with_the_attempt() -> None:
    seen: list[StreamDelta] = []
    lines = events(
        chunk({"role": "assistant", "content": ""}),
        chunk({"reasoning_content": "hmm"}),
        chunk({"content": "ok"}),
        chunk({"tool_calls": [{"index": 0, "id": "c", "function": {"name": "glob"}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}),
        chunk({}, "tool_calls"),
    )
    fold(lines, on_delta=seen.append, attempt=2)
    assert seen == [
        StreamDelta(kind="reasoning", text="hmm", attempt=2),
        StreamDelta(kind="content", text="ok", attempt=2),
        StreamDelta(kind="tool_call", text="", attempt=2, index=0, name="glob"),
        StreamDelta(kind="tool_call", text="{}", attempt=2, index=0, name="glob"),
    ]


# --- complete, cut or failed --------------------------------------------------------------


def test_a_finish_reason_without_done_is_a_complete_answer() -> None:
    payload = fold(events(chunk({"content": "hi"}), chunk({}, "stop")))
    assert payload["choices"][0]["finish_reason"] == "stop"


def test_done_without_a_finish_reason_is_a_complete_answer() -> None:
    payload = fold(events(chunk({"content": "hi"}), "data: [DONE]"))
    assert payload["choices"][0]["message"]["content"] == "hi"
    assert payload["choices"][0]["finish_reason"] is None


def test_a_stream_ending_without_done_or_finish_reason_is_cut() -> None:
    accumulator = StreamAccumulator()
    accumulator.feed_lines(events(chunk({"content": "half an ans"})))
    assert not accumulator.complete
    with pytest.raises(StreamCut, match="without \\[DONE\\] or a finish reason"):
        accumulator.payload()


def test_a_half_written_last_event_is_dropped_and_shows_as_a_cut() -> None:
    lines = [*events(chunk({"content": "a"})), chunk({"content": "b"}, "stop")[:40]]
    with pytest.raises(StreamCut):
        fold(lines)


def test_a_whole_last_event_without_its_blank_line_still_counts() -> None:
    lines = [*events(chunk({"content": "a"})), chunk({"content": "b"}, "stop")]
    assert fold(lines)["choices"][0]["message"]["content"] == "ab"


def test_an_error_object_in_the_stream_is_raised_with_its_exact_text() -> None:
    error = '{"error":{"message":"upstream overloaded","code":502}}'
    lines = events(chunk({"content": "par"}), f"data: {error}")
    with pytest.raises(StreamError) as caught:
        fold(lines)
    assert caught.value.text == error
    assert caught.value.error == {"message": "upstream overloaded", "code": 502}


def test_an_error_event_is_raised_whatever_its_data() -> None:
    with pytest.raises(StreamError):
        fold(["event: error", 'data: {"message": "quota"}', ""])


@pytest.mark.parametrize("data", ["not json", "[1, 2]", '"text"'])
def test_data_that_is_not_a_json_object_is_a_cut(data: str) -> None:
    with pytest.raises(StreamCut, match="not"):
        fold(events(chunk({"content": "a"}), f"data: {data}", chunk({}, "stop")))


def test_a_stream_with_no_choice_at_all_gives_no_choices() -> None:
    payload = fold(events("data: [DONE]"))
    assert payload["choices"] == []


# --- the shared-shape shortcut gives what a full parse gives ------------------------------


VARIANTS = [
    # DeepSeek-like: the same head on every chunk, usage with the finish.
    [
        chunk({"role": "assistant", "content": ""}),
        *[chunk({"content": f" w{i}"}) for i in range(5)],
        chunk({"content": ""}, "stop", usage={"prompt_tokens": 3, "completion_tokens": 5}),
    ],
    # OpenAI-like: usage null and a random obfuscation after every chunk's choices.
    [
        chunk({"role": "assistant", "content": ""}, usage=None, obfuscation="ab"),
        *[chunk({"content": f" w{i}"}, usage=None, obfuscation="x" * i) for i in range(5)],
        chunk({}, "stop", usage=None, obfuscation="q"),
        chunk(None, usage={"prompt_tokens": 3, "completion_tokens": 5}, obfuscation="z"),
    ],
    # A usage object or an error after the choices of a chunk that looks like the rest.
    [
        chunk({"content": "a"}),
        chunk({"content": "b"}, usage={"prompt_tokens": 1, "completion_tokens": 1}),
        chunk({"content": "c"}, usage={"prompt_tokens": 2, "completion_tokens": 2}),
        chunk({}, "stop"),
    ],
    # Whitespace, a "delta" key before the real one, a second choice, a changed head.
    [
        'data: {"id": "s", "choices": [{"index": 0, "delta": {"content": "a"}}]}',
        'data: {"id": "s", "choices": [{"index": 0, "delta": {"content": "b"}}]}',
        'data: {"id":"t","choices":[{"logprobs":{"delta":{}},"index":0,"delta":{"content":"c"}}]}',
        'data: {"id":"t","choices":[{"logprobs":{"delta":{}},"index":0,"delta":{"content":"d"}}]}',
        'data: {"id":"t","choices":[{"index":0,"delta":{"content":"e"}},{"index":1,"delta":{}}]}',
        'data: {"id":"u","choices":[{"index":1,"delta":{"content":"not ours"}}]}',
        'data: {"id":"u","choices":[{"index":0,"delta":{"content":"f"},"finish_reason":"stop"}]}',
    ],
    # Tool-call pieces (the delta holds the calls).
    [
        chunk(
            {"tool_calls": [{"index": 0, "id": "c", "function": {"name": "n", "arguments": ""}}]}
        ),
        *[chunk({"tool_calls": [{"index": 0, "function": {"arguments": p}}]}) for p in '{"a": 1}'],
        chunk({}, "tool_calls"),
    ],
]


@pytest.mark.parametrize("lines", VARIANTS)
def test_the_shortcut_gives_what_a_full_parse_gives(lines: list[str]) -> None:
    fast_seen: list[StreamDelta] = []
    full_seen: list[StreamDelta] = []
    fast = fold(events(*lines), on_delta=fast_seen.append)
    full = FullParse(("reasoning_content",), on_delta=full_seen.append)
    full.feed_lines(events(*lines))
    assert fast == full.payload()
    assert fast_seen == full_seen


def test_an_error_after_choices_that_look_like_the_rest_is_still_raised() -> None:
    lines = events(chunk({"content": "a"}), chunk({"content": "b"}, error={"message": "cut"}))
    with pytest.raises(StreamError, match="cut"):
        fold(lines)


def test_an_error_after_the_finish_reason_leaves_the_answer_standing() -> None:
    usage = {"prompt_tokens": 43, "completion_tokens": 10}
    lines = events(
        chunk({"content": "We need"}, "length"),
        chunk({"content": ""}, error={"code": 400, "message": "Token limit reached"}, usage=usage),
        "data: [DONE]",
    )
    payload = fold(lines)
    assert payload["choices"][0]["finish_reason"] == "length"
    assert payload["usage"] == usage
