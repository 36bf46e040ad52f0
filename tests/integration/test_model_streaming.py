"""Streamed answers and shared connections, over real sockets on 127.0.0.1.

`FakeProvider` streams scripted turns as a provider does (chunked, flushed per event,
with keep-alives, cuts and pauses on demand). `ExactServer` below answers with exact
bytes and closes the connection, for what FakeProvider's framing cannot show: a stream
with no length framing that simply stops, half-way through a line.
"""

from __future__ import annotations

import contextlib
import json
import socketserver
import threading
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from keel.core.errors import ModelError
from keel.models.base import Message, ModelRequest, RetryNotice, StreamDelta, ToolCall
from keel.models.connections import close_shared_clients, shared_client
from keel.models.openai_compat import OpenAICompatModel
from keel.testing.provider import FakeProvider


@pytest.fixture(autouse=True)
def fresh_pool() -> Iterator[None]:
    close_shared_clients()
    yield
    close_shared_clients()


@pytest.fixture
def provider() -> Iterator[FakeProvider]:
    with FakeProvider() as server:
        yield server


MakeModel = Callable[..., OpenAICompatModel]


@pytest.fixture
def make_model(provider: FakeProvider) -> MakeModel:
    def make(**overrides: Any) -> OpenAICompatModel:
        settings: dict[str, Any] = {
            "spec": "openai:local-model",
            "model": "local-model",
            "base_url": provider.base_url,
            "api_key": "sk-test",
            "max_attempts": 3,
            "max_wait": 1.0,
            "initial_wait": 0.001,
            "timeout": 2.0,
        }
        settings.update(overrides)
        return OpenAICompatModel(**settings)

    return make


class Watch:
    """What a live view sees: every delta, and every retry notice."""

    def __init__(self) -> None:
        self.deltas: list[StreamDelta] = []
        self.notices: list[RetryNotice] = []

    def request(self, text: str = "count to five", step: int = 0) -> ModelRequest:
        return ModelRequest(
            messages=(Message(role="user", content=text),),
            tools=(),
            step=step,
            on_retry=self.notices.append,
            on_delta=self.deltas.append,
        )

    def text(self, attempt: int, kind: str = "content") -> str:
        return "".join(d.text for d in self.deltas if d.attempt == attempt and d.kind == kind)


# --- a streamed turn -------------------------------------------------------------------------


def test_pieces_reach_on_delta_and_the_turn_is_the_whole_answer(
    provider: FakeProvider, make_model: MakeModel
) -> None:
    provider.reply(content="one two three four five", usage=(12, 5))
    watch = Watch()

    turn = make_model().complete(watch.request())

    assert turn.content == "one two three four five"
    assert watch.text(attempt=1) == "one two three four five"
    assert len([d for d in watch.deltas if d.kind == "content"]) == 5  # a word per event
    assert (turn.usage.input_tokens, turn.usage.output_tokens) == (12, 5)  # the last chunk
    assert turn.finish_reason == "stop"


def test_pieces_arrive_while_the_answer_is_still_being_written(
    provider: FakeProvider, make_model: MakeModel
) -> None:
    provider.reply(content="a b c d e f", delay_per_event=0.05)
    written_when_seen: list[int] = []

    def on_delta(delta: StreamDelta) -> None:
        written_when_seen.append(len(provider.sent_events))

    request = ModelRequest(
        messages=(Message(role="user", content="go"),), tools=(), step=0, on_delta=on_delta
    )
    make_model().complete(request)

    events_in_answer = len(provider.sent_events)
    assert written_when_seen[0] < events_in_answer - 3


def test_keep_alive_comments_are_ignored(provider: FakeProvider, make_model: MakeModel) -> None:
    """DeepSeek's ``: keep-alive`` comments were found documented, never recorded; the
    recorded OpenRouter stream with comment lines runs in test_recorded_traffic.py."""
    provider.reply(content="steady answer", keepalive=True, usage=(3, 2))
    turn = make_model().complete(Watch().request())
    assert turn.content == "steady answer"
    assert turn.usage.output_tokens == 2


def test_tool_call_arguments_arrive_in_pieces_by_index(
    provider: FakeProvider, make_model: MakeModel
) -> None:
    provider.reply(
        tool_calls=[
            ("read_file", {"path": "src/keel/models/stream.py"}),
            ("glob", {"pattern": "tests/**/*.py"}),
        ]
    )
    watch = Watch()

    turn = make_model().complete(watch.request())

    assert turn.finish_reason == "tool_calls"
    assert turn.tool_calls == (
        ToolCall(
            id="call_fake_0_0",
            name="read_file",
            arguments='{"path": "src/keel/models/stream.py"}',
        ),
        ToolCall(id="call_fake_0_1", name="glob", arguments='{"pattern": "tests/**/*.py"}'),
    )
    pieces = [d for d in watch.deltas if d.kind == "tool_call"]
    assert len(pieces) > 4  # 8 characters per piece
    assert {(d.index, d.name) for d in pieces} == {(0, "read_file"), (1, "glob")}
    assert "".join(d.text for d in pieces if d.index == 1) == '{"pattern": "tests/**/*.py"}'


def test_deepseek_reasoning_streams_as_reasoning(
    provider: FakeProvider, make_model: MakeModel
) -> None:
    provider.reply(content="4", reasoning_content="Two plus two is four.")
    watch = Watch()
    model = make_model(spec="deepseek:deepseek-reasoner", model="deepseek-reasoner")

    turn = model.complete(watch.request())

    assert (turn.reasoning, turn.content) == ("Two plus two is four.", "4")
    assert watch.text(attempt=1, kind="reasoning") == "Two plus two is four."


def test_a_compatible_servers_reasoning_field_is_read(
    provider: FakeProvider, make_model: MakeModel
) -> None:
    provider.reply(content="4", reasoning="Adding.")
    turn = make_model().complete(Watch().request())
    assert turn.reasoning == "Adding."


def test_usage_of_every_kind_comes_from_the_last_chunk(
    provider: FakeProvider, make_model: MakeModel
) -> None:
    usage = {
        "prompt_tokens": 900,
        "completion_tokens": 40,
        "prompt_tokens_details": {"cached_tokens": 512},
        "completion_tokens_details": {"reasoning_tokens": 16},
    }
    provider.reply(content="ok", usage=usage)
    turn = make_model().complete(Watch().request())
    assert turn.usage.to_dict() == {
        "input_tokens": 900,
        "output_tokens": 40,
        "cached_input_tokens": 512,
        "reasoning_tokens": 16,
    }


# --- cut, stalled or failed mid-answer: retried whole -----------------------------------------


def test_a_stream_cut_mid_answer_is_retried_whole(
    provider: FakeProvider, make_model: MakeModel
) -> None:
    provider.reply(content="this answer will never finish", cut_after=3)
    provider.reply(content="the answer that did")
    watch = Watch()

    turn = make_model().complete(watch.request())

    assert turn.content == "the answer that did"
    assert len(provider.requests) == 2
    assert watch.text(attempt=1) != ""  # the live view saw part of the first attempt …
    assert "never finish" not in (turn.content or "")  # … and none of it is in the turn
    assert watch.text(attempt=2) == "the answer that did"
    assert [d.attempt for d in watch.deltas] == sorted(d.attempt for d in watch.deltas)
    [notice] = watch.notices
    assert notice.attempt == 1
    assert "connection failed" in notice.error


def test_a_stream_that_stops_without_done_is_retried(make_model: MakeModel) -> None:
    whole = sse_body(["Hel", "lo"], finish="stop")
    with ExactServer() as server:
        server.answer(sse_response(whole[: whole.index("lo") + 4]))  # stops mid-line
        server.answer(sse_response(whole))
        watch = Watch()

        turn = make_model(base_url=server.base_url).complete(watch.request())

    assert turn.content == "Hello"
    assert server.requests == 2
    assert "without [DONE] or a finish reason" in watch.notices[0].error
    assert watch.text(attempt=1) == "Hel"
    assert watch.text(attempt=2) == "Hello"


def test_a_stream_that_stalls_between_pieces_times_out_and_is_retried(
    provider: FakeProvider, make_model: MakeModel
) -> None:
    provider.reply(content="slow answer here", delay_per_event=1.0)
    provider.reply(content="quick answer")
    watch = Watch()

    turn = make_model(timeout=0.2).complete(watch.request())

    assert turn.content == "quick answer"
    assert "no answer within 0.2s" in watch.notices[0].error


def test_an_error_in_the_stream_is_retried_and_its_words_kept(
    provider: FakeProvider, make_model: MakeModel
) -> None:
    error = {"error": {"code": "server_error", "message": "Upstream provider disconnected"}}
    provider.raw(
        200,
        sse_body(["par"], finish=None, done=False) + f"data: {json.dumps(error)}\n\n",
        headers={"Content-Type": "text/event-stream"},
    )
    provider.reply(content="complete")
    watch = Watch()

    turn = make_model().complete(watch.request())

    assert turn.content == "complete"
    assert "Upstream provider disconnected" in watch.notices[0].error


def test_out_of_credit_in_the_stream_is_not_retried(
    provider: FakeProvider, make_model: MakeModel
) -> None:
    error = {"error": {"code": "insufficient_quota", "message": "You exceeded your quota"}}
    provider.raw(
        200, f"data: {json.dumps(error)}\n\n", headers={"Content-Type": "text/event-stream"}
    )
    provider.reply(content="never served")

    with pytest.raises(ModelError) as caught:
        make_model().complete(Watch().request())

    assert caught.value.reason == "out_of_credit"
    assert len(provider.requests) == 1


def test_a_stream_cut_every_time_gives_up_as_transient(
    provider: FakeProvider, make_model: MakeModel
) -> None:
    for _ in range(3):
        provider.reply(content="again and again", cut_after=2)
    with pytest.raises(ModelError) as caught:
        make_model().complete(Watch().request())
    assert caught.value.transient is True
    assert "gave up after 3 attempt(s)" in str(caught.value)


# --- one pooled client per provider and process ----------------------------------------------


def test_adapters_for_one_base_url_share_a_client_and_its_connection(
    provider: FakeProvider, make_model: MakeModel
) -> None:
    provider.reply(content="first").reply(content="second").reply(content="third")
    one = make_model(api_key="sk-one")
    other = make_model(api_key="sk-other")

    one.complete(Watch().request())
    other.complete(Watch().request())
    one.complete(Watch().request())

    assert shared_client(provider.base_url, 2.0) is shared_client(provider.base_url + "/", 2.0)
    assert provider.connections == 1
    assert len(set(provider.peer_ports)) == 1
    # The key travels with each request, never in the shared client.
    assert [h["authorization"] for h in provider.headers] == [
        "Bearer sk-one",
        "Bearer sk-other",
        "Bearer sk-one",
    ]
    assert "authorization" not in {k.lower() for k in shared_client(provider.base_url, 2.0).headers}


def test_after_the_pool_is_closed_the_next_call_opens_a_new_one(
    provider: FakeProvider, make_model: MakeModel
) -> None:
    provider.reply(content="before").reply(content="after")
    model = make_model()
    model.complete(Watch().request())
    before = shared_client(provider.base_url, 2.0)

    close_shared_clients()
    turn = model.complete(Watch().request())

    assert turn.content == "after"
    assert before.is_closed
    assert shared_client(provider.base_url, 2.0) is not before
    assert provider.connections == 2


def test_concurrent_calls_share_the_pool_and_leave_connections_to_reuse(
    provider: FakeProvider, make_model: MakeModel
) -> None:
    calls = 8
    for i in range(calls):
        provider.reply(content=f"answer {i}", delay=0.05)
    model = make_model()
    turns: list[str | None] = []
    lock = threading.Lock()

    def call() -> None:
        turn = model.complete(Watch().request())
        with lock:
            turns.append(turn.content)

    threads = [threading.Thread(target=call) for _ in range(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)

    assert sorted(turns, key=str) == sorted((f"answer {i}" for i in range(calls)), key=str)
    opened = provider.connections
    provider.reply(content="one more")
    assert model.complete(Watch().request()).content == "one more"
    assert provider.connections == opened  # a pooled connection served it


# --- an exact-bytes server ---------------------------------------------------------------------


def sse_body(pieces: list[str], *, finish: str | None, done: bool = True) -> str:
    head = '"id":"x","object":"chat.completion.chunk","created":1,"model":"m"'
    events = [
        f'data: {{{head},"choices":[{{"index":0,"delta":{json.dumps({"content": p})}}}]}}\n\n'
        for p in pieces
    ]
    if finish is not None:
        choice = {"index": 0, "delta": {}, "finish_reason": finish}
        events.append(f'data: {{{head},"choices":[{json.dumps(choice)}]}}\n\n')
    if done:
        events.append("data: [DONE]\n\n")
    return "".join(events)


def sse_response(body: str) -> bytes:
    """A stream with no length framing: it ends when the server closes the connection."""
    head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
    return head.encode() + body.encode()


class ExactServer:
    """Answers each request with the next queued bytes, exactly, then closes."""

    def __init__(self) -> None:
        self._answers: deque[bytes] = deque()
        self._lock = threading.Lock()
        self.requests = 0
        outer = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                length = 0
                while line := self.rfile.readline(65536):
                    if line in (b"\r\n", b"\n"):
                        break
                    name, _, value = line.decode("latin-1").partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value.strip())
                self.rfile.read(length)
                with outer._lock:
                    outer.requests += 1
                    answer = outer._answers.popleft() if outer._answers else b""
                with contextlib.suppress(OSError):
                    self.wfile.write(answer)

        self._server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def answer(self, raw: bytes) -> None:
        with self._lock:
            self._answers.append(raw)

    def __enter__(self) -> ExactServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


# --- bounds on one answer ------------------------------------------------------------------


def test_a_stream_kept_alive_past_the_answer_time_is_cut_and_asked_again(
    provider: FakeProvider, make_model: MakeModel
) -> None:
    """Each piece arrives well within the read timeout, so only the bound on the whole
    attempt stops a server that would trickle (or keep alive) an answer forever."""
    slow = " ".join(f"word{i}" for i in range(200))
    provider.reply(content=slow, keepalive=True, delay_per_event=0.02, usage=(3, 2))
    provider.reply(content="quick answer", usage=(3, 2))
    watch = Watch()

    turn = make_model(max_answer_seconds=0.3).complete(watch.request())

    assert turn.content == "quick answer"  # the trickled answer was never kept
    assert len(provider.requests) == 2
    assert [n.attempt for n in watch.notices] == [1]
    assert "still arriving after 0.3s" in watch.notices[0].error
    assert {d.attempt for d in watch.deltas} == {1, 2}


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "json"])
def test_an_answer_larger_than_the_bound_is_refused_without_reading_it_all(
    provider: FakeProvider, make_model: MakeModel, stream: bool
) -> None:
    provider.reply(content="x" * 200_000, usage=(3, 2))
    provider.reply(content="never asked", usage=(3, 2))

    with pytest.raises(ModelError, match="the answer passed 65536 bytes") as raised:
        make_model(max_answer_bytes=65_536, stream=stream).complete(Watch().request())

    assert not raised.value.transient  # a provider gone wrong is not asked again
    assert len(provider.requests) == 1


def test_an_error_body_larger_than_the_bound_is_refused_too(
    provider: FakeProvider, make_model: MakeModel
) -> None:
    provider.raw(500, "E" * 200_000)

    with pytest.raises(ModelError, match="the answer passed 65536 bytes"):
        make_model(max_answer_bytes=65_536).complete(Watch().request())
    assert len(provider.requests) == 1
