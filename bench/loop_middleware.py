"""What middleware adds to a durable step: 5 no-op middleware against none (bench/loop.py).

Each of the 5 overrides every point (before_model, after_model, before_tool,
after_tool, before_complete, on_event) and answers ``continue``, so the chain is asked
at every point of every step and nothing is recorded: the figure is the cost of the
asking itself. Runs with and without alternate (ABAB...) so drift on a shared machine
hits both alike; the report gives each side's median and best ms per step, by the
wall clock and by CPU time (steadier when the machine is shared), and the added
microseconds per step (median against median, best against best). A whole step costs
about 0.5 ms and varies run to run by more than the middleware add, so the report also
times the asking alone (``chain_only_cpu_us_per_step``): the driver's five middleware
calls of one step with a real step's state, request, turn, call and events, 20,000
times, no store or model.

    .venv/bin/python bench/loop_middleware.py [--steps 1000] [--repeat 7]
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from loop import StepModel, bench_registry  # bench/loop.py, beside this script

from keel.core.budget import Budget
from keel.core.events import Event
from keel.core.middleware import CONTINUE, Decision
from keel.loop.actions import RunTool
from keel.loop.catalog import offered_specs
from keel.loop.middleware import (
    CompletionContext,
    Middleware,
    MiddlewareChain,
    ModelContext,
    ToolCallContext,
    ToolResultContext,
    TurnContext,
)
from keel.loop.middleware_driving import MiddlewareDriving
from keel.loop.outcomes import call_finished
from keel.models.base import ModelRequest, ModelTurn, TokenUsage, ToolCall
from keel.runtime.harness import Harness


class NoOp(Middleware):
    """Asked everywhere, changes nothing."""

    def __init__(self, index: int) -> None:
        self.name = f"noop{index}"
        self.on_error = "open"

    def before_model(self, ctx: ModelContext) -> Decision:
        return CONTINUE

    def after_model(self, ctx: TurnContext) -> Decision:
        return CONTINUE

    def before_tool(self, ctx: ToolCallContext) -> Decision:
        return CONTINUE

    def after_tool(self, ctx: ToolResultContext) -> Decision:
        return CONTINUE

    def before_complete(self, ctx: CompletionContext) -> Decision:
        return CONTINUE

    def on_event(self, event: Event) -> None:
        return None


def timed_run(steps: int, folder: Path, middleware: int) -> tuple[float, float]:
    """Wall and CPU ms per step of one N-step run on a fresh SQLite file."""
    folder.mkdir(parents=True, exist_ok=True)
    harness = Harness(
        store=f"sqlite:///{folder / 'keel.db'}",
        model=StepModel(steps),
        tools=bench_registry(),
        middleware=[NoOp(i) for i in range(middleware)],
    )
    with harness:
        budget = Budget(max_steps=2 * steps + 10, max_tool_calls=2 * steps + 10)
        gc.collect()
        started, cpu = time.perf_counter(), time.process_time()
        outcome = harness.run("benchmark", cwd=folder, budget=budget)
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
        assert outcome.status.value == "completed", outcome.stop_reason
        assert outcome.state.usage.tool_calls == steps
    return elapsed / steps * 1000, cpu / steps * 1000


def measure(steps: int = 1000, repeat: int = 7) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="keel-bench-mw-") as tmp:
        root = Path(tmp)
        timed_run(50, root / "warm-0", 0)  # the same warm-up for both sides
        timed_run(50, root / "warm-5", 5)
        without: list[tuple[float, float]] = []
        with_five: list[tuple[float, float]] = []
        for i in range(repeat):
            without.append(timed_run(steps, root / f"none-{i}", 0))
            with_five.append(timed_run(steps, root / f"five-{i}", 5))
    report: dict[str, Any] = {
        "workload": f"{steps} x (model turn -> noop read tool -> result), SQLite WAL/NORMAL",
        "repetitions": repeat,
    }
    for i, clock in enumerate(("wall", "cpu")):
        none = [t[i] for t in without]
        five = [t[i] for t in with_five]
        report[clock] = {
            "none_ms_per_step": {"median": _r(statistics.median(none)), "best": _r(min(none))},
            "five_noop_ms_per_step": {
                "median": _r(statistics.median(five)),
                "best": _r(min(five)),
            },
            "added_us_per_step": {
                "median": round((statistics.median(five) - statistics.median(none)) * 1000, 1),
                "best": round((min(five) - min(none)) * 1000, 1),
            },
        }
    # With no middleware the driver makes none of these calls (no point is asked), so
    # the asking's whole cost is what the five add.
    report["chain_only_cpu_us_per_step"] = {
        "five_noop": statistics.median(round(chain_us_per_step(5), 2) for _ in range(5))
    }
    return report


def chain_us_per_step(middleware: int, steps: int = 20_000) -> float:
    """CPU microseconds the driver spends asking ``middleware`` no-op middleware in one
    step — before_model, after_model, before_tool, after_tool and on_event for the
    step's three events — with the objects a real step has; no store, no model."""
    with tempfile.TemporaryDirectory(prefix="keel-bench-mw-") as tmp:
        folder = Path(tmp)
        with Harness(
            store=f"sqlite:///{folder / 'keel.db'}", model=StepModel(3), tools=bench_registry()
        ) as harness:
            outcome = harness.run("benchmark", cwd=folder)
            events = list(harness.events(outcome.id))[-3:]
    state = outcome.state
    asking = MiddlewareDriving(MiddlewareChain([NoOp(i) for i in range(middleware)]))
    request = ModelRequest(messages=(), tools=offered_specs(bench_registry()), step=1)
    call = ToolCall(id="call_1", name="noop", arguments='{"i": 1}')
    turn = ModelTurn(
        content=None,
        tool_calls=(call,),
        usage=TokenUsage(input_tokens=0, output_tokens=0),
        cost=0.0,
        model="b",
    )
    action = RunTool(
        call_id="call_1", tool="noop", arguments={"i": 1}, effect="read", recovery="replay_safe"
    )
    finished = call_finished(action, "ok 1", {}, 0.0, {})
    chain = asking.chain
    started = time.process_time()
    for _ in range(steps):
        asking.before_model(state, request)
        asking.after_model(state, 2, turn)
        asking.before_tool(state, action)
        asking.after_tool(state, action, list(finished), {})
        for event in events:
            chain.observe(event)
    return (time.process_time() - started) / steps * 1e6


def _r(ms: float) -> float:
    return round(ms, 4)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    print(json.dumps(measure(args.steps, args.repeat), indent=2))


if __name__ == "__main__":
    main()
