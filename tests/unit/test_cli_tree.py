"""The pieces `keel runs --tree`, `keel show`, `keel events` and the live view build the
tree from: the walk, the drawing, what a waiting run waits for, the one-line child
events, and the live view's child lines and its store reads."""

from __future__ import annotations

import io
from datetime import UTC, datetime
from typing import Any

from rich.console import Console

from keel.cli.agents import budget_words, failure_words
from keel.cli.live import LiveView
from keel.cli.tree import (
    RunNode,
    build_tree,
    child_facts,
    finish_summary,
    spawn_summary,
    task_of,
    tree_json,
    tree_table,
    wait_facts,
    waiting_descendants,
)
from keel.core.agent_spec import AgentSpec, FailurePolicy, OnFailure
from keel.core.budget import Budget, Usage
from keel.core.children import ChildRecord
from keel.core.errors import LogDamaged, StoreError
from keel.core.events import Event, EventType
from keel.core.records import PendingRequest, RunOptions
from keel.core.state import RunState
from keel.core.status import RunStatus


def run(run_id: str, parent: str | None = None, **fields: Any) -> RunState:
    depth = fields.pop("depth", 0 if parent is None else 1)
    options = RunOptions(depth=depth, agent={"name": fields.pop("agent", "explorer")})
    return RunState(run_id=run_id, parent_id=parent, options=options, **fields)


class Children:
    """``Store.child_runs`` over a dict, counting its calls; ``broken`` ids raise
    ``LogDamaged`` as a store does for a child whose log is damaged."""

    def __init__(self, runs: list[RunState], broken: frozenset[str] = frozenset()) -> None:
        self.runs = runs
        self.broken = broken
        self.calls = 0

    def child_runs(self, run_id: str) -> list[RunState]:
        self.calls += 1
        if run_id in self.broken:
            raise LogDamaged(f"{run_id}_child", 3, "hash mismatch")
        return [r for r in self.runs if r.parent_id == run_id]


def event(kind: EventType, seq: int, run_id: str = "run_p", **data: Any) -> Event:
    return Event(
        run_id=run_id,
        seq=seq,
        event_id=f"e{seq}",
        type=kind,
        recorded_at=datetime(2026, 1, 1, tzinfo=UTC),
        data=data,
    )


# --- the walk and the drawing ------------------------------------------------------------------


def test_build_tree_walks_every_level_once_and_stops_at_the_depth_limit() -> None:
    runs = [
        run("run_p"),
        run("run_a", "run_p"),
        run("run_b", "run_p", status=RunStatus.WAITING),
        run("run_b1", "run_b", depth=2, status=RunStatus.WAITING),
        run("run_b1x", "run_b1", depth=3),
        run("run_p", "run_b1x", depth=4),  # a link back to the top: never walked twice
    ]
    store = Children(runs)
    node = build_tree(store, runs[0])
    assert [c.state.run_id for c in node.children] == ["run_a", "run_b"]
    assert node.children[1].children[0].children[0].children == ()
    assert [s.run_id for s in waiting_descendants(node)] == ["run_b", "run_b1"]

    shallow = build_tree(store, runs[0], max_depth=1)
    assert [c.children for c in shallow.children] == [(), ()]


def test_a_damaged_child_log_leaves_its_parents_children_unread_and_says_why() -> None:
    store = Children([run("run_p"), run("run_a", "run_p")], broken=frozenset({"run_p"}))
    node = build_tree(store, run("run_p"))
    assert node.children == () and node.damage is not None and "seq 3" in node.damage
    assert tree_json(node)["children_damaged"] == node.damage


def test_tree_table_draws_branches_for_the_last_and_the_other_children() -> None:
    tree = RunNode(
        run("run_p"),
        (
            RunNode(run("run_a", "run_p"), (RunNode(run("run_a1", "run_a", depth=2)),)),
            RunNode(run("run_b", "run_p"), (RunNode(run("run_b1", "run_b", depth=2)),)),
        ),
    )
    target = Console(width=200, record=True, file=io.StringIO())
    target.print(tree_table([tree, LogDamaged("run_x", 4, "gap")]))
    text = target.export_text()
    rows = [line.split()[0:2] for line in text.splitlines()[1:]]
    assert rows == [
        ["run_p", "running"],
        ["├─", "run_a"],
        ["│", "└─"],
        ["└─", "run_b"],
        ["└─", "run_b1"],
        ["run_x", "damaged"],
    ]
    assert "│  └─ run_a1" in text and "   └─ run_b1" in text


def test_task_of_a_child_is_its_task_without_the_spec_around_it() -> None:
    goal = "You are an explorer.\n\n## Your task\n\nfind parse()\nand its callers\n\n## Inputs\n{}"
    assert task_of(run("run_c", "run_p", goal=goal)) == "find parse()\nand its callers"
    assert task_of(run("run_c", "run_p", goal="no heading here")) == "no heading here"
    top = "## Your task\n\nnot cut: a top-level goal is shown whole"
    assert task_of(RunState(run_id="run_p", goal=top)) == top
    # ... unless the run follows an agent spec, which wrapped it (keel run --agent)
    assert task_of(run("run_p", goal=top)) == "not cut: a top-level goal is shown whole"


# --- what a waiting run waits for ---------------------------------------------------------------


def waiting(kind: str | None, **pending: Any) -> RunState:
    request = None if kind is None else PendingRequest(kind=kind, call_id="c1", **pending)
    return run("run_w", "run_p", status=RunStatus.WAITING, pending=request, reason="why")


def test_wait_facts_name_the_command_that_answers_each_kind_of_wait() -> None:
    flag = " --store sqlite:///x.db"
    approve = f"keel approve run_w{flag}"
    deny = f"keel approve run_w --deny --reason TEXT{flag}"
    answer = f"keel answer run_w TEXT{flag}"
    cases = {
        "question": (waiting("question", question="which?"), "the answer to: which?", [answer]),
        "approval": (
            waiting("approval", tool="run_command"),
            "approval of run_command (call c1)",
            [approve, deny],
        ),
        "plan": (waiting("plan"), "approval of the plan (plan_exit, call c1)", [approve, deny]),
        "unknown": (
            waiting("unknown_outcome", tool="write_file"),
            "a decision on the interrupted call to write_file (call c1)",
            [approve, deny],
        ),
        "child": (
            waiting("child", arguments={"child_run_id": "run_g", "what": "approval of x"}),
            "its child run_g, which waits for approval of x",
            [],
        ),
        "failure": (
            waiting(
                "child_failure",
                arguments={"child_run_id": "run_g", "agent": "fixer", "reason": "boom"},
            ),
            "a decision on its failed child run_g (fixer, failed: boom)",
            [approve, deny, answer],
        ),
        "none": (waiting(None), "why", [approve, deny]),
    }
    for name, (state, words, commands) in cases.items():
        what, pairs = wait_facts(state, flag)
        assert (what, [command for _, command in pairs]) == (words, commands), name
    assert [label for label, _ in wait_facts(cases["failure"][0])[1]] == [
        "retry",
        "give up",
        "instruct",
    ]


# --- a parent's log: the facts of each child, and one line per event -----------------------------


def test_child_facts_keep_the_latest_spawn_and_the_finish_of_each_child() -> None:
    events = [
        event(EventType.SUBAGENT_SPAWNED, 1, child_run_id="run_a", attempt=1),
        event(EventType.NOTE_ADDED, 2, text="unrelated"),
        event(EventType.SUBAGENT_SPAWNED, 3, child_run_id="run_b", attempt=1),
        event(EventType.SUBAGENT_FINISHED, 4, child_run_id="run_a", status="completed"),
    ]
    facts = child_facts(events)
    assert set(facts) == {"run_a", "run_b"}
    assert facts["run_a"]["finished"] == {"child_run_id": "run_a", "status": "completed"}
    assert facts["run_b"] == {"spawned": {"child_run_id": "run_b", "attempt": 1}, "finished": None}


def test_subagent_events_read_as_one_line() -> None:
    task = "look at\nevery   file " + "x" * 200
    spawned = spawn_summary(
        {
            "agent": "explorer",
            "child_run_id": "run_a",
            "background": True,
            "attempt": 2,
            "task": task,
        }
    )
    assert spawned.startswith("explorer run_a (background, attempt 2): look at every file x")
    assert "\n" not in spawned and spawned.endswith("…") and len(spawned) < 120
    done = {"agent": "explorer", "child_run_id": "run_a", "status": "completed", "summary": "ok"}
    assert finish_summary({**done, "policy": "none"}) == "explorer run_a completed: ok"
    failed = {**done, "status": "failed", "summary": None, "reason": "budget exhausted: steps"}
    assert finish_summary({**failed, "policy": "retry", "retried_as": "run_b"}) == (
        "explorer run_a failed: budget exhausted: steps (policy retry; retried as run_b)"
    )


# --- the live view -------------------------------------------------------------------------------


def screen(view: LiveView) -> str:
    target = Console(width=120, record=True, file=io.StringIO())
    target.print(view.render())
    return target.export_text()


def parent_with(**children: ChildRecord) -> RunState:
    return RunState(run_id="run_p", children=dict(children))


def record(agent: str, status: str = "live", background: bool = False) -> ChildRecord:
    return ChildRecord(
        call_id="c", task_id=None, agent=agent, background=background, attempt=1, status=status
    )


def test_live_view_reads_children_only_when_a_child_is_spawned_or_finishes() -> None:
    store = Children([run("run_a", "run_p", usage=Usage(steps=3), status=RunStatus.RUNNING)])
    view = LiveView(Console(file=io.StringIO()), child_runs=store.child_runs)
    view.on_event(event(EventType.RUN_CREATED, 1, goal="g"), parent_with())
    view.on_event(event(EventType.NOTE_ADDED, 2, text="hi"), parent_with())
    assert store.calls == 0 and "children" not in screen(view)

    spawned = parent_with(run_a=record("explorer", background=True))
    view.on_event(event(EventType.SUBAGENT_SPAWNED, 3, child_run_id="run_a"), spawned)
    assert store.calls == 1
    assert "▸ explorer  run_a  running  step 3  (background)" in screen(view)
    for seq in range(4, 20):
        view.on_event(event(EventType.NOTE_ADDED, seq, text="busy"), spawned)
    assert store.calls == 1

    # a child's own event passed to the same view updates its line, without a read
    own = run("run_a", "run_p", usage=Usage(steps=7), status=RunStatus.VERIFYING)
    view.on_event(event(EventType.MODEL_RESPONDED, 5, run_id="run_a"), own)
    assert store.calls == 1 and "▸ explorer  run_a  verifying  step 7" in screen(view)
    assert "#5" not in screen(view)  # nor is it the parent's activity

    waits = event(EventType.WAITING_ON_CHILD, 20, child_run_id="run_a", what="approval")
    view.on_event(waits, spawned)
    assert store.calls == 1 and "▸ explorer  run_a  waiting  step 7" in screen(view)

    ended = parent_with(run_a=record("explorer", status="completed"))
    view.on_event(event(EventType.SUBAGENT_FINISHED, 21, child_run_id="run_a"), ended)
    assert store.calls == 2 and "▸" not in screen(view)


def test_live_view_meeting_a_parent_with_live_children_reads_them_once_and_survives_errors() -> (
    None
):
    class Broken:
        calls = 0

        def child_runs(self, run_id: str) -> list[RunState]:
            self.calls += 1
            raise StoreError("database is locked")

    broken = Broken()
    view = LiveView(Console(file=io.StringIO()), run_id="run_p", child_runs=broken.child_runs)
    resumed = parent_with(run_a=record("reviewer"), run_b=record("fixer", status="failed"))
    view.on_event(event(EventType.RUN_RESUMED, 9), resumed)
    view.on_event(event(EventType.NOTE_ADDED, 10, text="x"), resumed)
    assert broken.calls == 1
    text = screen(view)
    assert "▸ reviewer  run_a  queued" in text and "run_b" not in text


# --- keel agents show: budget and failure words ---------------------------------------------------


def test_agent_budget_and_failure_policy_words() -> None:
    spec = AgentSpec(
        name="fixer",
        description="d",
        instructions="i",
        budget=Budget(max_steps=5, max_tool_calls=None, max_tokens=None, max_cost=0.25),
        digest="0" * 64,
        source="builtin:fixer",
    )
    assert budget_words(spec) == (
        "steps 5 · cost $0.2500 (tool calls, tokens, wall time: a share of what the parent "
        "has left)"
    )
    retry = OnFailure(policy=FailurePolicy.RETRY, attempts=3, then=FailurePolicy.ESCALATE)
    assert failure_words(retry) == "retry: up to 3 fresh children, then escalate"
    assert failure_words(OnFailure(policy=FailurePolicy.BEST_EFFORT)) == "best_effort"
