"""People see the tree: `keel runs --tree`, `keel show`, `keel events` of a parent, the live
view's child lines and `keel agents`, against a real SQLite store holding a delegation tree.

The tree is written the way the harness writes one: each child a run created with its
parent's id (queued, depth, root and agent in its options), and the parent's log holding
``subagent_spawned`` / ``subagent_finished`` in the formats of the delegation design.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

from keel.cli.app import app
from keel.cli.live import LiveView
from keel.core.budget import Budget
from keel.core.events import Event, EventType, NewEvent
from keel.core.records import RunOptions
from keel.core.state import RunState, transition
from keel.core.status import RunStatus
from keel.store.base import iter_all_events
from keel.store.sqlite.store import SQLiteStore
from keel.testing.stores import append, legal_step, make_run, model_step, move

KEEL = str(Path(sys.executable).parent / "keel")
TIMEOUT = 60
HOSTILE = "fix \x1b]0;pwned\x07\x1b[31mred\x1b[0m [bold]not markup[/bold]"


@dataclass(frozen=True)
class Printed:
    code: int
    stdout: str
    stderr: str


Keel = Callable[..., Printed]


@pytest.fixture
def keel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Keel:
    """``keel ARGS`` in ``tmp_path`` (default store there). In this process, which keeps
    the file fast; ``test_runs_tree_…`` runs the real command once to show it is the same."""
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    env: dict[str, str | None] = {k: None for k in os.environ if k.startswith("KEEL_")}

    def run(*args: str) -> Printed:
        result = runner.invoke(app, list(args), env={**env, "COLUMNS": "250"})
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            raise result.exception
        return Printed(result.exit_code, result.stdout, result.stderr)

    return run


def real_keel(*args: str, cwd: Path) -> Printed:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KEEL_")}
    result = subprocess.run(
        [KEEL, *args],
        check=False,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env={**env, "COLUMNS": "250"},
    )
    return Printed(result.returncode, result.stdout, result.stderr)


def ok(result: Printed) -> str:
    assert result.code == 0, result
    assert "\x1b" not in result.stdout + result.stderr  # no escape sequence reaches a terminal
    return result.stdout


def agent(name: str) -> dict[str, Any]:
    digest = hashlib.sha256(name.encode()).hexdigest()
    return {"name": name, "digest": digest, "version": 1, "source": f"builtin:{name}"}


# --- a delegation tree, written as the harness writes one ---------------------------------


@dataclass
class Tree:
    """One store holding a parent with four children and a grandchild, and a second
    top-level run that waits for an answer."""

    parent: RunState
    explorer: RunState  # foreground, completed, with a stale patch
    reviewer: RunState  # background, waiting because its own child waits
    grandchild: RunState  # under the reviewer, waiting for an answer
    fixer: RunState  # foreground, failed (its task is hostile text)
    runner: RunState  # background, waiting for approval of run_command
    other: RunState  # top-level, waiting for an answer


class Family:
    def __init__(self, store: SQLiteStore) -> None:
        self.store = store
        self.calls = 0

    def spawn(
        self,
        parent: RunState,
        name: str,
        task: str,
        *,
        background: bool = False,
        budget: Budget | None = None,
    ) -> tuple[RunState, RunState]:
        self.calls += 1
        budget = budget or Budget(max_steps=10, max_tokens=20_000, max_cost=0.5)
        child = self.store.create_run(
            goal=f"You are the {name}.\n\n## Your task\n\n{task}\n\n## Inputs\n\n{{}}",
            workspace="/tmp/workspace",
            options=RunOptions(
                model="scripted:turns.json",
                budget=budget,
                depth=parent.options.depth + 1,
                root_id=parent.options.root_id or parent.run_id,
                agent=agent(name),
                workspace_kind="isolated",
            ),
            parent_id=parent.run_id,
            queued=True,
        )
        spawned = NewEvent(
            type=EventType.SUBAGENT_SPAWNED,
            data={
                "call_id": f"call_{self.calls}",
                "child_run_id": child.run_id,
                "task_id": None,
                "agent": name,
                "agent_digest": agent(name)["digest"],
                "agent_source": f"builtin:{name}",
                "background": background,
                "on_failure": {"policy": "best_effort", "attempts": 1, "agent": None, "then": None},
                "attempt": 1,
                "budget": budget.to_dict(),
                "reserved": {"tokens": budget.max_tokens, "cost": budget.max_cost},
                "workspace": "isolated",
                "base_revision": parent.mutation_revision,
                "base_commit": None,
                "depth": child.options.depth,
                "task": task,
            },
        )
        parent, _ = append(self.store, parent, [spawned])
        child, _ = append(self.store, child, [move(child, RunStatus.RUNNING)])
        return parent, child

    def finish(self, parent: RunState, child: RunState, **data: Any) -> RunState:
        record = parent.children[child.run_id]
        finished = {
            "call_id": record.call_id,
            "child_run_id": child.run_id,
            "task_id": None,
            "agent": record.agent,
            "status": child.status.value,
            "reason": child.reason,
            "summary": (child.result or {}).get("summary"),
            "output": None,
            "evidence": [],
            "patch": None,
            "patch_files": [],
            "stale": [],
            "base_revision": 0,
            "usage": child.usage.to_dict(),
            "policy": "none",
            **data,
        }
        parent, _ = append(
            self.store, parent, [NewEvent(type=EventType.SUBAGENT_FINISHED, data=finished)]
        )
        return parent

    def step(self, run: RunState, tokens: int = 500) -> RunState:
        run, _ = append(
            self.store, run, model_step(input_tokens=tokens, output_tokens=100, cost=0.01)
        )
        return run

    def complete(self, run: RunState, summary: str) -> RunState:
        run, _ = append(self.store, run, [move(run, RunStatus.VERIFYING, "completion requested")])
        result = {"summary": summary, "evidence": []}
        done = transition(run, RunStatus.COMPLETED, "verified", result=result)
        run, _ = append(self.store, run, [done])
        return run


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SQLiteStore]:
    with SQLiteStore(tmp_path / ".keel" / "keel.db") as s:
        yield s


@pytest.fixture
def tree(store: SQLiteStore) -> Tree:
    fam = Family(store)
    parent = make_run(
        store,
        goal="ship the feature",
        options=RunOptions(
            model="scripted:turns.json",
            budget=Budget(max_steps=50, max_tokens=200_000, max_cost=5.0),
        ),
    )
    parent = fam.step(parent)

    parent, explorer = fam.spawn(parent, "explorer", "find the callers of parse()")
    explorer = fam.step(fam.step(explorer))
    explorer = fam.complete(explorer, "parse() has 3 callers: a.py, b.py, c.py")
    parent = fam.finish(
        parent,
        explorer,
        patch="art_" + "c" * 32,
        patch_files=["src/a.py", "src/b.py"],
        stale=["src/a.py"],
    )

    parent, reviewer = fam.spawn(parent, "reviewer", "review the diff", background=True)
    reviewer, grandchild = fam.spawn(reviewer, "explorer", "which tests cover parse()?")
    grandchild, _ = append(store, grandchild, legal_step(grandchild, 8))  # a question
    waiting_on = NewEvent(
        type=EventType.WAITING_ON_CHILD,
        data={
            "call_id": "call_w",
            "child_run_id": grandchild.run_id,
            "what": grandchild.reason,
            "tool": "agent_spawn",
        },
    )
    reviewer, _ = append(store, reviewer, [waiting_on])
    reviewer, _ = append(
        store, reviewer, [move(reviewer, RunStatus.WAITING, f"child_waiting:{grandchild.run_id}")]
    )

    parent, fixer = fam.spawn(parent, "fixer", HOSTILE, budget=Budget(max_steps=1))
    fixer = fam.step(fixer)
    fixer, _ = append(store, fixer, [move(fixer, RunStatus.FAILED, "budget exhausted: steps")])
    parent = fam.finish(parent, fixer, policy="best_effort")

    parent, runner = fam.spawn(parent, "runner", "run the slow tests", background=True)
    runner, _ = append(store, runner, legal_step(runner, 7))  # approval of run_command

    other = make_run(store, goal="another top-level run")
    other, _ = append(store, other, legal_step(other, 8))
    return Tree(
        parent=store.load_run(parent.run_id),
        explorer=explorer,
        reviewer=reviewer,
        grandchild=grandchild,
        fixer=fixer,
        runner=runner,
        other=other,
    )


def line_with(text: str, needle: str) -> str:
    [line] = [ln for ln in text.splitlines() if needle in ln]
    return line


# --- keel runs --tree ----------------------------------------------------------------------


def test_runs_tree_draws_children_under_their_parent_with_agent_status_usage_and_reason(
    keel: Keel, tree: Tree, tmp_path: Path
) -> None:
    out = ok(real_keel("runs", "--tree", cwd=tmp_path))  # the real command, once
    lines = out.splitlines()
    order = [tree.parent, tree.explorer, tree.reviewer, tree.grandchild, tree.fixer, tree.runner]
    rows = [next(i for i, ln in enumerate(lines) if r.run_id in ln) for r in order]
    assert rows == sorted(rows)  # each child after its parent, oldest first

    explorer = line_with(out, tree.explorer.run_id)
    assert f"├─ {tree.explorer.run_id}" in explorer
    assert "completed" in explorer and "explorer" in explorer
    assert " 2 " in explorer and "1200" in explorer and "$0.0200" in explorer  # steps, tokens, cost
    assert "find the callers of parse()" in explorer  # its task, not the spec's instructions
    grandchild = line_with(out, f"│  └─ {tree.grandchild.run_id}")
    assert "waiting" in grandchild and "which tests cover parse()?" in grandchild
    reviewer = line_with(out, f"├─ {tree.reviewer.run_id}")
    assert f"child_waiting:{tree.grandchild.run_id}" in reviewer
    fixer = line_with(out, tree.fixer.run_id)
    assert "budget exhausted: steps" in fixer and "[bold]not markup[/bold]" in fixer
    assert f"└─ {tree.runner.run_id}" in line_with(out, tree.runner.run_id)
    assert f"─ {tree.other.run_id}" not in out  # a top-level run has no branch

    plain = ok(keel("runs"))  # without --tree: every run, flat, as before
    assert "├─" not in plain and tree.grandchild.run_id in plain


def test_runs_tree_json_nests_children_and_status_filters_the_top_level(
    keel: Keel, tree: Tree
) -> None:
    printed = json.loads(ok(keel("runs", "--tree", "--json")))
    assert [r["run_id"] for r in printed] == [tree.other.run_id, tree.parent.run_id]
    parent = printed[1]
    assert parent["depth"] == 0 and parent["agent"] is None
    kids = parent["children"]
    assert [c["run_id"] for c in kids] == [
        tree.explorer.run_id,
        tree.reviewer.run_id,
        tree.fixer.run_id,
        tree.runner.run_id,
    ]
    explorer = kids[0]
    assert explorer["agent"]["name"] == "explorer" and explorer["status"] == "completed"
    assert explorer["usage"]["steps"] == 2 and explorer["usage"]["tokens"] == 1200
    assert explorer["depth"] == 1 and explorer["root_id"] == tree.parent.run_id
    assert explorer["parent_id"] == tree.parent.run_id and explorer["children"] == []
    [grandchild] = kids[1]["children"]
    assert grandchild["run_id"] == tree.grandchild.run_id and grandchild["depth"] == 2
    assert grandchild["root_id"] == tree.parent.run_id and grandchild["status"] == "waiting"

    waiting = json.loads(ok(keel("runs", "--tree", "--status", "waiting", "--json")))
    assert [r["run_id"] for r in waiting] == [tree.other.run_id]  # children are not tops
    running = json.loads(ok(keel("runs", "--tree", "--status", "running", "--json")))
    assert [r["run_id"] for r in running] == [tree.parent.run_id]
    assert len(running[0]["children"]) == 4  # a filtered top keeps all its children
    limited = json.loads(ok(keel("runs", "--tree", "--limit", "1", "--json")))
    assert [r["run_id"] for r in limited] == [tree.other.run_id]


# --- keel show -----------------------------------------------------------------------------


def test_show_parent_lists_children_and_the_waiting_descendants_with_their_commands(
    keel: Keel, tree: Tree
) -> None:
    out = ok(keel("show", tree.parent.run_id))
    children = out[out.index("children") : out.index("waiting descendants")]
    explorer = children[children.index(tree.explorer.run_id) : children.index(tree.reviewer.run_id)]
    for expected in (
        "completed",
        "explorer",
        "foreground",
        "find the callers of parse()",
        "steps 2 / 10",
        "tokens 1200 / 20000",
        "cost $0.0200 / $0.5000",
        "parse() has 3 callers",
        f"art_{'c' * 32} (2 files: src/a.py, src/b.py)",
        "stale     src/a.py",
    ):
        assert expected in explorer, expected
    reviewer = children[children.index(tree.reviewer.run_id) : children.index(tree.fixer.run_id)]
    assert "background" in reviewer and "waiting" in reviewer
    fixer = children[children.index(tree.fixer.run_id) : children.index(tree.runner.run_id)]
    assert "failed" in fixer and "reason    budget exhausted: steps" in fixer
    assert "[bold]not markup[/bold]" in fixer and "steps 1 / 1" in fixer

    waiting = out[out.index("waiting descendants") :]
    assert tree.explorer.run_id not in waiting and tree.fixer.run_id not in waiting
    assert f"its child {tree.grandchild.run_id}" in waiting  # the reviewer waits on its child
    grandchild = waiting[waiting.index(f"{tree.grandchild.run_id}  (") :]
    assert "which file? (0)" in grandchild
    assert f"answer:    keel answer {tree.grandchild.run_id} TEXT" in grandchild
    runner = waiting[waiting.index(f"{tree.runner.run_id}  (") :]
    assert "approval of run_command" in runner
    assert f"approve:   keel approve {tree.runner.run_id}\n" in runner
    assert f"deny:      keel approve {tree.runner.run_id} --deny --reason TEXT" in runner


def test_show_json_has_children_and_waiting_descendants(keel: Keel, tree: Tree) -> None:
    shown = json.loads(ok(keel("show", tree.parent.run_id, "--json")))
    kids = {c["run_id"]: c for c in shown["children"]}
    assert list(kids) == [
        tree.explorer.run_id,
        tree.reviewer.run_id,
        tree.fixer.run_id,
        tree.runner.run_id,
    ]
    explorer = kids[tree.explorer.run_id]
    assert explorer["status"] == "completed" and explorer["background"] is False
    assert explorer["agent"]["name"] == "explorer" and explorer["result_taken"] is True
    assert explorer["patch"] == "art_" + "c" * 32 and explorer["stale"] == ["src/a.py"]
    assert explorer["budget"]["max_steps"] == 10 and explorer["usage"]["steps"] == 2
    assert explorer["task"] == "find the callers of parse()"
    assert kids[tree.runner.run_id]["result_taken"] is False
    assert kids[tree.fixer.run_id]["reason"] == "budget exhausted: steps"
    waiting = {w["run_id"]: w for w in shown["waiting_descendants"]}
    assert list(waiting) == [tree.reviewer.run_id, tree.grandchild.run_id, tree.runner.run_id]
    assert waiting[tree.grandchild.run_id]["commands"] == [
        f"keel answer {tree.grandchild.run_id} TEXT"
    ]
    assert waiting[tree.grandchild.run_id]["pending"]["kind"] == "question"
    assert waiting[tree.grandchild.run_id]["depth"] == 2
    assert waiting[tree.runner.run_id]["commands"] == [
        f"keel approve {tree.runner.run_id}",
        f"keel approve {tree.runner.run_id} --deny --reason TEXT",
    ]
    assert waiting[tree.reviewer.run_id]["commands"] == []  # its child is the one to answer


def test_show_child_names_its_parent_root_depth_and_agent(keel: Keel, tree: Tree) -> None:
    out = ok(keel("show", tree.grandchild.run_id))
    digest = agent("explorer")["digest"]
    assert f"parent     {tree.reviewer.run_id}" in out
    assert f"root       {tree.parent.run_id}   depth 2" in out
    assert f"agent      explorer (sha256 {digest[:12]}, builtin:explorer, v1)" in out
    assert "children" not in out  # it has none
    top = ok(keel("show", tree.other.run_id))
    assert "parent " not in top and "children" not in top and "waiting descendants" not in top


def test_show_of_a_parent_waiting_on_its_child_points_at_the_child(
    keel: Keel, tree: Tree, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path}/.keel/keel.db"
    out = ok(keel("show", tree.reviewer.run_id, "--store", url))
    wait = out[out.index("waiting for") : out.index("waiting descendants")]
    assert f"its child {tree.grandchild.run_id}, which waits for" in wait
    assert f"keel show {tree.grandchild.run_id} --store sqlite:///" in wait
    assert "keel approve" not in wait  # approving the reviewer would answer nothing
    below = out[out.index("waiting descendants") :]
    assert f"keel answer {tree.grandchild.run_id} TEXT --store sqlite:///" in below


# --- keel events ---------------------------------------------------------------------------


def test_events_of_a_parent_show_each_child_on_one_readable_line(
    keel: Keel, tree: Tree, store: SQLiteStore
) -> None:
    out = ok(keel("events", tree.parent.run_id))
    spawned = [ln for ln in out.splitlines() if "subagent_spawned" in ln]
    finished = [ln for ln in out.splitlines() if "subagent_finished" in ln]
    assert len(spawned) == 4 and len(finished) == 2
    assert f"explorer {tree.explorer.run_id} (foreground, isolated): find the callers" in spawned[0]
    assert f"reviewer {tree.reviewer.run_id} (background, isolated): review the diff" in spawned[1]
    assert "[bold]not markup[/bold]" in spawned[2] and "{" not in spawned[2]  # not raw JSON
    assert (
        f"explorer {tree.explorer.run_id} completed: parse() has 3 callers: a.py, b.py, c.py "
        f"(patch art_{'c' * 32}; stale src/a.py)"
    ) in finished[0]
    assert (
        f"fixer {tree.fixer.run_id} failed: budget exhausted: steps (policy best_effort)"
        in (finished[1])
    )
    waits = ok(keel("events", tree.reviewer.run_id))
    assert f"child {tree.grandchild.run_id} waits for" in line_with(waits, "waiting_on_child")

    raw = ok(keel("events", tree.parent.run_id, "--json"))
    assert [json.loads(line) for line in raw.splitlines()] == [
        e.to_dict() for e in iter_all_events(store, tree.parent.run_id)
    ]


# --- the live view of keel run ---------------------------------------------------------------


def screen(view: LiveView) -> str:
    target = Console(width=120, record=True, file=io.StringIO())
    target.print(view.render())
    return target.export_text()


def test_live_view_shows_one_line_per_live_child_and_reads_the_store_only_on_spawn_and_finish(
    store: SQLiteStore,
) -> None:
    queries: list[str] = []

    def child_runs(run_id: str) -> list[RunState]:
        queries.append(run_id)
        return store.child_runs(run_id)

    fam = Family(store)
    parent = make_run(store, goal="watch the children")
    view = LiveView(Console(width=120, file=io.StringIO()), child_runs=child_runs)
    feed(view, store, parent, after=0)

    parent, first = fam.spawn(parent, "explorer", "look around", background=True)
    first = fam.step(fam.step(first))
    seen = feed(view, store, parent, after=1)
    assert [e.type for e in seen] == [EventType.SUBAGENT_SPAWNED] and len(queries) == 1
    line = line_with(screen(view), f"▸ explorer  {first.run_id}")
    assert "running" in line and "step 2" in line and "(background)" in line

    parent = fam.step(parent)  # two events, no spawn or finish: no query
    feed(view, store, parent, after=2)
    assert len(queries) == 1

    parent, second = fam.spawn(parent, "reviewer", "review it")
    feed(view, store, parent, after=4)
    assert len(queries) == 2
    text = screen(view)
    assert f"▸ explorer  {first.run_id}  running" in text
    assert "step 0" in line_with(text, f"▸ reviewer  {second.run_id}  running")

    first = fam.complete(first, "looked")
    parent = fam.finish(parent, first)
    feed(view, store, parent, after=5)
    text = screen(view)
    assert f"▸ explorer  {first.run_id}" not in text  # a finished child has no line …
    assert f"subagent finished: explorer {first.run_id} completed: looked" in text  # … a summary
    assert f"▸ reviewer  {second.run_id}  running" in text

    second, _ = append(store, second, [move(second, RunStatus.CANCELLED, "parent_cancelled")])
    parent = fam.finish(parent, second)
    feed(view, store, parent, after=6)
    assert "children" not in screen(view).split("activity")[0]  # no live child, no panel


def feed(view: LiveView, store: SQLiteStore, run: RunState, *, after: int) -> list[Event]:
    """Give ``view`` the run's events after ``after`` as the harness does: each event with
    the state after it."""
    events = list(iter_all_events(store, run.run_id))[after:]
    state = store.load_run(run.run_id)
    for event in events:
        view.on_event(event, state)
    return events


# --- keel agents ---------------------------------------------------------------------------


def test_agents_list_and_show(keel: Keel, tmp_path: Path) -> None:
    agents = tmp_path / ".keel" / "agents"
    agents.mkdir(parents=True)
    (agents / "fixer.md").write_text(
        "---\ndescription: Fixes one failing test [red]x[/red]\n"
        "tools: [read_file, edit_file]\nmode: edit\nbudget: {steps: 5, cost: 0.25}\n"
        "on_failure: {policy: retry, attempts: 2, agent: explorer, then: escalate}\n"
        "output: {type: object, required: [fixed]}\nversion: 3\n"
        "---\nFix the test.\x1b]0;pwned\x07\n",
        encoding="utf-8",
    )
    listed = ok(keel("agents", "list"))
    digest = hashlib.sha256((agents / "fixer.md").read_bytes()).hexdigest()
    fixer = line_with(listed, "fixer")
    assert f"{agents / 'fixer.md'}" in fixer and " 3 " in fixer and digest[:12] in fixer
    assert "[red]x[/red]" in fixer  # the author's text, escaped
    for builtin in ("explorer", "reviewer"):
        assert f"builtin:{builtin}" in line_with(listed, f"builtin:{builtin}")

    shown = ok(keel("agents", "show", "fixer"))
    for expected in (
        f"fixer  v3  sha256 {digest}",
        "tools        read_file, edit_file",
        "mode         edit",
        "workspace    isolated",
        "budget       steps 5 · cost $0.2500 (tool calls, tokens, wall time: a share",
        "on_failure   retry: up to 2 fresh children as explorer, then escalate",
        '"required": [',
        "Fix the test.",
    ):
        assert expected in shown, expected
    builtin = ok(keel("agents", "show", "reviewer", "--workspace", str(tmp_path)))
    assert "on_failure   escalate" in builtin and "blocking_issues" in builtin


def test_agents_list_shows_an_invalid_spec_with_its_error_and_exits_2(
    keel: Keel, tmp_path: Path
) -> None:
    agents = tmp_path / ".keel" / "agents"
    agents.mkdir(parents=True)
    (agents / "broken.md").write_text(
        "---\ndescription: broken\ntools: [read_file, teleport]\n---\nGo.\n", encoding="utf-8"
    )
    result = keel("agents", "list")
    assert result.code == 2 and "Traceback" not in result.stderr
    broken = line_with(result.stdout, "broken")
    assert "invalid" in broken and f"{agents / 'broken.md'}:3:" in broken and "teleport" in broken
    assert "explorer" in result.stdout  # the others are still listed
    assert "1 invalid agent spec file(s)" in result.stderr

    unknown = keel("agents", "show", "nobody")
    assert unknown.code == 2 and "no agent named 'nobody'" in unknown.stderr
    refused = keel("agents", "show", "broken")
    assert refused.code == 2 and f"{agents / 'broken.md'}:3:" in refused.stderr
