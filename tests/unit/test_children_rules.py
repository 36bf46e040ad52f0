"""A parent's children as its state folds them, and the rules a spawn must pass: depth,
live children, and the budget carved for the child (keel.core.children, pure)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from keel.core.budget import Budget, Dimension, Usage
from keel.core.children import (
    ChildRecord,
    SpawnRefused,
    carve_budget,
    check_limits,
    finished,
    live_children,
    output_problems,
    reservation,
    reserved,
    spawned,
)
from keel.core.records import RunOptions
from keel.core.state import RunState

SPAWNED = {
    "child_run_id": "run_a",
    "call_id": "c7",
    "turn": 3,
    "task_id": "task_1",
    "agent": "coder",
    "background": True,
    "attempt": 2,
    "reserved": {"tokens": 1000, "cost": 0.1},
    "on_failure": {"policy": "escalate"},
    "verifier": "review",
}
RECORD = ChildRecord(
    call_id="c7",
    turn=3,
    task_id="task_1",
    agent="coder",
    background=True,
    attempt=2,
    reserved_tokens=1000,
    reserved_cost=0.1,
    on_failure={"policy": "escalate"},
    verifier="review",
)


# --- folding --------------------------------------------------------------------------------


def test_a_spawn_records_the_child_with_what_it_holds_of_the_parents_pools() -> None:
    assert spawned({}, SPAWNED) == {"run_a": RECORD}


def test_a_spawn_recorded_twice_changes_nothing() -> None:
    once = spawned({}, SPAWNED)
    assert spawned(once, {**SPAWNED, "agent": "other", "reserved": {"tokens": 5}}) == once


def test_a_spawn_with_only_the_child_id_gets_the_defaults() -> None:
    assert spawned({}, {"child_run_id": "run_b"}) == {
        "run_b": ChildRecord(call_id="", task_id=None, agent="", background=False, attempt=1)
    }
    record = spawned({}, {"child_run_id": "run_b", "reserved": {"tokens": None, "cost": None}})
    assert (record["run_b"].reserved_tokens, record["run_b"].reserved_cost) == (0, 0.0)


def test_a_childs_end_releases_its_reservation_and_adds_its_usage() -> None:
    children = {"run_a": RECORD, "run_b": RECORD}
    usage = Usage(tokens=10, cost=0.5)
    after, total, news = finished(
        children,
        usage,
        {"child_run_id": "run_a", "status": "completed", "usage": {"tokens": 90, "cost": 0.25}},
    )
    assert news is True
    assert after == {
        "run_a": ChildRecord(
            call_id="c7",
            turn=3,
            task_id="task_1",
            agent="coder",
            background=True,
            attempt=2,
            status="completed",
            on_failure={"policy": "escalate"},
            verifier="review",
        ),
        "run_b": RECORD,
    }
    assert (total.tokens, total.cost) == (100, 0.75)
    assert children["run_a"] is RECORD  # the fold's input is left as it was


def test_a_childs_end_without_a_status_is_a_failure() -> None:
    after, _, _ = finished({"run_a": RECORD}, Usage(), {"child_run_id": "run_a"})
    assert after["run_a"].status == "failed"


@pytest.mark.parametrize(
    "data",
    [{"child_run_id": "run_x", "usage": {"tokens": 5}}, {"usage": {"tokens": 5}}],
)
def test_the_end_of_an_unknown_child_is_no_news(data: dict[str, Any]) -> None:
    children = {"run_a": RECORD}
    assert finished(children, Usage(), data) == (children, Usage(), False)


def test_the_end_of_a_child_that_already_ended_is_no_news() -> None:
    ended, usage, _ = finished({"run_a": RECORD}, Usage(), {"child_run_id": "run_a"})
    again = finished(ended, usage, {"child_run_id": "run_a", "usage": {"tokens": 5}})
    assert again == (ended, usage, False)


def test_a_child_record_round_trips_and_an_old_one_reads_with_defaults() -> None:
    assert ChildRecord.from_dict(RECORD.to_dict()) == RECORD
    assert RECORD.to_dict() == {
        "call_id": "c7",
        "turn": 3,
        "task_id": "task_1",
        "agent": "coder",
        "background": True,
        "attempt": 2,
        "status": "live",
        "reserved_tokens": 1000,
        "reserved_cost": 0.1,
        "on_failure": {"policy": "escalate"},
        "verifier": "review",
    }
    assert "verifier" not in ChildRecord.from_dict({"call_id": "c"}).to_dict()
    assert ChildRecord.from_dict({"call_id": 5}) == ChildRecord(
        call_id="5", task_id=None, agent="", background=False, attempt=1
    )


def test_a_finished_child_record_reads_back_finished() -> None:
    ended = ChildRecord(
        call_id="c1", task_id=None, agent="coder", background=False, attempt=1, status="failed"
    )
    assert ChildRecord.from_dict(ended.to_dict()).status == "failed"
    assert not ChildRecord.from_dict(ended.to_dict()).live


# --- the rules of a spawn -------------------------------------------------------------------


def parent(*, depth: int = 0, usage: Usage | None = None, live: int = 0, **budget: Any) -> RunState:
    limits = {
        "max_steps": 50,
        "max_tool_calls": 200,
        "max_tokens": 10_000,
        "max_cost": 1.0,
        "max_wall_seconds": 600.0,
        **budget,
    }
    children = {f"run_{i}": RECORD for i in range(live)}
    children["run_done"] = ChildRecord(
        call_id="c0", task_id=None, agent="x", background=False, attempt=1, status="completed"
    )
    return RunState(
        run_id="run_p",
        options=RunOptions(budget=Budget(**limits), depth=depth),
        usage=usage or Usage(),
        children=children,
    )


def test_live_children_and_what_they_hold() -> None:
    state = parent(live=2)
    assert live_children(state) == ["run_0", "run_1"]
    assert reserved(state, Dimension.TOKENS) == 2000.0
    assert reserved(state, Dimension.COST) == 0.2
    assert reserved(state, Dimension.STEPS) == 0.0


def test_a_child_one_level_too_deep_is_refused_naming_the_setting() -> None:
    check_limits(parent(depth=1), max_depth=2, max_live=4)
    with pytest.raises(SpawnRefused) as err:
        check_limits(parent(depth=2), max_depth=2, max_live=4)
    assert str(err.value) == (
        "agent_spawn refused: a child of this run would be at depth 3, and the maximum depth is "
        "2 ([agents] max_depth in .keel/config.toml); do this part of the work yourself"
    )


def test_one_live_child_too_many_is_refused_naming_them() -> None:
    check_limits(parent(live=1), max_depth=2, max_live=2)
    with pytest.raises(SpawnRefused) as err:
        check_limits(parent(live=2), max_depth=2, max_live=2)
    assert str(err.value) == (
        "agent_spawn refused: this run already has 2 live children (run_0, run_1) and the "
        "maximum is 2 ([agents] max_live_children); collect one with agent_wait first"
    )


def wanted_only(**limits: Any) -> Budget:
    """A wanted budget naming only ``limits`` (the others left to the carving)."""
    return Budget(**{"max_steps": None, "max_tool_calls": None, **limits})


USED = Usage(steps=10, tool_calls=20, tokens=2000, cost=0.2, wall_seconds=100.0)


def test_an_open_budget_gets_the_clocks_left_and_an_equal_share_of_the_free_pools() -> None:
    state = parent(usage=USED, live=1)  # 3 places free of 4
    assert carve_budget(state, None, max_live=4) == Budget(
        max_steps=40,
        max_tool_calls=180,
        max_tokens=math.floor((10_000 - 2000 - 1000) / 3),
        max_cost=(1.0 - 0.2 - 0.1) / 3,
        max_wall_seconds=500.0,
    )


def test_a_full_house_still_shares_among_one_place() -> None:
    state = parent(usage=USED, live=4)
    assert carve_budget(state, None, max_live=4).max_tokens == 10_000 - 2000 - 4000


def test_what_the_child_asks_for_within_what_is_left_is_what_it_gets() -> None:
    wanted = Budget(
        max_steps=5, max_tool_calls=None, max_tokens=700, max_cost=0.05, max_wall_seconds=30.5
    )
    assert carve_budget(parent(usage=USED), wanted, max_live=4) == Budget(
        max_steps=5, max_tool_calls=180, max_tokens=700, max_cost=0.05, max_wall_seconds=30.5
    )


def test_a_child_may_ask_for_exactly_what_is_left() -> None:
    wanted = wanted_only(max_tool_calls=180, max_tokens=7000)
    carved = carve_budget(parent(usage=USED, live=1), wanted, max_live=4)
    assert (carved.max_tool_calls, carved.max_tokens) == (180, 7000)


def test_a_dimension_the_parent_leaves_unlimited_is_what_the_child_asks() -> None:
    wanted = Budget(max_steps=7, max_tool_calls=None)
    state = parent(max_steps=None, max_tool_calls=None, max_tokens=None, max_cost=None)
    assert carve_budget(state, wanted, max_live=4) == Budget(
        max_steps=7, max_tool_calls=None, max_tokens=None, max_cost=None, max_wall_seconds=600.0
    )


@pytest.mark.parametrize(
    ("wanted", "message"),
    [
        (
            wanted_only(max_tokens=8000),
            "the child's tokens budget is 8,000 but this run has 7,000 left (limit 10,000, used "
            "2,000, of which live children hold 1,000)",
        ),
        (
            wanted_only(max_cost=0.9),
            "the child's cost budget is $0.9000 but this run has $0.7000 left (limit $1.0000, "
            "used $0.2000, of which live children hold $0.1000)",
        ),
        (
            wanted_only(max_tool_calls=181),
            "the child's tool calls budget is 181 but this run has 180 left (limit 200, used 20)",
        ),
        (
            wanted_only(max_wall_seconds=501),
            "the child's wall time budget is 501 s but this run has 500 s left (limit 600 s, used "
            "100 s)",
        ),
    ],
)
def test_a_child_asking_for_more_than_is_left_is_refused_with_the_numbers(
    wanted: Budget, message: str
) -> None:
    with pytest.raises(SpawnRefused) as err:
        carve_budget(parent(usage=USED, live=1), wanted, max_live=4)
    assert str(err.value) == (
        f"agent_spawn refused: {message}; spawn a smaller task, or collect a child first"
    )


def test_a_spent_dimension_leaves_nothing_to_give() -> None:
    with pytest.raises(SpawnRefused) as err:
        carve_budget(parent(usage=Usage(steps=50)), None, max_live=4)
    assert str(err.value) == (
        "agent_spawn refused: this run has no steps left to give a child (limit 50, used 50, "
        "held by live children 0)"
    )


def test_a_spent_cost_is_told_in_dollars() -> None:
    state = parent(usage=Usage(cost=0.9), live=1)  # the live child holds the last $0.10
    with pytest.raises(SpawnRefused) as err:
        carve_budget(state, None, max_live=4)
    assert str(err.value) == (
        "agent_spawn refused: this run has no cost left to give a child (limit $1.0000, used "
        "$0.9000, held by live children $0.1000)"
    )


def test_less_than_one_token_each_is_nothing_to_give_but_half_a_second_is_time() -> None:
    state = parent(usage=Usage(tokens=8998, wall_seconds=599.5), live=1)  # 1 token left, 3 places
    with pytest.raises(SpawnRefused) as err:
        carve_budget(state, None, max_live=4)
    assert str(err.value) == (
        "agent_spawn refused: this run has no tokens left to give a child (limit 10,000, used "
        "8,998, held by live children 1,000)"
    )
    state = parent(usage=Usage(wall_seconds=599.5))
    assert carve_budget(state, None, max_live=4).max_wall_seconds == 0.5


def test_a_child_reserves_its_pools_only_where_the_parent_has_a_limit() -> None:
    child = Budget(max_tokens=500, max_cost=0.25)
    assert reservation(child, Budget(max_tokens=1000, max_cost=1.0)) == {
        "tokens": 500,
        "cost": 0.25,
    }
    assert reservation(child, Budget()) == {"tokens": None, "cost": None}


# --- a child's structured result ------------------------------------------------------------

SCHEMA = {
    "type": "object",
    "properties": {f"f{i}": {"type": "integer"} for i in range(7)},
}


def test_a_matching_output_has_no_problems() -> None:
    assert output_problems(SCHEMA, {"f0": 1}) == []


def test_the_first_five_problems_are_told_in_order_of_where_they_are_then_how_many_more() -> None:
    output = {f"f{i}": "x" for i in reversed(range(7))}
    assert output_problems(SCHEMA, output) == [
        *(f"f{i}: 'x' is not of type 'integer'" for i in range(5)),
        "and 2 more",
    ]
    assert output_problems(SCHEMA, {f"f{i}": "x" for i in range(6)})[5:] == ["and 1 more"]
    assert len(output_problems(SCHEMA, {f"f{i}": "x" for i in range(5)})) == 5


def test_a_problem_deep_in_the_output_names_its_path() -> None:
    schema = {"type": "object", "properties": {"items": {"type": "array", "items": SCHEMA}}}
    assert output_problems(schema, {"items": [{}, {"f3": None}]}) == [
        "items/1/f3: None is not of type 'integer'"
    ]


def test_a_problem_with_the_whole_output_says_so_and_a_long_message_is_cut() -> None:
    assert output_problems({"type": "object"}, []) == [
        "(the whole output): [] is not of type 'object'"
    ]
    [long] = output_problems({"type": "object"}, ["y" * 400])
    assert long.startswith("(the whole output): ['yyy")
    assert len(long) == len("(the whole output): ") + 300 and long.endswith("…")
    [short] = output_problems({"type": "object"}, ["y" * 272])  # a message of exactly 300
    assert len(short) == len("(the whole output): ") + 300 and not short.endswith("…")
    [cut] = output_problems({"type": "object"}, ["y" * 273])  # one past it
    assert len(cut) == len("(the whole output): ") + 300 and cut.endswith("…")
