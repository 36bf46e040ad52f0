"""``Store.run_stats`` in the Store contract: on a seeded store (runs across statuses,
models, tools and verifiers), every figure equals what a reader computes by hand from
the runs' events (``read_events``), whole and filtered by date, model and run.

The reference below shares no code with the stores: it walks the events, sums, and
takes percentiles by their definition (the smallest recorded value that at least p% of
the values do not exceed).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest

from keel.core.budget import Budget
from keel.core.errors import RunNotFound
from keel.core.events import EventType, NewEvent
from keel.core.records import RunOptions
from keel.core.state import RunState
from keel.core.stats import RunStats
from keel.core.status import RunStatus
from keel.store.base import Store
from keel.testing.stores import append, make_run, move, reopened

GPT = "openai:gpt-4o-mini"
DEEPSEEK = "deepseek:deepseek-chat"


# --- the events a run records (shapes as keel.loop.outcomes writes them) ------------------


def turn(
    *,
    model: str = "served-model",
    tokens: tuple[int, int, int, int] = (1000, 100, 0, 0),
    cost: float = 0.001,
    elapsed: float | None = 1.0,
) -> list[NewEvent]:
    """A step: the request and the model's answer (tokens: input, output, cached, reasoning)."""
    data: dict[str, Any] = {
        "step": 1,
        "model": model,
        "content": "thinking",
        "tool_calls": [],
        "usage": {
            "input_tokens": tokens[0],
            "output_tokens": tokens[1],
            "cached_input_tokens": tokens[2],
            "reasoning_tokens": tokens[3],
        },
        "cost": cost,
        "finish_reason": "tool_calls",
    }
    if elapsed is not None:
        data["elapsed_s"] = elapsed
    return [
        NewEvent(type=EventType.MODEL_REQUESTED, data={"step": 1, "messages": 2}),
        NewEvent(type=EventType.MODEL_RESPONDED, data=data),
    ]


def tool(
    call_id: str, name: str, *, elapsed: float | None = 0.01, failed: bool = False
) -> list[NewEvent]:
    """A tool call started and finished (or failed; without ``elapsed``: refused before it
    ran, as a policy denial records it)."""
    common: dict[str, Any] = {"call_id": call_id, "tool": name, "arguments": {"path": "a.py"}}
    if elapsed is not None:
        common["elapsed_s"] = elapsed
    ended = (
        NewEvent(
            type=EventType.TOOL_FAILED,
            data={**common, "error_kind": "tool_error", "message": "no such file"},
        )
        if failed
        else NewEvent(type=EventType.TOOL_FINISHED, data={**common, "output": "ok"})
    )
    started = {"call_id": call_id, "key": f"k-{call_id}", "tool": name, "arguments": {}}
    return [NewEvent(type=EventType.TOOL_STARTED, data=started), ended]


def check(command: str, passed: bool, name: str | None = None) -> dict[str, Any]:
    record: dict[str, Any] = {
        "command": command,
        "exit_code": 0 if passed else 1,
        "duration_s": 2.5,
        "artifact": None,
        "mutation_revision": 0,
        "file_hashes": {},
        "passed": passed,
    }
    if name is not None:
        record["name"] = name
    return record


def verified(state: RunState, *records: dict[str, Any]) -> list[NewEvent]:
    """Running -> verifying -> completed, or back to running when a record failed."""
    passed = all(r["passed"] for r in records)
    kind = EventType.VERIFICATION_PASSED if passed else EventType.VERIFICATION_FAILED
    verifying = RunState(run_id=state.run_id, status=RunStatus.VERIFYING)
    after = (
        move(verifying, RunStatus.COMPLETED, "verified")
        if passed
        else move(verifying, RunStatus.RUNNING)
    )
    return [
        move(state, RunStatus.VERIFYING, "final answer given"),
        NewEvent(type=kind, data={"records": list(records), "elapsed_s": 3.0}),
        after,
    ]


def run_of(store: Store, spec: str | None, *steps: list[NewEvent]) -> RunState:
    state = make_run(store, options=RunOptions(model=spec, budget=Budget(max_steps=50)))
    for events in steps:
        state, _ = append(store, state, events)
    return state


def seed(store: Store) -> list[RunState]:
    """Six runs: completed after a failed verification, failed on budget, blocked,
    cancelled after a compaction's summary call, still running on a run without a model
    spec, and waiting for an approval after a person's sign-off."""
    runs = []
    s = run_of(store, GPT, turn(elapsed=1.2), tool("c1", "read_file", elapsed=0.004))
    s, _ = append(store, s, turn(elapsed=2.0, tokens=(3000, 200, 1200, 50), cost=0.004))
    s, _ = append(
        store, s, [*tool("c2", "grep", elapsed=0.2), *tool("c3", "run_command", elapsed=1.5)]
    )
    s, _ = append(store, s, verified(s, check("pytest -q", False), check("ruff check .", True)))
    s, _ = append(store, s, turn(elapsed=0.8))
    s, _ = append(
        store,
        s,
        verified(s, check("pytest -q", True, name="unit_tests"), check("ruff check .", True)),
    )
    runs.append(s)

    s = run_of(store, GPT, turn(elapsed=0.5), tool("c1", "read_file", elapsed=0.006, failed=True))
    s, _ = append(
        store, s, [*turn(elapsed=0.7), *tool("c2", "write_file", elapsed=None, failed=True)]
    )
    s, _ = append(store, s, [move(s, RunStatus.FAILED, "budget_exhausted:steps")])
    runs.append(s)

    s = run_of(store, DEEPSEEK, turn(elapsed=3.1, tokens=(5000, 900, 4000, 600), cost=0.002))
    reason = "policy forbids run_command: network (rule: no-network)"
    s, _ = append(
        store, s, [*tool("c1", "run_command", elapsed=0.9), move(s, RunStatus.BLOCKED, reason)]
    )
    runs.append(s)

    compacted = NewEvent(
        type=EventType.CONTEXT_COMPACTED,
        data={
            "dropped": 4,
            "summary": {
                "usage": {"input_tokens": 800, "output_tokens": 150, "cached_input_tokens": 100},
                "cost": 0.0005,
                "elapsed_s": 4.0,
            },
        },
    )
    s = run_of(store, DEEPSEEK, turn(elapsed=2.2), [compacted], tool("c1", "grep", elapsed=0.05))
    s, _ = append(store, s, [move(s, RunStatus.CANCELLED, "not needed: the issue was closed")])
    runs.append(s)

    s = run_of(
        store, None, turn(model="local-llm", elapsed=0.3), turn(model="local-llm", elapsed=None)
    )
    s, _ = append(store, s, tool("c1", "list_dir", elapsed=0.002))
    runs.append(s)

    signed = NewEvent(
        type=EventType.SIGNOFF_RECORDED,
        data={"verifier": "review", "passed": False, "by": "ana", "mutation_revision": 0},
    )
    s = run_of(store, GPT, turn(elapsed=1.1), [signed], tool("c1", "edit_file", elapsed=0.008))
    s, _ = append(store, s, [move(s, RunStatus.WAITING, "approval:c2 write_file")])
    runs.append(s)
    return runs


# --- the reference: figures by hand from the events -------------------------------------


def by_definition(values: list[float], pct: int) -> float:
    """The smallest recorded value that at least ``pct``% of the values do not exceed."""
    return min(v for v in values if sum(1 for w in values if w <= v) * 100 >= pct * len(values))


@dataclass
class Calls:
    calls: int = 0
    failed: int = 0
    seconds: list[float] = field(default_factory=list)


@dataclass
class ByHand:
    runs: Counter[RunStatus] = field(default_factory=Counter)
    reasons: Counter[tuple[RunStatus, str]] = field(default_factory=Counter)
    steps: int = 0
    tokens: Counter[str] = field(default_factory=Counter)
    cost: float = 0.0
    models: defaultdict[str, Calls] = field(default_factory=lambda: defaultdict(Calls))
    tools: defaultdict[str, Calls] = field(default_factory=lambda: defaultdict(Calls))
    verifiers: defaultdict[str, list[int]] = field(
        default_factory=lambda: defaultdict(lambda: [0, 0])
    )

    def add_usage(self, usage: dict[str, int], cost: float) -> None:
        for kind in ("input", "cached_input", "output", "reasoning"):
            self.tokens[kind] += usage.get(f"{kind}_tokens", 0)
        self.cost += cost


def figures_by_hand(store: Store, runs: list[RunState]) -> ByHand:
    hand = ByHand()
    for run in runs:
        state = store.load_run(run.run_id)
        hand.runs[state.status] += 1
        if state.reason:
            hand.reasons[(state.status, state.reason.split(":")[0].strip())] += 1
        for e in store.read_events(run.run_id):
            d = e.data
            if e.type is EventType.MODEL_RESPONDED:
                hand.steps += 1
                model = hand.models[state.options.model or d["model"]]
                model.calls += 1
                if "elapsed_s" in d:
                    model.seconds.append(d["elapsed_s"])
                hand.add_usage(d["usage"], d["cost"])
            elif e.type is EventType.CONTEXT_COMPACTED:
                hand.add_usage(d["summary"]["usage"], d["summary"]["cost"])
            elif e.type in (EventType.TOOL_FINISHED, EventType.TOOL_FAILED):
                used = hand.tools[d["tool"]]
                used.calls += 1
                used.failed += e.type is EventType.TOOL_FAILED
                if "elapsed_s" in d:
                    used.seconds.append(d["elapsed_s"])
            elif e.type in (EventType.VERIFICATION_PASSED, EventType.VERIFICATION_FAILED):
                for r in d["records"]:
                    tally = hand.verifiers[r.get("name") or r["command"]]
                    tally[0] += 1
                    tally[1] += r["passed"]
            elif e.type is EventType.SIGNOFF_RECORDED:
                tally = hand.verifiers[d["verifier"]]
                tally[0] += 1
                tally[1] += d["passed"]
    return hand


def assert_latency(got: Any, seconds: list[float]) -> None:
    if not seconds:
        assert got is None
        return
    assert got.timed == len(seconds)
    assert got.total_s == pytest.approx(sum(seconds))
    assert got.max_s == max(seconds)
    assert (got.p50_s, got.p95_s, got.p99_s) == tuple(
        by_definition(seconds, pct) for pct in (50, 95, 99)
    )


def assert_matches(stats: RunStats, hand: ByHand) -> None:
    assert stats.runs == sum(hand.runs.values())
    assert {s: n for s, n in stats.by_status.items() if n} == dict(hand.runs)
    assert {(r.status, r.reason): r.runs for r in stats.reasons} == dict(hand.reasons)
    assert stats.steps == hand.steps
    tokens = stats.tokens
    assert (tokens.input, tokens.cached_input, tokens.output, tokens.reasoning) == (
        hand.tokens["input"],
        hand.tokens["cached_input"],
        hand.tokens["output"],
        hand.tokens["reasoning"],
    )
    assert stats.cost == pytest.approx(hand.cost)
    assert [m.model for m in stats.models] == sorted(hand.models)
    for m in stats.models:
        assert m.calls == hand.models[m.model].calls
        assert_latency(m.latency, hand.models[m.model].seconds)
    assert [t.tool for t in stats.tools] == sorted(hand.tools)
    for t in stats.tools:
        assert (t.calls, t.failed) == (hand.tools[t.tool].calls, hand.tools[t.tool].failed)
        assert_latency(t.latency, hand.tools[t.tool].seconds)
    assert {v.verifier: [v.checks, v.passed] for v in stats.verifiers} == dict(hand.verifiers)
    assert stats.tool_calls == sum(c.calls for c in hand.tools.values())


# --- the contract -----------------------------------------------------------------------


def test_stats_equal_the_figures_of_the_events_counted_by_hand(store: Store) -> None:
    runs = seed(store)
    stats = store.run_stats()
    assert_matches(stats, figures_by_hand(store, runs))
    # A few figures spelled out, so the reference cannot be wrong the same way.
    assert stats.runs == 6 and stats.steps == 10
    assert stats.by_status[RunStatus.COMPLETED] == 1 and stats.by_status[RunStatus.QUEUED] == 0
    assert {v.verifier: (v.checks, v.passed) for v in stats.verifiers} == {
        "pytest -q": (1, 0),
        "unit_tests": (1, 1),
        "ruff check .": (2, 2),
        "review": (1, 0),
    }
    read_file = next(t for t in stats.tools if t.tool == "read_file")
    assert (read_file.calls, read_file.failed) == (2, 1)
    write_file = next(t for t in stats.tools if t.tool == "write_file")
    assert (write_file.calls, write_file.failed, write_file.latency) == (1, 1, None)
    assert [m.model for m in stats.models] == [DEEPSEEK, "local-llm", GPT]
    assert stats.tokens.input == 1000 * 8 + 3000 + 5000 + 800  # the summary call too
    assert {(r.status, r.reason) for r in stats.reasons} >= {
        (RunStatus.FAILED, "budget_exhausted"),
        (RunStatus.BLOCKED, "policy forbids run_command"),
        (RunStatus.WAITING, "approval"),
    }


def test_stats_filtered_by_date_model_and_run_count_only_those_runs(store: Store) -> None:
    runs = seed(store)
    created = {r.run_id: store.read_events(r.run_id)[0].recorded_at for r in runs}
    since = created[runs[2].run_id]
    later = [r for r in runs if created[r.run_id] >= since]
    assert 0 < len(later) < len(runs)
    assert_matches(store.run_stats(since=since), figures_by_hand(store, later))
    gpt = [r for r in runs if r.options.model == GPT]
    assert_matches(store.run_stats(model=GPT), figures_by_hand(store, gpt))
    both = [r for r in gpt if created[r.run_id] >= since]
    assert_matches(store.run_stats(model=GPT, since=since), figures_by_hand(store, both))
    one = runs[0]
    assert_matches(store.run_stats(run_id=one.run_id), figures_by_hand(store, [one]))
    future = max(created.values()) + timedelta(seconds=1)
    assert store.run_stats(since=future) == RunStats(
        by_status=store.run_stats(since=future).by_status
    )
    assert store.run_stats(since=future).runs == 0
    assert store.run_stats(model="no:such-model").runs == 0


def test_stats_of_an_unknown_run_is_run_not_found(store: Store) -> None:
    seed(store)
    with pytest.raises(RunNotFound):
        store.run_stats(run_id="run_000000000000")


def test_an_empty_store_has_zero_figures(store: Store) -> None:
    stats = store.run_stats()
    assert stats.runs == 0 and stats.steps == 0 and stats.cost == 0.0
    assert set(stats.by_status.values()) == {0} and len(stats.by_status) == len(RunStatus)
    assert stats.models == stats.tools == stats.verifiers == stats.reasons == ()


def test_stats_are_what_another_process_reads(store: Store) -> None:
    seed(store)
    with reopened(store) as other:
        assert other.run_stats() == store.run_stats()


def test_percentiles_are_nearest_ranks_of_many_latencies(store: Store) -> None:
    seconds = [round(0.001 * ((i * 37) % 101 + 1), 6) for i in range(101)]
    steps = [tool(f"c{i}", "grep", elapsed=s) for i, s in enumerate(seconds)]
    state = run_of(store, GPT, *steps)
    grep = store.run_stats(run_id=state.run_id).tools[0]
    assert_latency(grep.latency, seconds)
    assert (grep.latency.p50_s, grep.latency.p99_s) == (0.051, 0.1)  # type: ignore[union-attr]


def test_odd_values_in_events_are_stored_and_count_as_absent(store: Store) -> None:
    """What the model or a provider sends is untrusted: a NUL in a tool name or output,
    numbers as text, booleans, negatives, huge integers. The append is never refused for
    the figures' sake, and none of it counts as a number (a negative count as 0)."""
    odd_turn = NewEvent(
        type=EventType.MODEL_RESPONDED,
        data={
            "model": "m\x00odd",
            "content": "x\x00y \\u0000",
            "tool_calls": [],
            "usage": {
                "input_tokens": "12",
                "output_tokens": True,
                "cached_input_tokens": -5,
                "reasoning_tokens": 10**40,
            },
            "cost": -0.5,
        },
    )
    odd_tool = NewEvent(
        type=EventType.TOOL_FAILED,
        data={"call_id": "c1", "tool": "rm\x00-rf", "message": "a\x00b", "elapsed_s": True},
    )
    state = run_of(store, None, [odd_turn, odd_tool])
    assert store.load_run(state.run_id).last_seq == 3
    stats = store.run_stats()
    assert stats.steps == 1 and stats.cost == 0.0
    assert (stats.tokens.input, stats.tokens.output, stats.tokens.reasoning) == (0, 0, 0)
    assert [(m.model, m.calls, m.latency) for m in stats.models] == [("m\ufffdodd", 1, None)]
    assert [(t.tool, t.failed, t.latency) for t in stats.tools] == [("rm\ufffd-rf", 1, None)]
    assert math.isfinite(stats.cost)
