"""Every tool call has a deadline, and matching costs time linear in the input.

A glob with many ``**`` over a deep tree, or a grep pattern that backtracks
exponentially in Python's ``re``, used to spin at 100 % CPU far past ``--timeout``:
wall time was only checked between steps. Now the driver gives each call a
deadline (its own limit, never past the run's remaining wall time), the in-process
tools check it as they walk, and run_command's timeout is capped by it.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from keel.core.budget import Budget
from keel.core.errors import ToolError, ToolTimedOut
from keel.core.events import EventType
from keel.core.status import RunStatus
from keel.runtime.harness import Harness
from keel.store.base import iter_all_events
from keel.testing import ScriptedModel
from keel.tools import Effect, ToolContext, ToolResult, tool
from keel.tools.builtin import default_registry

MANY_STARS = "/".join(["**"] * 40)
POLICY = '[[rule]]\naction = "allow"\ntool = "run_command"\nreason = "tests sleep"\n'


def call(ws: Path, name: str, deadline_s: float | None = 10.0, **arguments: object) -> str:
    deadline = None if deadline_s is None else time.monotonic() + deadline_s
    ctx = ToolContext(workspace=ws, run_id="run", call_id="c", owner="o", deadline=deadline)
    return default_registry().execute(name, arguments, ctx).output


@pytest.fixture
def deep(tmp_path: Path) -> Path:
    """A chain of 120 directories named 'a', each with files, and one match at the bottom."""
    ws = tmp_path / "deep"
    where = ws
    for _ in range(120):
        where = where / "a"
        where.mkdir(parents=True)
        (where / "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa.txt").write_text("a\n")
    (where / "aaaab.txt").write_text("found\n")
    return ws


@pytest.fixture
def bushy(tmp_path: Path) -> Path:
    """3,280 directories (three per level, seven levels) and as many files."""
    ws = tmp_path / "bushy"

    def grow(where: Path, depth: int) -> None:
        for index in range(3):
            child = where / f"d{index}"
            child.mkdir(parents=True)
            (child / "x.txt").write_text("a\n")
            if depth > 1:
                grow(child, depth - 1)

    grow(ws, 7)
    return ws


def test_a_glob_of_many_double_stars_over_a_deep_tree_ends_at_once(deep: Path) -> None:
    started = time.monotonic()
    out = call(deep, "glob", pattern=f"{MANY_STARS}/*a*a*a*a*b*")
    assert time.monotonic() - started < 2.0  # Python's re backtracked for hours here
    assert out == "/".join(["a"] * 120) + "/aaaab.txt"
    out = call(deep, "glob", pattern="**/a/**/a/**/a/**/a/**/a/**/a/**/a/**/zzz")
    assert out.startswith("no paths match")
    assert time.monotonic() - started < 4.0


def test_a_glob_stops_at_its_deadline_and_says_how_far_it_got(bushy: Path) -> None:
    started = time.monotonic()
    with pytest.raises(ToolTimedOut) as caught:
        call(bushy, "glob", deadline_s=0.02, pattern=f"{MANY_STARS}/*a*a*a*b")
    assert time.monotonic() - started < 1.0
    message = str(caught.value)
    assert message.startswith("glob ran out of time: stopped after 0.0 s")
    assert "walked" in message and "narrow the pattern" in message
    # Without the deadline the same walk finishes, with its result.
    assert call(bushy, "glob", deadline_s=None, pattern="**/d2/d2/d2/d2/d2/d2/d2/x.txt") == (
        "d2/d2/d2/d2/d2/d2/d2/x.txt"
    )


def test_grep_and_list_dir_stop_at_their_deadline(bushy: Path) -> None:
    with pytest.raises(ToolTimedOut, match=r"^grep ran out of time.*searched \d+ files"):
        call(bushy, "grep", deadline_s=0.0, pattern="a")
    with pytest.raises(ToolTimedOut, match=r"^list_dir ran out of time"):
        call(bushy, "list_dir", deadline_s=0.0)


def test_grep_patterns_run_in_linear_time(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "long.txt").write_text("a" * 200_000 + "!\n" + "aa\n")
    started = time.monotonic()
    assert call(ws, "grep", pattern="^(a+)+$") == "long.txt:2: aa\n[1 matching lines in 1 files]"
    assert call(ws, "grep", pattern="(a|aa)*c").startswith("no lines match")
    assert time.monotonic() - started < 2.0


def test_grep_says_which_syntax_it_cannot_run(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    with pytest.raises(ToolError, match=r"RE2 syntax.*no backreferences \(\\1"):
        call(ws, "grep", pattern=r"(\w)\1")
    with pytest.raises(ToolError, match=r"RE2 syntax.*no lookaround"):
        call(ws, "grep", pattern=r"foo(?!bar)")
    with pytest.raises(ToolError, match=r"missing \)"):
        call(ws, "grep", pattern=r"(unclosed")


def test_grep_matches_within_one_line(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "f.txt").write_text("start\nend\r\nstart end\n")
    assert call(ws, "grep", pattern=r"start\s*end") == (
        "f.txt:3: start end\n[1 matching lines in 1 files]"
    )
    assert call(ws, "grep", pattern=r"^end$") == "f.txt:2: end\n[1 matching lines in 1 files]"


# --- the driver's deadline -----------------------------------------------------------------


@tool(effect=Effect.READ, time_limit_s=100.0)
def time_left(ctx: ToolContext) -> ToolResult:
    """Say how long this call may take."""
    assert ctx.deadline is not None
    return ToolResult(output=f"{ctx.deadline - time.monotonic():.3f}")


@tool(effect=Effect.READ, time_limit_s=0.5)
def quick(ctx: ToolContext) -> ToolResult:
    """Say how long this call may take."""
    assert ctx.deadline is not None
    return ToolResult(output=f"{ctx.deadline - time.monotonic():.3f}")


def test_the_driver_gives_each_call_the_earlier_of_its_limit_and_the_runs_wall_time(
    tmp_path: Path,
) -> None:
    registry = default_registry()
    registry.register(time_left)
    registry.register(quick)
    ws = tmp_path / "ws"
    ws.mkdir()
    turns = [
        {"tool_calls": [{"name": "time_left", "arguments": {}}]},
        {"tool_calls": [{"name": "quick", "arguments": {}}]},
        {"content": "done"},
    ]
    harness = Harness(
        store=f"sqlite:///{tmp_path / 'keel.db'}", model=ScriptedModel(turns), tools=registry
    )
    try:
        outcome = harness.run("time", cwd=ws, budget=Budget(max_wall_seconds=30), sandbox="off")
        assert outcome.status is RunStatus.COMPLETED
        outputs = [
            float(e.data["output"])
            for e in iter_all_events(harness.store, outcome.id)
            if e.type is EventType.TOOL_FINISHED
        ]
        assert 25 < outputs[0] <= 30  # the run's wall time, not the tool's 100 s
        assert 0 < outputs[1] <= 0.5  # the tool's own limit
    finally:
        harness.close()


def test_an_in_process_call_that_overruns_the_runs_wall_time_is_a_timed_out_tool_error(
    tmp_path: Path, bushy: Path
) -> None:
    turns = [
        {"tool_calls": [{"name": "glob", "arguments": {"pattern": f"{MANY_STARS}/*q*"}}]},
        {"content": "done"},
    ]
    harness = Harness(store=f"sqlite:///{tmp_path / 'keel.db'}", model=ScriptedModel(turns))
    try:
        started = time.monotonic()
        outcome = harness.run("walk", cwd=bushy, budget=Budget(max_wall_seconds=0.02))
        assert time.monotonic() - started < 3.0
        events = list(iter_all_events(harness.store, outcome.id))
        failed = [e.data for e in events if e.type is EventType.TOOL_FAILED]
        assert failed[0]["error_kind"] == "timed_out"
        assert failed[0]["message"].startswith("glob ran out of time")
        assert outcome.status is RunStatus.FAILED
        assert outcome.stop_reason == "budget_exhausted:wall_time"
    finally:
        harness.close()


def test_a_commands_timeout_never_runs_past_the_runs_wall_time(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "policy.toml").write_text(POLICY)
    turns = [
        {
            "tool_calls": [
                {
                    "name": "run_command",
                    "arguments": {"argv": ["sleep", "30"], "timeout_seconds": 30},
                }
            ]
        },
        {"content": "done"},
    ]
    harness = Harness(store=f"sqlite:///{tmp_path / 'keel.db'}", model=ScriptedModel(turns))
    try:
        started = time.monotonic()
        outcome = harness.run(
            "sleep",
            cwd=ws,
            mode="auto",
            sandbox="off",
            policy_file=ws / "policy.toml",
            budget=Budget(max_wall_seconds=1.0),
        )
        assert time.monotonic() - started < 10.0
        events = list(iter_all_events(harness.store, outcome.id))
        process = next(e.data for e in events if e.type is EventType.PROCESS_STARTED)
        assert process["timeout_s"] <= 1.0
        output = next(e.data["output"] for e in events if e.type is EventType.TOOL_FINISHED)
        assert "[timed out after" in output
        assert "[timeout shortened to" in output and "wall-time budget" in output
        assert outcome.stop_reason == "budget_exhausted:wall_time"
    finally:
        harness.close()
