"""Context continuation's pure parts (keel.loop.context): where a compaction cuts, when
it is due, what its continuation says, and the fidelity check that refuses a context
which lost the goal, an open todo, a verification gap or the last unresolved error."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from typing import Any

import pytest

from keel.core.errors import ConfigError, ContextUnfaithful
from keel.core.events import Event, EventType, NewEvent
from keel.core.records import RunOptions
from keel.core.state import RunState
from keel.loop.context import (
    CONTINUATION_HEAD,
    ContextBudget,
    check_fidelity,
    choose_cut,
    compaction_event,
    plan_compaction,
    request_tokens,
)
from keel.loop.prepare import build_messages, system_prompt
from keel.loop.token_estimate import messages_tokens
from keel.loop.transcript import Entry, Transcript
from keel.models.base import Message, ToolCall
from keel.models.context_sizes import DEFAULT_CONTEXT_TOKENS, check_context_tokens

T0 = datetime(2025, 1, 1, tzinfo=UTC)
GOAL = "make the parser accept trailing commas"


class Log:
    """Events numbered as a store would, folded into a state and a transcript."""

    def __init__(self, *, verify: tuple[str, ...] = (), context_tokens: int = 3000) -> None:
        self.events: list[Event] = []
        self.state = RunState(run_id="run_000000000001")
        options = RunOptions(verify=verify, context_tokens=context_tokens).to_dict()
        self.add(EventType.RUN_CREATED, goal=GOAL, options=options)
        self.calls = 0

    def add(self, kind: EventType, **data: Any) -> Event:
        event = Event(
            run_id=self.state.run_id,
            seq=self.state.last_seq + 1,
            event_id=f"e{self.state.last_seq + 1}",
            type=kind,
            recorded_at=T0,
            data=data,
        )
        self.events.append(event)
        self.state = self.state.apply(event)
        return event

    def turn(self, *results: str | None, content: str | None = None) -> list[str]:
        """One assistant turn calling read_file once per result; a result of None fails."""
        ids = [f"call_{self.calls + i}" for i in range(len(results))]
        self.calls += len(results)
        calls = [{"id": i, "name": "read_file", "arguments": {"path": f"{i}.py"}} for i in ids]
        self.add(
            EventType.MODEL_RESPONDED,
            content=content,
            tool_calls=calls,
            finish_reason="tool_calls" if calls else "stop",
        )
        for call_id, result in zip(ids, results, strict=True):
            arguments = {"path": f"{call_id}.py"}
            if result is None:
                self.add(
                    EventType.TOOL_FAILED,
                    call_id=call_id,
                    tool="read_file",
                    arguments=arguments,
                    error_kind="tool_error",
                    message=f"file '{call_id}.py' does not exist",
                )
            else:
                self.add(
                    EventType.TOOL_FINISHED,
                    call_id=call_id,
                    tool="read_file",
                    arguments=arguments,
                    output=result,
                )
        return ids

    def todos(self, *items: tuple[str, str]) -> None:
        self.add(EventType.TODO_UPDATED, todos=[{"content": c, "status": s} for c, s in items])

    def transcript(self) -> Transcript:
        return Transcript(self.events)

    def commit(self, new: NewEvent) -> Event:
        return self.add(new.type, **new.data)


def entries_of(*roles_and_seqs: tuple[str, int]) -> list[Entry]:
    out = []
    for role, seq in roles_and_seqs:
        if role == "assistant":
            message = Message(
                role="assistant", tool_calls=(ToolCall(id="c", name="n", arguments="{}"),)
            )
        elif role == "tool":
            message = Message(role="tool", tool_call_id="c", content="x" * 40)
        else:
            message = Message(role="user", content="y" * 40)
        out.append(Entry(seq=seq, message=message, tokens=14))
    return out


# --- where the cut falls ---------------------------------------------------------------


def test_a_cut_never_separates_a_turn_from_its_tool_results() -> None:
    log = Log()
    for i in range(12):
        log.turn(*(["ok " * 30] * (1 + i % 3)))  # turns of one, two and three calls
    entries = list(log.transcript().entries)
    total = sum(e.tokens for e in entries)
    for keep in range(0, total + 50, 7):
        cut = choose_cut(entries, keep)
        assert cut is not None and 0 < cut < len(entries)
        assert entries[cut].message.role == "assistant"
        kept_results = {e.message.tool_call_id for e in entries[cut:] if e.message.role == "tool"}
        kept_calls = {c.id for e in entries[cut:] for c in e.message.tool_calls}
        assert kept_results <= kept_calls  # no kept result lost its call
        assert sum(e.tokens for e in entries[cut:]) <= keep or cut == _last_turn(entries)


def _last_turn(entries: list[Entry]) -> int:
    return max(i for i, e in enumerate(entries) if e.message.role == "assistant")


def test_the_cut_keeps_the_earliest_turn_boundary_whose_suffix_fits() -> None:
    entries = entries_of(
        ("assistant", 2), ("tool", 3), ("assistant", 4), ("tool", 5), ("assistant", 6), ("tool", 7)
    )
    assert choose_cut(entries, keep=28) == 4  # one turn (two messages of 14) fits
    assert choose_cut(entries, keep=56) == 2  # two turns fit
    assert choose_cut(entries, keep=1000) == 2  # everything fits: the first turn still goes
    assert choose_cut(entries, keep=0) == 4  # nothing fits: the latest turn alone is kept


def test_a_single_turn_cannot_be_cut_and_a_held_message_is_no_boundary() -> None:
    assert choose_cut(entries_of(("assistant", 2), ("tool", 3), ("tool", 4)), keep=0) is None
    # A person's message (seq 4) that arrived while the turn's results (seq 5) were
    # pending is shown after them: no cut may fall right before it.
    held = entries_of(("assistant", 2), ("tool", 5), ("user", 4), ("assistant", 6), ("tool", 7))
    assert choose_cut(held, keep=0) == 3


# --- when a compaction is due ----------------------------------------------------------


def test_the_threshold_is_eighty_percent_of_the_window_less_the_output_reserve() -> None:
    small = ContextBudget(window=3000)
    assert small.reserve == 375  # an eighth of the window
    assert small.threshold == int((3000 - 375) * 0.8) == 2100
    assert small.keep("threshold") == 900 and small.keep("overflow") == 450
    large = ContextBudget(window=1_000_000)
    assert large.reserve == 8192  # at most 8192 tokens are reserved
    assert large.threshold == int((1_000_000 - 8192) * 0.8)


def test_the_window_is_the_runs_option_else_the_models_known_size() -> None:
    assert ContextBudget.of(RunOptions(model="openai:gpt-4o", context_tokens=5000)).window == 5000
    assert ContextBudget.of(RunOptions(model="openai:gpt-4o")).window == 128_000
    assert ContextBudget.of(RunOptions(model="deepseek:deepseek-chat")).window == 1_000_000
    assert ContextBudget.of(RunOptions(model="scripted:x.json")).window == DEFAULT_CONTEXT_TOKENS


@pytest.mark.parametrize("value", [0, -5, 999, 10**12, True, 3000.0, "3000"])
def test_a_context_size_out_of_range_or_not_whole_is_a_config_error(value: object) -> None:
    with pytest.raises(ConfigError, match=r"^--context-tokens must be a whole number of tokens"):
        check_context_tokens("--context-tokens", value)


def test_no_compaction_under_the_threshold_and_one_just_past_it() -> None:
    log = Log()
    budget = ContextBudget.of(log.state.options)
    system = system_prompt(log.state)
    while True:
        log.turn("data " * 40)
        transcript = log.transcript()
        size = request_tokens(system, log.state.goal, transcript, 0)
        plan = plan_compaction(log.state, transcript, system=system, specs_tokens=0, budget=budget)
        if size <= budget.threshold:
            assert plan is None
            continue
        assert plan is not None and plan.reason == "threshold" and plan.tokens_before == size
        break
    assert plan.from_seq == 1 and plan.through_seq == plan.dropped[-1].seq
    # The estimate the plan used is the request's own size, counted afresh.
    assert size == messages_tokens(build_messages(log.state, transcript))


def test_an_overflow_compacts_under_the_threshold_and_a_person_waiting_blocks_it() -> None:
    log = Log()
    log.turn("a")
    log.turn("b")
    budget = ContextBudget.of(log.state.options)
    system = system_prompt(log.state)
    transcript = log.transcript()
    args: dict[str, Any] = {"system": system, "specs_tokens": 0, "budget": budget}
    assert plan_compaction(log.state, transcript, **args) is None
    plan = plan_compaction(log.state, transcript, overflow=True, **args)
    assert plan is not None and plan.reason == "overflow" and plan.cut == 2
    # A person's message held behind an unanswered call: nothing is cut around it.
    log.add(
        EventType.MODEL_RESPONDED,
        tool_calls=[{"id": "late", "name": "read_file", "arguments": {}}],
        finish_reason="tool_calls",
    )
    log.add(EventType.MESSAGE_RECEIVED, text="stop reading", by="ana")
    assert plan_compaction(log.state, log.transcript(), overflow=True, **args) is None


# --- the continuation and its fidelity --------------------------------------------------


def compacted(log: Log, *, scrub: Any = str) -> NewEvent:
    transcript = log.transcript()
    system = system_prompt(log.state)
    plan = plan_compaction(
        log.state,
        transcript,
        system=system,
        specs_tokens=0,
        budget=ContextBudget.of(log.state.options),
        overflow=True,
    )
    assert plan is not None
    return compaction_event(
        log.state, transcript, plan, system=system, specs_tokens=0, step=7, scrub=scrub
    )


def test_the_continuation_carries_the_runs_record_and_its_digest() -> None:
    log = Log(verify=("pytest -q",))
    log.todos(("write the test", "completed"), ("fix the parser", "in_progress"))
    log.turn("parser.py: def parse(text): ...\n" * 40)
    log.turn(None)  # read_file failed: the last unresolved error
    event = compacted(log)

    d = event.data
    text = d["text"]
    assert event.type is EventType.CONTEXT_COMPACTED
    assert d["digest"] == hashlib.sha256(text.encode()).hexdigest()
    assert d["reason"] == "overflow" and d["step"] == 7 and d["messages_dropped"] == 2
    assert d["tokens_before"] > d["tokens_after"]
    assert text.startswith(CONTINUATION_HEAD)
    assert f"Goal: {GOAL}" in text
    assert "[>] fix the parser" in text and "[x] write the test" in text
    assert "pytest -q: not run" in text
    assert "Last unresolved error: file 'call_1.py' does not exist" in text
    assert d["failed_attempts"] == []  # the failure is in the kept turn, not a dropped one

    # Folded, the transcript shows the continuation first, then the kept turn.
    log.commit(event)
    view = log.transcript().view()
    assert view[0].content == text and view[1].role == "assistant"


def test_failed_attempts_of_dropped_turns_are_carried_into_every_later_continuation() -> None:
    log = Log()
    log.turn(None)
    log.turn("ok")
    log.turn("ok")
    log.commit(compacted(log))  # drops the failing turn (overflow keeps the latest)
    first = log.events[-1].data["failed_attempts"]
    assert [f["error"] for f in first] == ["file 'call_0.py' does not exist"]
    log.turn("ok")
    log.commit(compacted(log))
    assert log.events[-1].data["failed_attempts"] == first
    earlier, latest = (e.data for e in log.events if e.type is EventType.CONTEXT_COMPACTED)
    assert latest["from_seq"] == earlier["through_seq"] + 1


@pytest.mark.parametrize(
    ("dropped", "item"),
    [
        (GOAL, "goal"),
        ("fix the parser", "open todo"),
        ("pytest -q: not run", "verification gap"),
        ("file 'call_0.py' does not exist", "unresolved error"),
    ],
)
def test_fidelity_refuses_a_request_text_missing_a_fidelity_item(dropped: str, item: str) -> None:
    log = Log(verify=("pytest -q",))
    log.todos(("write the test", "completed"), ("fix the parser", "pending"))
    log.turn(None)
    whole = "\n".join(
        [GOAL, "fix the parser", "pytest -q: not run", "file 'call_0.py' does not exist"]
    )
    check_fidelity(log.state, whole)  # everything there: accepted

    with pytest.raises(ContextUnfaithful) as refused:
        check_fidelity(log.state, whole.replace(dropped, "[redacted]"))
    assert refused.value.missing == item and refused.value.item == dropped


def test_a_completed_todo_and_a_resolved_error_are_not_required() -> None:
    log = Log()
    log.todos(("write the test", "completed"))
    log.turn(None)
    log.turn("ok")  # a success after the failure: nothing is unresolved
    check_fidelity(log.state, GOAL)


def test_a_continuation_whose_redaction_drops_the_last_error_is_refused() -> None:
    """The log's redaction (a secret learned after the error was stored) would cut the
    error out of the continuation, and the system prompt does not carry errors."""
    log = Log()
    log.turn("ok")
    log.turn(None)
    with pytest.raises(ContextUnfaithful, match="unresolved error"):
        compacted(log, scrub=lambda text: text.replace("call_1.py", "[redacted:TOKEN]"))


def test_a_todo_redacted_out_of_the_continuation_is_still_in_the_request() -> None:
    """The system prompt lists the todos, so the request as a whole keeps them: the
    check is of what is sent (system prompt and continuation), not of one message."""
    log = Log()
    log.todos(("rotate key-123456", "pending"))
    log.turn("ok")
    log.turn("ok")
    event = compacted(log, scrub=lambda text: text.replace("key-123456", "[redacted]"))
    assert "key-123456" not in event.data["text"]
    assert "rotate key-123456" in system_prompt(log.state)
