"""FakeProvider itself, read with a plain httpx client: streams, framing, connections, rules."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from keel.core.errors import ConfigError
from keel.testing.provider import FakeProvider
from keel.testing.recorded import fixture_names, load_fixture, split_events

ASK = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}
STREAM = {**ASK, "stream": True, "stream_options": {"include_usage": True}}


@pytest.fixture
def provider() -> Iterator[FakeProvider]:
    with FakeProvider() as server:
        yield server
    assert server.violations == []


@pytest.fixture
def client(provider: FakeProvider) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=provider.base_url, timeout=5.0) as http:
        yield http


def read_stream(client: httpx.Client, body: dict[str, Any]) -> tuple[httpx.Response, list[str]]:
    """Every line of a streamed answer, as the client read them."""
    with client.stream("POST", "/chat/completions", json=body) as response:
        return response, list(response.iter_lines())


def chunks(lines: list[str]) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in lines if line.startswith("data: {")]


def deltas(lines: list[str], name: str) -> list[Any]:
    return [
        c["choices"][0]["delta"][name]
        for c in chunks(lines)
        if c["choices"] and name in c["choices"][0]["delta"]
    ]


# --- streaming a scripted turn -----------------------------------------------------------


def test_a_streamed_reply_arrives_as_chunk_deltas_then_usage_then_done(
    provider: FakeProvider, client: httpx.Client
) -> None:
    usage = {
        "prompt_tokens": 120,
        "completion_tokens": 30,
        "total_tokens": 150,
        "prompt_tokens_details": {"cached_tokens": 100},
        "completion_tokens_details": {"reasoning_tokens": 12},
    }
    provider.reply("the package is named keel", usage=usage, model="gpt-4o-2024-08-06")

    response, lines = read_stream(client, STREAM)

    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.headers["transfer-encoding"] == "chunked"
    assert lines[-2:] == ["data: [DONE]", ""]
    events = chunks(lines)
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert {e["object"] for e in events} == {"chat.completion.chunk"}
    assert {e["model"] for e in events} == {"gpt-4o-2024-08-06"}
    pieces = deltas(lines, "content")
    assert len(pieces) > 3
    assert "".join(pieces) == "the package is named keel"
    assert events[-2]["choices"][0] == {
        "index": 0,
        "delta": {},
        "logprobs": None,
        "finish_reason": "stop",
    }
    assert events[-1]["choices"] == []
    assert events[-1]["usage"] == usage
    assert provider.served == 1


def test_without_include_usage_no_usage_chunk_is_sent(
    provider: FakeProvider, client: httpx.Client
) -> None:
    provider.reply("done", usage=(10, 2))

    _, lines = read_stream(client, {**ASK, "stream": True})

    assert all("usage" not in c for c in chunks(lines))
    assert chunks(lines)[-1]["choices"][0]["finish_reason"] == "stop"


def test_tool_calls_stream_by_index_with_arguments_in_pieces(
    provider: FakeProvider, client: httpx.Client
) -> None:
    provider.reply(
        tool_calls=[
            ("read_file", {"path": "src/keel/models/openai_compat.py"}),
            ("list_files", "{}"),
        ]
    )

    _, lines = read_stream(client, STREAM)

    calls = [d[0] for d in deltas(lines, "tool_calls")]
    firsts = [c for c in calls if "id" in c]
    assert firsts == [
        {
            "index": 0,
            "id": "call_fake_0_0",
            "type": "function",
            "function": {"name": "read_file", "arguments": '{"path":'},
        },
        {
            "index": 1,
            "id": "call_fake_0_1",
            "type": "function",
            "function": {"name": "list_files", "arguments": "{}"},
        },
    ]
    rest = [c for c in calls if "id" not in c]
    assert all(
        set(c) == {"index", "function"} and set(c["function"]) == {"arguments"} for c in rest
    )
    joined = "".join(c["function"]["arguments"] for c in calls if c["index"] == 0)
    assert json.loads(joined) == {"path": "src/keel/models/openai_compat.py"}
    assert chunks(lines)[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_reasoning_streams_before_content_in_its_own_field(
    provider: FakeProvider, client: httpx.Client
) -> None:
    provider.reply("4", reasoning_content="two plus two is four", finish_reason="length")

    _, lines = read_stream(client, {**STREAM, "model": "deepseek-reasoner"})

    assert "".join(deltas(lines, "reasoning_content")) == "two plus two is four"
    order = [k for c in chunks(lines) if c["choices"] for k in c["choices"][0]["delta"]]
    reasoning = len(deltas(lines, "reasoning_content"))
    assert order == ["role", "content", *["reasoning_content"] * reasoning, "content"]
    assert chunks(lines)[-1]["choices"][0]["finish_reason"] == "length"


def test_keepalive_comments_and_blank_lines_come_between_events(
    provider: FakeProvider, client: httpx.Client
) -> None:
    provider.reply("a b c", keepalive=True)

    _, lines = read_stream(client, STREAM)

    data = [i for i, line in enumerate(lines) if line.startswith("data:")]
    comments = [i for i, line in enumerate(lines) if line == ": keep-alive"]
    assert len(comments) == len(data)
    assert all(lines[i - 2] == ": keep-alive" and lines[i - 1] == "" for i in data)
    assert "".join(deltas(lines, "content")) == "a b c"


def test_a_stream_cut_after_n_events_ends_without_done(
    provider: FakeProvider, client: httpx.Client
) -> None:
    provider.reply("one two three four five six", cut_after=3)
    seen: list[str] = []

    with (
        pytest.raises(httpx.RemoteProtocolError),
        client.stream("POST", "/chat/completions", json=STREAM) as response,
    ):
        seen.extend(response.iter_lines())

    assert [line for line in seen if line.startswith("data:")] == [
        e.strip() for e in (ev.data for ev in provider.sent_events)
    ]
    assert len(provider.sent_events) == 3
    assert "[DONE]" not in "".join(seen)
    assert provider.served == 0


def test_a_non_streaming_request_still_gets_one_json_body_with_a_length(
    provider: FakeProvider, client: httpx.Client
) -> None:
    provider.reply("hello", keepalive=True, cut_after=1)

    response = client.post("/chat/completions", json=ASK)

    assert response.headers["content-type"] == "application/json"
    assert int(response.headers["content-length"]) == len(response.content)
    assert response.json()["choices"][0]["message"] == {"role": "assistant", "content": "hello"}
    assert provider.sent_events == []


def test_an_error_answers_a_streaming_request_as_plain_json(
    provider: FakeProvider, client: httpx.Client
) -> None:
    provider.fail(429, "Rate limit reached")

    response = client.post("/chat/completions", json=STREAM)

    assert response.status_code == 429
    assert response.json()["error"]["message"] == "Rate limit reached"


# --- raw and recorded bodies ---------------------------------------------------------------

SSE = (
    ": keep-alive\n\n"
    'data: {"choices":[{"index":0,"delta":{"content":"Hel"}}]}\n\n'
    'data: {"choices":[{"index":0,"delta":{"content":"lo"}}]}\n\n'
    "data: [DONE]\n\n"
)


def test_a_raw_event_stream_is_served_exactly_event_by_event(
    provider: FakeProvider, client: httpx.Client
) -> None:
    provider.raw(200, SSE, headers={"Content-Type": "text/event-stream", "Content-Length": "9"})

    with client.stream("POST", "/chat/completions", json=STREAM) as response:
        text = response.read().decode()

    assert text == SSE
    assert [e.data for e in provider.sent_events] == split_events(SSE)
    assert response.headers["transfer-encoding"] == "chunked"


def test_each_event_reaches_the_client_before_the_next_is_written(
    provider: FakeProvider, client: httpx.Client
) -> None:
    provider.raw(200, SSE, headers={"Content-Type": "text/event-stream"}, delay_per_event=0.3)
    written_when_first_read: int | None = None

    with client.stream("POST", "/chat/completions", json=STREAM) as response:
        for line in response.iter_lines():
            if line.startswith("data:") and written_when_first_read is None:
                written_when_first_read = len(provider.sent_events)

    assert written_when_first_read == 2  # the keep-alive and the first data event
    assert len(provider.sent_events) == 4


def test_split_events_keeps_every_byte() -> None:
    body = "data: a\r\n\r\ndata: b\n\n: c\n\ndata: tail-without-blank-line"
    assert "".join(split_events(body)) == body
    assert len(split_events(body)) == 4


def write_fixture(folder: Path, name: str, **overrides: Any) -> None:
    data = {
        "source": {"repo": "example/repo", "path": "t.json", "commit": "0" * 40},
        "provider": "deepseek",
        "request": None,
        "status": 200,
        "headers": {"content-type": "text/event-stream; charset=utf-8"},
        "body": SSE,
    }
    data.update(overrides)
    (folder / f"{name}.json").write_text(json.dumps(data), encoding="utf-8")


def test_a_recorded_fixture_is_loaded_and_served_as_recorded(
    tmp_path: Path, provider: FakeProvider, client: httpx.Client
) -> None:
    write_fixture(tmp_path, "deepseek-stream")
    exchange = load_fixture("deepseek-stream", tmp_path)
    assert exchange.is_stream
    assert exchange.source["repo"] == "example/repo"
    provider.raw_fixture(exchange, cut_after=2)

    seen: list[str] = []
    with (
        pytest.raises(httpx.RemoteProtocolError),
        client.stream("POST", "/chat/completions", json=STREAM) as response,
    ):
        seen.extend(response.iter_lines())

    assert seen[:3] == [
        ": keep-alive",
        "",
        'data: {"choices":[{"index":0,"delta":{"content":"Hel"}}]}',
    ]
    assert "[DONE]" not in "".join(seen)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"status": "200"}, "'status' must be a int"),
        ({"body": None}, "'body' must be a str"),
        ({"headers": []}, "'headers' must be a dict"),
    ],
)
def test_a_malformed_fixture_is_a_config_error_naming_the_field(
    tmp_path: Path, overrides: dict[str, Any], message: str
) -> None:
    write_fixture(tmp_path, "bad", **overrides)
    with pytest.raises(ConfigError, match=message):
        load_fixture("bad", tmp_path)


def test_a_missing_fixture_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no recorded exchange 'nope'"):
        load_fixture("nope", tmp_path)


@pytest.mark.parametrize("name", fixture_names())
def test_every_checked_in_fixture_is_served_byte_for_byte(
    name: str, provider: FakeProvider, client: httpx.Client
) -> None:
    exchange = load_fixture(name)
    provider.raw_fixture(exchange)
    body = dict(exchange.request or ASK)
    with client.stream("POST", "/chat/completions", json=body) as response:
        served = response.read().decode("utf-8")
    assert response.status_code == exchange.status
    assert served == exchange.body
    provider.violations.clear()  # a recorded request is checked by the fixture's own tests


# --- connections ---------------------------------------------------------------------------


def test_one_client_reuses_its_connection_across_plain_and_streamed_answers(
    provider: FakeProvider, client: httpx.Client
) -> None:
    provider.reply("one").reply("two", keepalive=True).reply("three")

    client.post("/chat/completions", json=ASK)
    read_stream(client, STREAM)
    client.post("/chat/completions", json=ASK)

    assert len(set(provider.peer_ports)) == 1
    assert provider.connections == 1
    assert provider.served == 3


def test_separate_clients_use_separate_connections(provider: FakeProvider) -> None:
    provider.reply("one").reply("two")
    for _ in range(2):
        with httpx.Client(base_url=provider.base_url) as http:
            http.post("/chat/completions", json=ASK)

    assert len(set(provider.peer_ports)) == 2
    assert provider.connections == 2


def test_a_cut_stream_closes_its_connection_so_the_next_request_opens_another(
    provider: FakeProvider, client: httpx.Client
) -> None:
    provider.reply("a b c d", cut_after=2).reply("ok")
    with (
        pytest.raises(httpx.RemoteProtocolError),
        client.stream("POST", "/chat/completions", json=STREAM) as response,
    ):
        response.read()

    assert client.post("/chat/completions", json=ASK).status_code == 200
    assert provider.connections == 2


def test_closing_the_provider_drops_kept_alive_connections() -> None:
    with FakeProvider() as provider, httpx.Client(base_url=provider.base_url) as http:
        provider.reply("one").reply("never served")
        http.post("/chat/completions", json=ASK)
        provider.close()
        with pytest.raises(httpx.TransportError):
            http.post("/chat/completions", json=ASK)
    assert len(provider.requests) == 1


# --- requests are kept and checked -------------------------------------------------------


def test_the_authorization_header_is_kept_for_tests_but_never_shown(
    provider: FakeProvider, client: httpx.Client
) -> None:
    provider.reply("ok")
    client.post("/chat/completions", json=ASK, headers={"Authorization": "Bearer sk-very-secret"})

    assert provider.headers[0]["authorization"] == "Bearer sk-very-secret"
    assert "sk-very-secret" not in repr(provider.headers)
    assert "sk-very-secret" not in repr(provider)
    assert "<redacted>" in repr(provider.headers[0])


def test_a_request_a_strict_server_refuses_is_listed_in_violations(
    provider: FakeProvider, client: httpx.Client
) -> None:
    provider.reply("ok")
    bad = {**ASK, "stream_options": {"include_usage": True}, "temperature_x": 1}

    response = client.post("/chat/completions", json=bad)

    assert response.status_code == 200  # recorded, not refused: strict is off
    assert provider.violations == [
        (0, "unknown top-level field 'temperature_x'"),
        (0, "'stream_options' is only allowed when 'stream' is true"),
    ]
    provider.violations.clear()


def test_a_strict_provider_answers_400_and_keeps_its_script() -> None:
    with (
        FakeProvider(strict=True, allow_violations=True) as provider,
        httpx.Client(base_url=provider.base_url) as http,
    ):
        provider.reply("ok")
        messages = [{"role": "tool", "tool_call_id": "call_1", "content": "x"}]
        refused = http.post("/chat/completions", json={"model": "m", "messages": messages})
        answered = http.post("/chat/completions", json=ASK)

    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert "does not answer a tool call" in error["message"]
    assert answered.json()["choices"][0]["message"]["content"] == "ok"
    assert [i for i, _ in provider.violations] == [0]


def test_deepseek_rules_apply_to_a_deepseek_model_by_default(
    provider: FakeProvider, client: httpx.Client
) -> None:
    history = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello", "reasoning_content": "greet back"},
        {"role": "user", "content": "again"},
    ]
    provider.reply("a").reply("b")
    client.post("/chat/completions", json={"model": "deepseek-reasoner", "messages": history})
    assert provider.violations == []

    client.post("/chat/completions", json={"model": "gpt-4o", "messages": history})
    assert provider.violations == [
        (
            1,
            "messages[1] (assistant): field 'reasoning_content' is not allowed on an "
            "assistant message (only DeepSeek takes reasoning back)",
        )
    ]
    provider.violations.clear()


def test_a_responder_answers_each_request_from_its_conversation(
    provider: FakeProvider, client: httpx.Client
) -> None:
    def answer(body: dict[str, Any]) -> None:
        provider.reply(f"you sent {len(body['messages'])} message(s)")

    provider.reply("scripted first").respond_with(answer)
    texts = []
    for n in (1, 1, 3):
        messages = [{"role": "user", "content": str(i)} for i in range(n)]
        response = client.post("/chat/completions", json={"model": "m", "messages": messages})
        texts.append(response.json()["choices"][0]["message"]["content"])

    assert texts == ["scripted first", "you sent 1 message(s)", "you sent 3 message(s)"]
    assert provider.pending == 0
