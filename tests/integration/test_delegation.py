"""Delegation end to end on a real SQLite store: spawns in the foreground and background,
the contract a child gets (tools, mode, budget, depth, live children), structured results,
failure policies, escalation, handoff. Parent and children are scripted models (their
decisions only); the harness, store, tasks and tools are the real ones.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from keel.core.budget import Budget
from keel.core.events import Event, EventType
from keel.core.state import RunState
from keel.core.status import RunStatus
from keel.core.tasks import TaskStatus
from keel.runtime.harness import Harness
from keel.testing.agents import RelayModel, write_agent
from keel.tools.builtin import default_registry
from keel.tools.registry import ToolRegistry

ANSWER_SCHEMA = {
    "type": "object",
    "required": ["answer"],
    "additionalProperties": False,
    "properties": {"answer": {"type": "string", "minLength": 1}},
}


def read_then_answer(answer: str = "hello", *, usage: int = 0) -> list[dict[str, Any]]:
    turn_usage = {"input_tokens": usage, "output_tokens": usage} if usage else None
    first: dict[str, Any] = {"tool_calls": [{"name": "read_file", "arguments": {"path": "a.txt"}}]}
    last: dict[str, Any] = {
        "tool_calls": [
            {
                "name": "request_completion",
                "arguments": {"summary": f"found {answer}", "output": {"answer": answer}},
            }
        ]
    }
    if turn_usage:
        first["usage"] = turn_usage
        last["usage"] = turn_usage
    return [first, last]


def spawn(agent: str, task: str, **more: Any) -> dict[str, Any]:
    return {"name": "agent_spawn", "arguments": {"agent": agent, "task": task, **more}}


def complete(summary: str = "done") -> dict[str, Any]:
    return {"tool_calls": [{"name": "request_completion", "arguments": {"summary": summary}}]}


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    (root / "a.txt").write_text("hello world\n")
    subprocess.run(["git", "-C", str(root), "add", "a.txt"], check=True)
    subprocess.run(
        ["git", "-C", str(root), "-c", "user.email=t@e", "-c", "user.name=t", "commit", "-qm", "i"],
        check=True,
    )
    return root


def harness(tmp_path: Path, turns: list[dict[str, Any]], **kw: Any) -> tuple[Harness, RelayModel]:
    model = RelayModel(turns)
    h = Harness(store=f"sqlite:///{tmp_path / 'keel.db'}", model=model, **kw)
    return h, model


def events_of(h: Harness, run_id: str, kind: EventType) -> list[Event]:
    return [e for e in h.events(run_id) if e.type is kind]


def tool_result(h: Harness, run_id: str, call_id: str) -> Event:
    for event in h.events(run_id):
        if event.type in (EventType.TOOL_FINISHED, EventType.TOOL_FAILED) and (
            event.data.get("call_id") == call_id
        ):
            return event
    raise AssertionError(f"no result for {call_id}")


# --- foreground and background -------------------------------------------------------------


def test_foreground_child_result_is_the_tool_result(tmp_path: Path, ws: Path) -> None:
    spec_file = write_agent(
        ws,
        "finder",
        script=read_then_answer("hello"),
        tools=["read_file", "grep"],
        workspace_kind="shared-readonly",
        output=ANSWER_SCHEMA,
        budget={"steps": 5},
    )
    h, _ = harness(
        tmp_path, [{"tool_calls": [spawn("finder", "what does a.txt say?")]}, complete()]
    )
    with h:
        out = h.run("delegate", cwd=ws, budget=Budget(max_steps=10))
        assert out.status is RunStatus.COMPLETED
        spawned = events_of(h, out.id, EventType.SUBAGENT_SPAWNED)
        finished = events_of(h, out.id, EventType.SUBAGENT_FINISHED)
        assert len(spawned) == 1 and len(finished) == 1
        child_id = spawned[0].data["child_run_id"]
        # the spawn is on record before the call's result, with the spec's digest
        result = tool_result(h, out.id, "call_0_0")
        assert spawned[0].seq < result.seq < finished[0].seq or finished[0].seq == result.seq + 1
        assert spawned[0].data["agent_digest"] == hashlib.sha256(spec_file.read_bytes()).hexdigest()
        observation = json.loads(result.data["output"])
        assert observation["status"] == "completed"
        assert observation["output"] == {"answer": "hello"}
        assert observation["base_revision"] == 0
        child = h.get(child_id)
        assert child.parent_id == out.id
        assert child.options.depth == 1 and child.options.root_id == out.id
        assert child.options.agent is not None and child.options.agent["name"] == "finder"
        # a child does not inherit the transcript: its goal is its task and the instructions
        assert "what does a.txt say?" in child.goal and "delegate" not in child.goal
        task = h.store.get_task(spawned[0].data["task_id"])
        assert task.status is TaskStatus.COMPLETED and task.run_id == child_id


def test_background_children_are_collected_with_agent_wait(tmp_path: Path, ws: Path) -> None:
    write_agent(
        ws,
        "finder",
        script=read_then_answer("hello", usage=100),
        tools=["read_file"],
        workspace_kind="shared-readonly",
        output=ANSWER_SCHEMA,
    )
    turns = [
        {
            "tool_calls": [
                spawn("finder", "first", background=True),
                spawn("finder", "second", background=True),
            ],
            "usage": {"input_tokens": 10, "output_tokens": 5},
        },
        {"tool_calls": [{"name": "agent_wait", "arguments": {"ids": ["{task0}", "{task1}"]}}]},
        complete(),
    ]
    h, _ = harness(tmp_path, turns, child_slots=2)
    with h:
        out = h.run("delegate twice", cwd=ws, budget=Budget(max_steps=10, max_tokens=100_000))
        assert out.status is RunStatus.COMPLETED, out.stop_reason
        started = json.loads(tool_result(h, out.id, "call_0_0").data["output"])
        assert started["status"] == "started" and started["task_id"].startswith("task_")
        waited = json.loads(tool_result(h, out.id, "call_1_0").data["output"])
        assert [r["status"] for r in waited["results"]] == ["completed", "completed"]
        finished = events_of(h, out.id, EventType.SUBAGENT_FINISHED)
        assert sorted(e.data["child_run_id"] for e in finished) == sorted(
            c.run_id for c in h.store.child_runs(out.id)
        )
        # each child used 2 turns x 200 tokens: they count toward the parent's tokens
        assert out.state.usage.tokens == 15 + 2 * 400
        assert out.state.children and not any(r.live for r in out.state.children.values())


def test_background_child_ending_is_noticed_between_steps(tmp_path: Path, ws: Path) -> None:
    write_agent(ws, "finder", script=read_then_answer(), tools=["read_file"], output=ANSWER_SCHEMA)
    turns = [
        {"tool_calls": [spawn("finder", "look", background=True)]},
        {"tool_calls": [{"name": "agent_result", "arguments": {"id": "{child0}"}}]},
        complete(),
    ]
    h, _ = harness(tmp_path, turns, child_slots=0)  # no slot: agent_result never waits
    with h:
        out = h.run("delegate", cwd=ws)
        # with no slot the child was never run, so agent_result shows it queued; the run's
        # end then cancels it (its parent ended) and records that on the parent
        shown = json.loads(tool_result(h, out.id, "call_1_0").data["output"])
        assert shown["status"] == "queued"
        assert out.status is RunStatus.COMPLETED
        child = h.store.child_runs(out.id)[0]
        assert child.status is RunStatus.CANCELLED and child.reason == "parent_ended:completed"
        finished = events_of(h, out.id, EventType.SUBAGENT_FINISHED)
        assert [e.data["status"] for e in finished] == ["cancelled"]


# --- the contract -----------------------------------------------------------------------------


def test_child_gets_neither_a_tool_nor_a_mode_the_parent_lacks(tmp_path: Path, ws: Path) -> None:
    write_agent(
        ws,
        "greedy",
        script=[complete("nothing")],
        tools=["read_file", "write_file", "run_command"],
        mode="auto",
        workspace_kind="shared",
    )
    registry = ToolRegistry(t for t in default_registry() if t.name != "run_command")
    h, _ = harness(tmp_path, [{"tool_calls": [spawn("greedy", "try")]}, complete()], tools=registry)
    with h:
        out = h.run("delegate", cwd=ws, mode="ask")
        child = h.store.child_runs(out.id)[0]
        assert child.options.tools is not None
        assert "run_command" not in child.options.tools  # the parent has no run_command
        assert {"read_file", "write_file", "request_completion"} <= set(child.options.tools)
        assert child.mode == "ask"  # never more permissive than the parent (ask < auto)


def test_a_spawn_whose_budget_does_not_fit_is_refused_with_the_numbers(
    tmp_path: Path, ws: Path
) -> None:
    write_agent(ws, "big", script=[complete()], budget={"tokens": 5000})
    h, _ = harness(tmp_path, [{"tool_calls": [spawn("big", "x")]}, complete()])
    with h:
        out = h.run("delegate", cwd=ws, budget=Budget(max_tokens=1000))
        refused = tool_result(h, out.id, "call_0_0")
        assert refused.type is EventType.TOOL_FAILED
        assert "5,000" in refused.data["message"] and "1,000" in refused.data["message"]
        assert h.store.child_runs(out.id) == []  # nothing spawned


def test_unset_pools_are_shared_among_free_child_places(tmp_path: Path, ws: Path) -> None:
    write_agent(ws, "open", script=[complete()])
    h, _ = harness(
        tmp_path,
        [{"tool_calls": [spawn("open", "a", background=True)]}, complete()],
        child_slots=0,
    )
    with h:
        out = h.run("delegate", cwd=ws, budget=Budget(max_tokens=8000, max_steps=10))
        child = h.store.child_runs(out.id)[0]
        assert child.options.budget.max_tokens == 2000  # 8000 / 4 free places
        assert child.options.budget.max_steps == 9  # the parent's remainder (a clock)


def test_live_children_and_depth_limits_hold(tmp_path: Path, ws: Path) -> None:
    (ws / ".keel").mkdir(exist_ok=True)
    (ws / ".keel" / "config.toml").write_text("[agents]\nmax_live_children = 1\nmax_depth = 1\n")
    write_agent(ws, "leaf", script=[{"tool_calls": [spawn("leaf", "deeper")]}, complete()])
    turns = [
        {"tool_calls": [spawn("leaf", "a", background=True), spawn("leaf", "b", background=True)]},
        complete(),
    ]
    h, _ = harness(tmp_path, turns, child_slots=0)
    with h:
        out = h.run("delegate", cwd=ws)
        second = tool_result(h, out.id, "call_0_1")
        assert second.type is EventType.TOOL_FAILED
        assert "maximum is 1" in second.data["message"]
        child = h.store.child_runs(out.id)[0]
        assert child.options.tools is not None and "agent_spawn" not in child.options.tools


def test_depth_limit_refuses_a_grandchild(tmp_path: Path, ws: Path) -> None:
    (ws / ".keel" / "config.toml").parent.mkdir(exist_ok=True)
    (ws / ".keel" / "config.toml").write_text("[agents]\nmax_depth = 2\n")
    write_agent(ws, "grand", script=[complete("grandchild done")])
    write_agent(ws, "mid", script=[{"tool_calls": [spawn("grand", "go deeper")]}, complete("mid")])
    h, _ = harness(tmp_path, [{"tool_calls": [spawn("mid", "go")]}, complete()])
    with h:
        out = h.run("delegate", cwd=ws)
        assert out.status is RunStatus.COMPLETED
        mid = h.store.child_runs(out.id)[0]
        grand = h.store.child_runs(mid.run_id)[0]
        assert grand.options.depth == 2 and grand.options.root_id == out.id
        assert grand.options.tools is not None and "agent_spawn" not in grand.options.tools


# --- structured results ------------------------------------------------------------------------


def test_invalid_output_is_sent_back_and_then_reported(tmp_path: Path, ws: Path) -> None:
    bad = {
        "tool_calls": [
            {"name": "request_completion", "arguments": {"summary": "s", "output": {"answer": 3}}}
        ]
    }
    write_agent(
        ws,
        "sloppy",
        script=[bad, *read_then_answer("fixed")[1:]],
        output=ANSWER_SCHEMA,
        tools=["read_file"],
    )
    write_agent(ws, "hopeless", script=[bad, bad], output=ANSWER_SCHEMA, budget={"steps": 2})
    turns = [
        {"tool_calls": [spawn("sloppy", "answer")]},
        {"tool_calls": [spawn("hopeless", "answer", on_failure="best_effort")]},
        complete(),
    ]
    h, _ = harness(tmp_path, turns)
    with h:
        out = h.run("delegate", cwd=ws)
        sloppy, hopeless = h.store.child_runs(out.id)
        told = [e for e in h.events(sloppy.run_id) if e.type is EventType.TOOL_FAILED]
        assert told and told[0].data["error_kind"] == "invalid_output"
        assert "answer: 3 is not of type 'string'" in told[0].data["message"]
        assert sloppy.status is RunStatus.COMPLETED
        assert sloppy.result is not None and sloppy.result["output"] == {"answer": "fixed"}
        assert hopeless.status is RunStatus.FAILED
        assert hopeless.reason == "budget_exhausted:steps"
        reported = json.loads(tool_result(h, out.id, "call_1_0").data["output"])
        assert reported["status"] == "failed" and reported["policy"] == "best_effort"
        assert out.status is RunStatus.COMPLETED


# --- failure policies ----------------------------------------------------------------------------

FAILING = [{"tool_calls": [{"name": "read_file", "arguments": {"path": "missing.txt"}}]}] * 3


def test_fail_fast_fails_the_parent_and_cancels_its_siblings(tmp_path: Path, ws: Path) -> None:
    write_agent(ws, "breaks", script=FAILING, budget={"steps": 1}, on_failure="fail_fast")
    write_agent(ws, "slow", script=read_then_answer(), tools=["read_file"], output=ANSWER_SCHEMA)
    turns = [
        {"tool_calls": [spawn("slow", "wait your turn", background=True)]},
        {"tool_calls": [spawn("breaks", "fail")]},
        complete(),
    ]
    h, _ = harness(tmp_path, turns, child_slots=0)  # the sibling stays queued
    with h:
        out = h.run("delegate", cwd=ws)
        slow, breaks = h.store.child_runs(out.id)
        assert out.status is RunStatus.FAILED
        assert out.stop_reason == f"child_failed:{breaks.run_id}"
        assert h.get(slow.run_id).status is RunStatus.CANCELLED
        assert h.get(slow.run_id).reason == "parent_ended:failed"


def test_retry_spawns_a_fresh_child_of_another_spec(tmp_path: Path, ws: Path) -> None:
    write_agent(ws, "steady", script=read_then_answer("steady"), output=ANSWER_SCHEMA)
    write_agent(
        ws,
        "flaky",
        script=FAILING,
        budget={"steps": 1},
        on_failure={"policy": "retry", "attempts": 2, "agent": "steady", "then": "best_effort"},
    )
    h, _ = harness(tmp_path, [{"tool_calls": [spawn("flaky", "do it")]}, complete()])
    with h:
        out = h.run("delegate", cwd=ws)
        first, second = h.store.child_runs(out.id)
        assert first.status is RunStatus.FAILED
        assert second.status is RunStatus.COMPLETED and second.options.agent is not None
        assert second.options.agent["name"] == "steady"
        got = tool_result(h, out.id, "call_0_0").data
        assert "output" in got, got.get("message")
        result = json.loads(got["output"])
        assert result["status"] == "completed" and result["output"] == {"answer": "steady"}
        finished = events_of(h, out.id, EventType.SUBAGENT_FINISHED)
        assert [e.data["policy"] for e in finished] == ["retry", "none"]
        assert finished[0].data["retried_as"] == second.run_id
        assert out.status is RunStatus.COMPLETED


def escalating(ws: Path) -> None:
    write_agent(ws, "fragile", script=FAILING, budget={"steps": 1}, on_failure="escalate")


def test_escalate_waits_and_approve_retries(tmp_path: Path, ws: Path) -> None:
    escalating(ws)
    turns = [
        {"tool_calls": [spawn("fragile", "try")]},
        {"tool_calls": [{"name": "agent_wait", "arguments": {"ids": ["{task0}"]}}]},
        complete(),
    ]
    h, _ = harness(tmp_path, turns)
    with h:
        out = h.run("delegate", cwd=ws)
        first = h.store.child_runs(out.id)[0]
        assert out.status is RunStatus.WAITING
        assert out.stop_reason == f"child_failure:{first.run_id}"
        assert out.state.pending is not None and out.state.pending.kind == "child_failure"
        h.approve(out.id)
        again = h.resume(out.id)
        runs = h.store.child_runs(out.id)
        assert len(runs) == 2  # the person's retry made a fresh child
        assert runs[1].goal == first.goal
        # the retry failed too (same script): a person is asked again
        assert again.status is RunStatus.WAITING
        assert again.stop_reason == f"child_failure:{runs[1].run_id}"


def test_escalate_deny_gives_up_and_fails_the_run(tmp_path: Path, ws: Path) -> None:
    escalating(ws)
    h, _ = harness(tmp_path, [{"tool_calls": [spawn("fragile", "try")]}, complete()])
    with h:
        out = h.run("delegate", cwd=ws)
        child = h.store.child_runs(out.id)[0]
        h.approve(out.id, deny=True, reason="not worth it")
        ended = h.resume(out.id)
        assert ended.status is RunStatus.FAILED
        assert ended.stop_reason == f"child_failed:{child.run_id}"
        assert ended.state.result is not None and ended.state.result["why"] == "not worth it"


def test_escalate_answer_instructs_the_parent(tmp_path: Path, ws: Path) -> None:
    escalating(ws)
    h, model = harness(tmp_path, [{"tool_calls": [spawn("fragile", "try")]}, complete()])
    with h:
        out = h.run("delegate", cwd=ws)
        h.answer(out.id, "skip that part and finish")
        ended = h.resume(out.id)
        assert ended.status is RunStatus.COMPLETED
        seen = "\n".join(m.content or "" for m in model.requests[-1].messages)
        assert "skip that part and finish" in seen


def test_a_child_waiting_for_a_person_makes_its_parent_wait(tmp_path: Path, ws: Path) -> None:
    write_agent(
        ws,
        "asker",
        script=[
            {"tool_calls": [{"name": "ask_user", "arguments": {"question": "which file?"}}]},
            complete("asked and done"),
        ],
        tools=["ask_user"],
    )
    turns = [
        {"tool_calls": [spawn("asker", "ask")]},
        {"tool_calls": [{"name": "agent_wait", "arguments": {"ids": ["{child0}"]}}]},
        complete(),
    ]
    h, _ = harness(tmp_path, turns)
    with h:
        out = h.run("delegate", cwd=ws)
        child = h.store.child_runs(out.id)[0]
        assert child.status is RunStatus.WAITING
        assert out.status is RunStatus.WAITING
        assert out.stop_reason == f"child_waiting:{child.run_id}"
        # the parent stays waiting while the child does
        assert h.resume(out.id).status is RunStatus.WAITING
        h.answer(child.run_id, "a.txt")  # answered on the child's own id
        ended = h.resume(out.id)
        assert ended.status is RunStatus.COMPLETED, ended.stop_reason
        assert h.get(child.run_id).status is RunStatus.COMPLETED
        waited = json.loads(tool_result(h, out.id, "call_1_0").data["output"])
        assert waited["results"][0]["summary"] == "asked and done"


# --- handoff ------------------------------------------------------------------------------


def test_handoff_completes_the_run_and_the_new_one_takes_over(tmp_path: Path, ws: Path) -> None:
    write_agent(ws, "closer", script=[complete("closed it")], body="Finish what was started.")
    turns = [
        {
            "tool_calls": [
                {
                    "name": "todo_write",
                    "arguments": {"todos": [{"content": "ship it", "status": "pending"}]},
                }
            ]
        },
        {"tool_calls": [{"name": "handoff", "arguments": {"agent": "closer", "note": "ship"}}]},
    ]
    h, _ = harness(tmp_path, turns)
    with h:
        out = h.run("release the thing", cwd=ws, budget=Budget(max_steps=10))
        first_run = next(r for r in h.store.list_runs() if r.run_id != out.id)
        handed = [e for e in h.events(first_run.run_id) if e.type is EventType.HANDED_OFF]
        assert len(handed) == 1
        target = handed[0].data["run_id"]
        assert out.id == target and out.status is RunStatus.COMPLETED
        assert first_run.status is RunStatus.COMPLETED
        assert first_run.result is not None and first_run.result["outcome"] == "handed_off"
        assert first_run.result["handed_off_to"] == target
        new = h.get(target)
        assert "release the thing" in new.goal and "ship it" in new.goal
        assert new.options.budget.max_steps == 10 - first_run.usage.steps
        notes = [e for e in h.events(target) if e.type is EventType.NOTE_ADDED]
        assert notes and first_run.run_id in notes[0].data["text"]


def _state(h: Harness, run_id: str) -> RunState:
    return h.get(run_id)


# --- isolated workspaces ------------------------------------------------------------------------

EDITOR = [
    {
        "tool_calls": [
            {"name": "write_file", "arguments": {"path": "a.txt", "content": "hello child\n"}},
            {"name": "write_file", "arguments": {"path": "b.txt", "content": "new\n"}},
        ]
    },
    complete("edited a.txt, added b.txt"),
]


def test_isolated_child_returns_a_patch_the_parent_applies(tmp_path: Path, ws: Path) -> None:
    (ws / "scratch.txt").write_text("uncommitted parent state\n")  # part of the snapshot
    write_agent(ws, "editor", script=EDITOR, tools=["write_file", "read_file"])
    turns = [
        {"tool_calls": [spawn("editor", "edit")]},
        {"tool_calls": [{"name": "apply_patch", "arguments": {"artifact": "{patch}"}}]},
        complete(),
    ]
    h, model = harness(tmp_path, turns)
    with h:
        out_holder: dict[str, str] = {}

        real = model.complete

        def complete_with_patch(request: Any) -> Any:
            for message in request.messages:
                if message.role == "tool" and message.content and '"patch"' in message.content:
                    out_holder["patch"] = json.loads(message.content)["patch"]
            model._turns = [
                json.loads(json.dumps(t).replace("{patch}", out_holder.get("patch", "none")))
                for t in turns
            ]
            return real(request)

        model.complete = complete_with_patch  # type: ignore[method-assign]
        out = h.run("delegate an edit", cwd=ws)
        child = h.store.child_runs(out.id)[0]
        assert child.options.workspace_kind == "isolated"
        isolated_path = Path(child.workspace)
        assert isolated_path != ws
        result = json.loads(tool_result(h, out.id, "call_0_0").data["output"])
        assert sorted(result["patch_files"]) == ["a.txt", "b.txt"]
        assert result["stale"] == []
        # the child saw the parent's uncommitted state and never touched the parent's files
        child_saw = [e for e in h.events(child.run_id) if e.type is EventType.TOOL_FINISHED]
        assert child_saw
        applied = tool_result(h, out.id, "call_1_0")
        assert applied.type is EventType.TOOL_FINISHED, applied.data.get("message")
        assert (ws / "a.txt").read_text() == "hello child\n"
        assert (ws / "b.txt").read_text() == "new\n"
        assert out.status is RunStatus.COMPLETED
        assert not isolated_path.exists()  # removed once its result was taken
        # the user's branch and index are untouched
        status = subprocess.run(
            ["git", "-C", str(ws), "status", "--porcelain"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert "scratch.txt" in status and "a.txt" in status


def test_a_patch_over_files_the_parent_changed_since_is_stale(tmp_path: Path, ws: Path) -> None:
    write_agent(ws, "editor", script=EDITOR, tools=["write_file"])
    turns = [
        {"tool_calls": [spawn("editor", "edit", background=True)]},
        {
            "tool_calls": [
                {"name": "write_file", "arguments": {"path": "a.txt", "content": "mine\n"}}
            ]
        },
        {"tool_calls": [{"name": "agent_wait", "arguments": {"ids": ["{task0}"]}}]},
        complete(),
    ]
    h, _ = harness(tmp_path, turns, child_slots=0)  # the child runs when the parent waits
    with h:
        out = h.run("delegate an edit", cwd=ws)
        waited = json.loads(tool_result(h, out.id, "call_2_0").data["output"])
        (result,) = waited["results"]
        assert result["stale"] == ["a.txt"]
        assert "stale_note" in result
        assert (ws / "a.txt").read_text() == "mine\n"


def test_an_isolated_child_never_stores_its_parents_secrets(tmp_path: Path, ws: Path) -> None:
    secret = "sk-live-4f9a8b7c6d5e4f3a2b1c"
    (ws / ".gitignore").write_text(".env\n")
    (ws / ".env").write_text(f"API_TOKEN={secret}\n")  # git-ignored: not in the child's copy
    leak = [
        {"tool_calls": [{"name": "write_file", "arguments": {"path": "c.txt", "content": secret}}]},
        complete(f"wrote {secret}"),
    ]
    write_agent(ws, "leaky", script=leak, tools=["write_file"])
    h, _ = harness(tmp_path, [{"tool_calls": [spawn("leaky", "write")]}, complete()])
    with h:
        out = h.run("delegate", cwd=ws)
        child = h.store.child_runs(out.id)[0]
        assert child.status is RunStatus.COMPLETED
        for run in (out.id, child.run_id):
            for event in h.events(run):
                assert secret not in json.dumps(event.data), (run, event.type)


def test_an_invalid_spec_names_its_file_and_line_and_spawns_nothing(
    tmp_path: Path, ws: Path
) -> None:
    agents = ws / ".keel" / "agents"
    agents.mkdir(parents=True)
    (agents / "broken.md").write_text(
        "---\ndescription: broken\ntools: [read_file, no_such_tool]\n---\nDo it.\n"
    )
    h, _ = harness(tmp_path, [{"tool_calls": [spawn("broken", "go")]}, complete()])
    with h:
        out = h.run("delegate", cwd=ws)
        failed = tool_result(h, out.id, "call_0_0")
        assert failed.type is EventType.TOOL_FAILED
        assert f"{agents / 'broken.md'}:3:" in failed.data["message"]
        assert "no_such_tool" in failed.data["message"]
        assert h.store.child_runs(out.id) == []
        assert h.store.list_tasks() == []


def test_a_call_id_reused_in_a_later_turn_spawns_a_new_child(tmp_path: Path, ws: Path) -> None:
    # Providers make call ids unique within a turn only; a later turn may send the same id.
    write_agent(ws, "one", script=[complete("I am one")])
    write_agent(ws, "two", script=[complete("I am two")])
    turns = [
        {"tool_calls": [{**spawn("one", "be one"), "id": "call_0"}]},
        {"tool_calls": [{**spawn("two", "be two"), "id": "call_0"}]},
        complete(),
    ]
    h, _ = harness(tmp_path, turns)
    with h:
        out = h.run("delegate twice", cwd=ws)
        children = h.store.child_runs(out.id)
        assert [c.options.agent["name"] for c in children if c.options.agent] == ["one", "two"]
        finished = events_of(h, out.id, EventType.SUBAGENT_FINISHED)
        assert [e.data["summary"] for e in finished] == ["I am one", "I am two"]


def test_a_broken_agents_config_refuses_the_spawn_naming_the_key(tmp_path: Path, ws: Path) -> None:
    (ws / ".keel").mkdir(exist_ok=True)
    (ws / ".keel" / "config.toml").write_text("[agents]\nmax_depth = 10000\n")
    write_agent(ws, "finder", script=[complete()])
    h, _ = harness(tmp_path, [{"tool_calls": [spawn("finder", "x")]}, complete()])
    with h:
        out = h.run("delegate", cwd=ws)
        failed = tool_result(h, out.id, "call_0_0")
        assert failed.type is EventType.TOOL_FAILED
        assert "[agents] max_depth" in failed.data["message"]
        assert h.store.child_runs(out.id) == []
