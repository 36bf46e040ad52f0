"""Context continuation end to end: a real harness on a real SQLite file, the model's
decisions scripted (``ScriptedModel``) or served over loopback HTTP (``FakeProvider``).

A long run in a small context compacts again and again; every request stays under the
budget's threshold, and the first request after each compaction still carries the goal,
every open todo, the verification gaps and the last unresolved error. A provider's
context-overflow answer compacts once and asks again; a second one fails the run. A
model-written summary is asked once per compaction, counted in the run's usage and never
asked again by a resume. A continuation that would lose the last error fails the run.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from keel.core.budget import Budget
from keel.core.events import Event, EventType
from keel.core.state import RunState
from keel.core.status import RunStatus
from keel.loop.context import CONTINUATION_HEAD, ContextBudget
from keel.loop.token_estimate import messages_tokens, specs_tokens
from keel.models.base import ModelRequest, ModelTurn, TokenUsage, ToolCall
from keel.models.cassette import ReplayModel
from keel.models.resolve import resolve_model
from keel.runtime.harness import Harness
from keel.testing import FakeProvider, ScriptedModel
from keel.testing.recorded import load_fixture

GOAL = "read notes.txt in parts and summarise each"
CONTEXT = 3000
TOOLS = ["read_file", "todo_write"]
VERIFY = "test -f notes.txt"


def read(path: str, offset: int | None = None) -> dict[str, Any]:
    arguments: dict[str, Any] = {"path": path}
    if offset is not None:
        arguments.update(offset=offset, limit=5)
    return {"tool_calls": [{"name": "read_file", "arguments": arguments}]}


def todos(part: int) -> dict[str, Any]:
    items = [
        {"content": f"summarise part {part - 1}", "status": "completed"},
        {"content": f"read part {part} of notes.txt", "status": "in_progress"},
        {"content": f"summarise part {part}", "status": "pending"},
    ]
    return {"tool_calls": [{"name": "todo_write", "arguments": {"todos": items}}]}


def long_script(steps: int) -> list[dict[str, Any]]:
    """Mostly reads of five lines; a new todo list every 50 steps; a read of a missing
    file (a long name, so its turn is large) every 7: each one the last unresolved
    error until the next read."""
    turns = [
        todos(i // 50)
        if i % 50 == 0
        else read(f"missing-{i}-" + "x" * 60 + ".txt")
        if i % 7 == 3
        else read("notes.txt", i % 390 + 1)
        for i in range(steps)
    ]
    turns.append({"tool_calls": [{"name": "request_completion", "arguments": {"summary": "ok"}}]})
    return turns


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    lines = (f"line {i}: the quick brown fox jumps over the lazy dog\n" for i in range(400))
    (ws / "notes.txt").write_text("".join(lines), encoding="utf-8")
    return ws


def of_type(events: list[Event], kind: EventType) -> list[Event]:
    return [e for e in events if e.type is kind]


def state_before(events: list[Event], seq: int) -> RunState:
    return RunState.from_events([e for e in events if e.seq < seq])


def request_text(request: ModelRequest) -> str:
    return "\n".join(m.content or "" for m in request.messages)


def test_a_300_step_run_in_a_small_context_compacts_and_keeps_the_record_in_every_request(
    tmp_path: Path, workspace: Path
) -> None:
    model = ScriptedModel(long_script(300))
    with Harness(store=f"sqlite:///{tmp_path / 'keel.db'}", model=model) as harness:
        outcome = harness.run(
            GOAL,
            cwd=workspace,
            budget=Budget(max_steps=400, max_tool_calls=400),
            tools=TOOLS,
            verify=[VERIFY],
            context_tokens=CONTEXT,
        )
        events = list(harness.events(outcome.id))
    assert outcome.status is RunStatus.COMPLETED, outcome.stop_reason
    budget = ContextBudget(window=CONTEXT)

    for request in model.requests:  # every request, by the estimate, under the threshold
        assert messages_tokens(request.messages) + specs_tokens(request.tools) <= budget.threshold

    compactions = of_type(events, EventType.CONTEXT_COMPACTED)
    assert len(compactions) >= 10
    by_step = {r.step: r for r in model.requests}
    through = 0
    with_error = 0
    for event in compactions:
        d = event.data
        assert d["reason"] == "threshold"
        assert d["from_seq"] == through + 1 and d["from_seq"] <= d["through_seq"] < event.seq
        through = d["through_seq"]
        assert d["tokens_before"] > budget.threshold >= d["tokens_after"]
        assert d["tokens_before"] > d["tokens_after"]
        assert d["digest"] == hashlib.sha256(d["text"].encode("utf-8")).hexdigest()

        request = by_step[d["step"]]  # the request made right after this compaction
        continuation = request.messages[2]
        assert continuation.role == "user" and continuation.content == d["text"]
        assert d["text"].startswith(CONTINUATION_HEAD)
        assert request.messages[1].content == GOAL
        shown = request_text(request)
        state = state_before(events, event.seq)
        for todo in state.unfinished_todos():
            assert todo in d["text"], (d["step"], todo)
        assert state.verification_gaps() == [f"{VERIFY}: not run"]
        assert f"{VERIFY}: not run" in d["text"]
        error = state.recent_errors[-1] if state.recent_errors else ""
        if error:
            with_error += 1
            assert f"Last unresolved error: {error}" in d["text"]
        assert all(m.role != "tool" for m in request.messages[:4])  # no orphaned result
        assert GOAL in shown
    assert with_error >= 2  # some compactions came right after a failed read


class SummarisingModel:
    """Reads by script (``ScriptedModel``); a request offered no tools is the harness
    asking for a summary, answered with ``SUMMARY`` and its usage. After the first
    request that shows a continuation the model asks the user a question (the run
    waits); with ``finish`` it completes at once."""

    SUMMARY = "The model read lines 1-60 of notes.txt: every line is about a fox."
    USAGE = TokenUsage(input_tokens=700, output_tokens=40)

    def __init__(self, *, finish: bool = False) -> None:
        self.spec = "scripted:summarising"
        self.scripted = ScriptedModel([read("notes.txt", i * 5 + 1) for i in range(200)])
        self.requests: list[ModelRequest] = []
        self.finish = finish
        self.asked = False

    def complete(self, request: ModelRequest) -> ModelTurn:
        self.requests.append(request)
        if not request.tools:
            return self._turn(self.SUMMARY, (), usage=self.USAGE)
        if self.finish:
            done = ToolCall(id="done", name="request_completion", arguments='{"summary": "ok"}')
            return self._turn(None, (done,))
        shown = request.messages[2].content if len(request.messages) > 2 else None
        continued = (shown or "").startswith(CONTINUATION_HEAD)
        if continued and not self.asked:
            self.asked = True
            ask = ToolCall(id="ask", name="ask_user", arguments='{"question": "go on?"}')
            return self._turn(None, (ask,))
        return self.scripted.complete(request)

    def _turn(
        self, content: str | None, calls: tuple[ToolCall, ...], usage: TokenUsage | None = None
    ) -> ModelTurn:
        return ModelTurn(
            content=content,
            tool_calls=calls,
            usage=usage or TokenUsage(input_tokens=0, output_tokens=0),
            cost=0.0,
            model=self.spec,
        )


def test_a_model_summary_is_in_the_continuation_and_usage_and_a_resume_never_asks_again(
    tmp_path: Path, workspace: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'keel.db'}"
    first = SummarisingModel()
    with Harness(store=url, model=first) as harness:
        waiting = harness.run(
            GOAL,
            cwd=workspace,
            budget=Budget(max_steps=400, max_tool_calls=400),
            tools=[*TOOLS, "ask_user"],
            context_tokens=CONTEXT,
            context_summary=True,
        )
        events = list(harness.events(waiting.id))
    assert waiting.status is RunStatus.WAITING, waiting.stop_reason
    (compacted,) = of_type(events, EventType.CONTEXT_COMPACTED)
    summary_requests = [r for r in first.requests if not r.tools]
    assert len(summary_requests) == 1 and summary_requests[0].step == compacted.data["step"]
    assert summary_requests[0].messages[0].role == "system"  # the instruction, then the turns
    assert "notes.txt" in (summary_requests[0].messages[1].content or "")
    summary = compacted.data["summary"]
    assert summary["text"] == SummarisingModel.SUMMARY and summary["model"] == first.spec
    assert summary["usage"]["input_tokens"] == 700 and summary["usage"]["output_tokens"] == 40
    assert SummarisingModel.SUMMARY in compacted.data["text"]
    asked = next(r for r in first.requests if r.tools and r.step == compacted.data["step"])
    assert SummarisingModel.SUMMARY in (asked.messages[2].content or "")
    usage = waiting.state.usage
    assert usage.input_tokens == 700 and usage.output_tokens == 40 and usage.tokens == 740

    resumed = SummarisingModel(finish=True)
    with Harness(store=url, model=resumed) as harness:
        harness.answer(waiting.id, "yes")
        outcome = harness.resume(waiting.id)
    assert outcome.status is RunStatus.COMPLETED, outcome.stop_reason
    (request,) = resumed.requests  # no summary asked again: the continuation is stored
    assert request.tools and request.messages[2].content == compacted.data["text"]
    assert outcome.state.usage.tokens == 740


def test_a_secret_that_appears_while_the_run_waits_makes_the_continuation_unfaithful(
    tmp_path: Path, workspace: Path
) -> None:
    """The last failed read named a file whose name is a secret value by the time the
    run resumes (a person put it in .env): the continuation, redacted as the log is,
    would lose the last unresolved error, so it is never sent and the run fails."""
    token = "tok-Zq81mK42xQ7"
    turns = [read("notes.txt", i * 5 + 1) for i in range(6)]
    turns.append(
        {
            "tool_calls": [
                {"name": "read_file", "arguments": {"path": f"{token}.txt"}},
                {"name": "ask_user", "arguments": {"question": "where is the token file?"}},
            ]
        }
    )
    turns.append(read("notes.txt"))
    url = f"sqlite:///{tmp_path / 'keel.db'}"
    with Harness(store=url, model=ScriptedModel(turns)) as harness:
        waiting = harness.run(
            GOAL,
            cwd=workspace,
            tools=[*TOOLS, "ask_user"],
            context_tokens=CONTEXT,
        )
    assert waiting.status is RunStatus.WAITING, waiting.stop_reason
    assert token in waiting.state.recent_errors[-1]

    (workspace / ".env").write_text(f"SERVICE_TOKEN={token}\n", encoding="utf-8")
    resumed = ScriptedModel(turns)
    with Harness(store=url, model=resumed) as harness:
        harness.answer(waiting.id, "it is gone; here is the log you asked for:\n" + "x" * 6000)
        before = harness.store.load_run(waiting.id)
        outcome = harness.resume(waiting.id)
        events = list(harness.events(waiting.id))

    assert outcome.status is RunStatus.FAILED
    reason = outcome.stop_reason or ""
    assert reason.startswith("context_unfaithful: ") and "unresolved error" in reason
    assert resumed.requests == []  # nothing was sent
    assert of_type(events, EventType.CONTEXT_COMPACTED) == []
    after = outcome.state
    assert after.todos == before.todos and after.usage.steps == before.usage.steps
    assert after.recent_errors == before.recent_errors
    assert after.result == {"unfinished": []}


# --- a provider's context overflow, over loopback HTTP -----------------------------------


@pytest.fixture
def provider() -> Iterator[FakeProvider]:
    with FakeProvider(strict=True) as server:
        yield server


def http_harness(tmp_path: Path, provider: FakeProvider) -> Harness:
    """The real OpenAI-compatible adapter, configured as a profile is (API key and base
    URL variables), pointed at the FakeProvider."""
    environ = {
        "OPENAI_API_KEY": "sk-test",
        "OPENAI_BASE_URL": provider.base_url,
        "KEEL_MODEL_MAX_ATTEMPTS": "3",
        "KEEL_MODEL_MAX_WAIT": "0.01",
    }
    model = resolve_model("openai:gpt-4o-mini", cwd=tmp_path, environ=environ)
    return Harness(store=f"sqlite:///{tmp_path / 'keel.db'}", model=model)


# OpenAI's own 400 for a prompt past the window (pydantic-ai's cassette; see
# tests/fixtures/providers/README.md): error.code context_length_exceeded.
OVERFLOW = "openai_error_400_context_length"


def test_a_context_overflow_from_the_provider_compacts_once_and_the_retry_succeeds(
    tmp_path: Path, workspace: Path, provider: FakeProvider
) -> None:
    for i in range(3):
        provider.reply(tool_calls=[("read_file", {"path": "notes.txt", "offset": i * 5 + 1})])
    provider.raw_fixture(load_fixture(OVERFLOW))
    provider.reply(tool_calls=[("request_completion", {"summary": "read it"})])

    with http_harness(tmp_path, provider) as harness:
        outcome = harness.run(GOAL, cwd=workspace, tools=TOOLS)
        events = list(harness.events(outcome.id))

    assert outcome.status is RunStatus.COMPLETED, outcome.stop_reason
    (compacted,) = of_type(events, EventType.CONTEXT_COMPACTED)
    assert compacted.data["reason"] == "overflow" and compacted.data["step"] == 3
    assert len(provider.requests) == 5
    refused, retried = provider.requests[3], provider.requests[4]
    assert len(retried["messages"]) < len(refused["messages"])
    assert retried["messages"][2]["content"] == compacted.data["text"]
    assert retried["messages"][1]["content"] == GOAL
    assert retried["messages"][-2:] == refused["messages"][-2:]  # the latest turn is kept
    assert len(of_type(events, EventType.MODEL_REQUESTED)) == 4  # one step, asked twice


def test_a_second_overflow_right_after_the_compaction_fails_the_run_without_a_loop(
    tmp_path: Path, workspace: Path, provider: FakeProvider
) -> None:
    for i in range(3):
        provider.reply(tool_calls=[("read_file", {"path": "notes.txt", "offset": i * 5 + 1})])
    provider.raw_fixture(load_fixture(OVERFLOW))
    provider.raw_fixture(load_fixture(OVERFLOW))
    provider.reply("never asked")

    with http_harness(tmp_path, provider) as harness:
        outcome = harness.run(GOAL, cwd=workspace, tools=TOOLS)
        events = list(harness.events(outcome.id))

    assert outcome.status is RunStatus.FAILED
    reason = outcome.stop_reason or ""
    assert reason.startswith("context_overflow: ") and "maximum context length" in reason
    assert len(provider.requests) == 5  # three steps, then the refused request and its retry
    (compacted,) = of_type(events, EventType.CONTEXT_COMPACTED)
    assert compacted.data["reason"] == "overflow"
    assert provider.pending == 1  # the reply after the second overflow was never asked for


def test_a_run_with_summaries_records_and_replays_them_apart_from_its_turns(
    tmp_path: Path, workspace: Path
) -> None:
    """A summary is asked at the same step as the turn after it; the cassette keeps the
    two (``purpose``), so a replay plays both and the run is the recorded one."""
    cassette = tmp_path / "run.cassette"
    options: dict[str, Any] = {
        "budget": Budget(max_steps=100, max_tool_calls=100),
        "tools": TOOLS,
        "context_tokens": CONTEXT,
        "context_summary": True,
    }
    with Harness(store=f"sqlite:///{tmp_path / 'a.db'}", model=ScriptedModel(long_script(30))) as h:
        first = h.run(GOAL, cwd=workspace, record=cassette, **options)
        recorded = [e.data for e in h.events(first.id) if e.type is EventType.CONTEXT_COMPACTED]
    assert first.status is RunStatus.COMPLETED, first.stop_reason
    assert recorded and all(d["summary"]["text"] for d in recorded)
    lines = [json.loads(line) for line in cassette.read_text().splitlines()[1:]]
    assert sum(line.get("purpose") == "summary" for line in lines) == len(recorded)

    replay = ReplayModel.from_file(cassette)
    with Harness(store=f"sqlite:///{tmp_path / 'b.db'}", model=replay) as h:
        second = h.run(GOAL, cwd=workspace, **options)
        replayed = [e.data for e in h.events(second.id) if e.type is EventType.CONTEXT_COMPACTED]
    assert second.status is RunStatus.COMPLETED, second.stop_reason
    assert [d["text"] for d in replayed] == [d["text"] for d in recorded]
