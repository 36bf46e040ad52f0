"""Python middleware at every lifecycle point, through the real loop (Harness, SQLite file).

Seed 003 §4.5.2's extension-order tests: the declared order, what wins when decisions
meet (deny > ask > short-circuit > modify; modifications compose in order), a
short-circuit at each point that has one, both failure semantics, and every decision
but ``continue`` recorded as a ``middleware_decided`` event. Only the model's turns
are scripted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from keel.core.errors import ConfigError
from keel.core.events import Event, EventType
from keel.core.middleware import (
    CONTINUE,
    Append,
    Ask,
    Decision,
    Deny,
    Modify,
    ShortCircuit,
)
from keel.core.status import RunStatus
from keel.loop.middleware import (
    CompletionContext,
    Middleware,
    ModelContext,
    ToolCallContext,
    ToolResultContext,
    TurnContext,
)
from keel.models.base import ModelRequest
from keel.models.scripted import ScriptedModel
from keel.runtime.harness import Harness
from keel.runtime.write_size import WriteSizeGuard


def turn(*calls: dict[str, Any], content: str | None = None) -> dict[str, Any]:
    return {"tool_calls": list(calls), **({"content": content} if content else {})}


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "arguments": arguments}


WRITE = call("write_file", path="a.txt", content="one\n")
DONE = turn(call("request_completion", summary="done"))


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    return root


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/keel.db"


def decided(events: list[Event]) -> list[dict[str, Any]]:
    return [e.data for e in events if e.type is EventType.MIDDLEWARE_DECIDED]


def events_of(h: Harness, run_id: str) -> list[Event]:
    return list(h.store.read_events(run_id))


def last_tool_text(request: ModelRequest) -> str:
    return next(m.content or "" for m in reversed(request.messages) if m.role == "tool")


class BeforeTool(Middleware):
    """Answers ``before_tool`` with a fixed decision; keeps the arguments it saw."""

    def __init__(self, name: str, decision: Decision, *, order: int = 0, only: str = "") -> None:
        self.name, self.decision, self.order, self.only = name, decision, order, only
        self.seen: list[dict[str, Any]] = []

    def before_tool(self, ctx: ToolCallContext) -> Decision:
        if self.only and ctx.tool != self.only:
            return CONTINUE
        self.seen.append(dict(ctx.arguments))
        return self.decision


# --- before_tool: order, composition, conflicts, short-circuit -------------------------


def test_modifications_compose_in_declared_order_and_each_sees_its_predecessors(
    workspace: Path, store_url: str
) -> None:
    # Given in the wrong order; `order` decides: first (order 1), then second (order 2).
    second = BeforeTool("second", Modify({"arguments": {"content": "two\n"}}, "say two"), order=2)
    first = BeforeTool(
        "first", Modify({"arguments": {"path": "b.txt"}}, "write b"), order=1, only="write_file"
    )
    second.only = "write_file"
    model = ScriptedModel([turn(WRITE), DONE])
    with Harness(store=store_url, model=model, middleware=[second, first]) as h:
        run = h.run("write", cwd=workspace)
        records = decided(events_of(h, run.id))

    assert run.status is RunStatus.COMPLETED
    assert first.seen == [{"path": "a.txt", "content": "one\n"}]
    assert second.seen == [{"path": "b.txt", "content": "one\n"}]  # saw first's change
    assert not (workspace / "a.txt").exists()
    assert (workspace / "b.txt").read_text() == "two\n"  # both patches, composed
    assert [(r["middleware"], r["decision"], r["point"]) for r in records] == [
        ("first", "modify", "before_tool"),
        ("second", "modify", "before_tool"),
    ]
    assert records[0]["reason"] == "write b" and records[0]["call_id"] == "call_0_0"


def test_deny_beats_ask_and_modify_and_the_model_is_told_why(
    workspace: Path, store_url: str
) -> None:
    modify = BeforeTool("modify", Modify({"arguments": {"path": "b.txt"}}), order=1)
    ask = BeforeTool("ask", Ask("a person should see this"), order=2)
    deny = BeforeTool("deny", Deny("no writes today"), order=3)
    model = ScriptedModel([turn(WRITE), DONE])
    with Harness(store=store_url, model=model, middleware=[modify, ask, deny]) as h:
        run = h.run("write", cwd=workspace)
        events = events_of(h, run.id)

    assert run.status is RunStatus.COMPLETED
    assert not (workspace / "a.txt").exists() and not (workspace / "b.txt").exists()
    (failed,) = [e for e in events if e.type is EventType.TOOL_FAILED]
    assert failed.data["error_kind"] == "middleware_denied"
    assert "no writes today" in last_tool_text(model.requests[1])
    assert [r["decision"] for r in decided(events)] == ["modify", "ask", "deny"]


def test_a_deny_stops_the_chain_so_later_middleware_are_not_asked(
    workspace: Path, store_url: str
) -> None:
    deny = BeforeTool("deny", Deny("stop"), order=1, only="write_file")
    later = BeforeTool("later", Ask("never asked"), order=2, only="write_file")
    with Harness(
        store=store_url, model=ScriptedModel([turn(WRITE), DONE]), middleware=[deny, later]
    ) as h:
        h.run("write", cwd=workspace)
    assert len(deny.seen) == 1 and later.seen == []


def test_ask_beats_modify_the_run_waits_for_a_person_with_the_modified_call(
    workspace: Path, store_url: str
) -> None:
    modify = BeforeTool("modify", Modify({"arguments": {"path": "b.txt"}}), order=1)
    ask = BeforeTool("ask", Ask("check the target"), order=2, only="write_file")
    modify.only = "write_file"
    model = ScriptedModel([turn(WRITE), DONE])
    with Harness(store=store_url, model=model, middleware=[modify, ask]) as h:
        waiting = h.run("write", cwd=workspace)
        assert waiting.status is RunStatus.WAITING
        pending = waiting.state.pending
        assert pending is not None and pending.kind == "approval"
        assert pending.arguments is not None and pending.arguments["path"] == "b.txt"
        (asked,) = [e for e in events_of(h, waiting.id) if e.type is EventType.APPROVAL_REQUESTED]
        assert "check the target" in str(asked.data)
        assert not (workspace / "b.txt").exists()
        h.approve(waiting.id)
        done = h.resume(waiting.id)

    assert done.status is RunStatus.COMPLETED
    assert (workspace / "b.txt").read_text() == "one\n"  # the approved call, modified
    assert len(ask.seen) == 1  # the resume acted on the recorded decisions


def test_short_circuit_before_a_tool_answers_in_its_place(workspace: Path, store_url: str) -> None:
    cached = BeforeTool("cache", ShortCircuit("cached: written", "seen before"), only="write_file")
    model = ScriptedModel([turn(WRITE), DONE])
    with Harness(store=store_url, model=model, middleware=[cached]) as h:
        run = h.run("write", cwd=workspace)
        events = events_of(h, run.id)

    assert run.status is RunStatus.COMPLETED
    assert not (workspace / "a.txt").exists()  # the tool never ran
    (finished,) = [
        e for e in events if e.type is EventType.TOOL_FINISHED and e.data["tool"] == "write_file"
    ]
    assert finished.data["answered_by"] == "middleware:cache"
    assert last_tool_text(model.requests[1]) == "cached: written"
    assert not [
        e for e in events if e.type is EventType.TOOL_STARTED and e.data["tool"] == "write_file"
    ]


def test_deny_beats_short_circuit(workspace: Path, store_url: str) -> None:
    cached = BeforeTool("cache", ShortCircuit("cached"), order=1, only="write_file")
    deny = BeforeTool("deny", Deny("no"), order=2, only="write_file")
    model = ScriptedModel([turn(WRITE), DONE])
    with Harness(store=store_url, model=model, middleware=[cached, deny]) as h:
        run = h.run("write", cwd=workspace)
        events = events_of(h, run.id)
    assert [e.data["error_kind"] for e in events if e.type is EventType.TOOL_FAILED] == [
        "middleware_denied"
    ]


def test_modified_arguments_are_validated_again_and_a_bad_patch_fails_the_call(
    workspace: Path, store_url: str
) -> None:
    bad = BeforeTool("bad", Modify({"arguments": {"path": 7}}), only="write_file")
    model = ScriptedModel([turn(WRITE), DONE])
    with Harness(store=store_url, model=model, middleware=[bad]) as h:
        run = h.run("write", cwd=workspace)
        events = events_of(h, run.id)
    assert run.status is RunStatus.COMPLETED
    assert not (workspace / "a.txt").exists()
    (failed,) = [e for e in events if e.type is EventType.TOOL_FAILED]
    assert failed.data["error_kind"] == "middleware_error"  # the middleware's fault
    assert "the arguments middleware changed are not valid" in failed.data["message"]


# --- failure semantics -------------------------------------------------------------------


class Raises(Middleware):
    def __init__(self, name: str, on_error: str) -> None:
        self.name, self.on_error = name, on_error

    def before_tool(self, ctx: ToolCallContext) -> Decision:
        raise RuntimeError("the policy service is down")


def test_a_failing_middleware_that_fails_closed_denies_its_point(
    workspace: Path, store_url: str
) -> None:
    model = ScriptedModel([turn(WRITE), DONE])
    with Harness(store=store_url, model=model, middleware=[Raises("guard", "closed")]) as h:
        run = h.run("write", cwd=workspace)
        events = events_of(h, run.id)

    assert not (workspace / "a.txt").exists()
    (record, *_) = decided(events)
    assert record["decision"] == "deny" and record["failed"] == "closed"
    assert "RuntimeError: the policy service is down" in record["error"]
    assert "the policy service is down" in last_tool_text(model.requests[1])
    assert run.status is RunStatus.COMPLETED


def test_a_failing_middleware_that_fails_open_is_recorded_and_ignored(
    workspace: Path, store_url: str
) -> None:
    model = ScriptedModel([turn(WRITE), DONE])
    with Harness(store=store_url, model=model, middleware=[Raises("audit", "open")]) as h:
        run = h.run("write", cwd=workspace)
        events = events_of(h, run.id)

    assert (workspace / "a.txt").read_text() == "one\n"
    records = decided(events)
    assert {(r["decision"], r["failed"]) for r in records} == {("error", "open")}
    assert all("the policy service is down" in r["error"] for r in records)
    assert run.status is RunStatus.COMPLETED


class WrongAnswer(Middleware):
    """Returns what ``after_tool`` may not answer (ask) — a bug in the middleware."""

    def after_tool(self, ctx: ToolResultContext) -> Any:
        return Ask("after the fact")


def test_a_decision_the_point_does_not_accept_is_the_middlewares_error(
    workspace: Path, store_url: str
) -> None:
    model = ScriptedModel([turn(WRITE), DONE])
    with Harness(store=store_url, model=model, middleware=[WrongAnswer()]) as h:
        run = h.run("write", cwd=workspace)
        records = decided(events_of(h, run.id))
    assert records[0]["failed"] == "closed" and records[0]["decision"] == "deny"
    assert "ask" in records[0]["error"]
    assert "withheld" in last_tool_text(model.requests[1])


def test_two_middleware_with_one_name_and_a_bad_on_error_are_config_errors(
    store_url: str,
) -> None:
    with pytest.raises(ConfigError, match="two middleware are named 'same'"):
        Harness(store=store_url, middleware=[BeforeTool("same", CONTINUE)] * 2)
    with pytest.raises(ConfigError, match="on_error"):
        Harness(store=store_url, middleware=[Raises("x", "sometimes")])
    with pytest.raises(ConfigError, match="Middleware objects or entry point names"):
        Harness(store=store_url, middleware=[object()])  # type: ignore[list-item]


# --- before_model and after_model ---------------------------------------------------------


class TrimTools(Middleware):
    """Offers only the tools named; short-circuits the model at step ``answer_at``."""

    def __init__(self, keep: tuple[str, ...], answer_at: int = 0) -> None:
        self.keep, self.answer_at = keep, answer_at
        self.steps: list[int] = []

    def before_model(self, ctx: ModelContext) -> Decision:
        self.steps.append(ctx.step)
        if ctx.step == self.answer_at:
            return ShortCircuit(
                {"tool_calls": [{"name": "request_completion", "arguments": {"summary": "mw"}}]},
                "known answer",
            )
        return Modify({"tools": [t for t in ctx.tools if t in self.keep]}, "fewer tools")


def test_before_model_changes_the_offered_tools_and_can_answer_in_the_models_place(
    workspace: Path, store_url: str
) -> None:
    trim = TrimTools(("read_file", "request_completion"), answer_at=2)
    model = ScriptedModel([turn(call("read_file", path="x.txt")), DONE])
    (workspace / "x.txt").write_text("x\n")
    with Harness(store=store_url, model=model, middleware=[trim]) as h:
        run = h.run("read", cwd=workspace)
        events = events_of(h, run.id)

    assert run.status is RunStatus.COMPLETED
    assert len(model.requests) == 1  # step 2 was answered by the middleware
    assert {t.name for t in model.requests[0].tools} == {"read_file", "request_completion"}
    requested = [e.data for e in events if e.type is EventType.MODEL_REQUESTED]
    assert requested[1]["answered_by"] == "middleware:TrimTools"
    assert run.state.result is not None and run.state.result["summary"] == "mw"
    assert [r["decision"] for r in decided(events)] == ["modify", "short_circuit"]
    assert trim.steps == [1, 2]


class AfterModel(Middleware):
    """Answers ``after_model`` at the first step with a fixed decision."""

    def __init__(self, decision: Decision) -> None:
        self.decision = decision

    def after_model(self, ctx: TurnContext) -> Decision:
        return self.decision if ctx.step == 1 else CONTINUE


def test_after_model_changes_the_turn_before_it_is_recorded(
    workspace: Path, store_url: str
) -> None:
    rewrite = AfterModel(
        Modify(
            {
                "tool_calls": [
                    {
                        "id": "c1",
                        "name": "write_file",
                        "arguments": {"path": "safe.txt", "content": "s"},
                    }
                ]
            },
            "redirected",
        )
    )
    model = ScriptedModel([turn(WRITE), DONE])
    with Harness(store=store_url, model=model, middleware=[rewrite]) as h:
        run = h.run("write", cwd=workspace)
        events = events_of(h, run.id)
    assert (workspace / "safe.txt").read_text() == "s"
    assert not (workspace / "a.txt").exists()
    responded = next(e for e in events if e.type is EventType.MODEL_RESPONDED)
    assert [c["name"] for c in responded.data["tool_calls"]] == ["write_file"]
    assert "safe.txt" in str(responded.data["tool_calls"])
    assert run.status is RunStatus.COMPLETED


def test_a_deny_after_the_model_stops_the_run_blocked_with_the_reason(
    workspace: Path, store_url: str
) -> None:
    model = ScriptedModel([turn(WRITE), DONE])
    with Harness(store=store_url, model=model, middleware=[AfterModel(Deny("unsafe plan"))]) as h:
        run = h.run("write", cwd=workspace)
    assert run.status is RunStatus.BLOCKED
    reason = run.state.reason
    assert reason is not None and "unsafe plan" in reason
    assert reason.startswith("middleware_denied:AfterModel")
    assert not (workspace / "a.txt").exists()


# --- after_tool ------------------------------------------------------------------------------


class AfterTool(Middleware):
    def __init__(self, name: str, decision: Decision, order: int = 0) -> None:
        self.name, self.decision, self.order = name, decision, order
        self.outputs: list[str] = []

    def after_tool(self, ctx: ToolResultContext) -> Decision:
        self.outputs.append(ctx.output)
        return self.decision


def test_after_tool_modifies_in_order_appends_notes_and_the_log_keeps_the_real_output(
    workspace: Path, store_url: str
) -> None:
    (workspace / "x.txt").write_text("secret-ish\n")
    mask = AfterTool("mask", Modify({"output": "[masked]"}), order=1)
    note = AfterTool("note", Append("remember the style guide"), order=2)
    model = ScriptedModel([turn(call("read_file", path="x.txt")), DONE])
    with Harness(store=store_url, model=model, middleware=[note, mask]) as h:
        run = h.run("read", cwd=workspace)
        events = events_of(h, run.id)

    shown = last_tool_text(model.requests[1])
    assert shown.startswith("[masked]") and "remember the style guide" in shown
    assert "secret-ish" not in shown
    assert note.outputs[0] == "[masked]"  # the later middleware saw the earlier change
    (finished, *_) = [e for e in events if e.type is EventType.TOOL_FINISHED]
    assert "secret-ish" in finished.data["output"]  # the record is what the tool returned
    assert finished.data["shown"] == shown
    assert run.status is RunStatus.COMPLETED


# --- before_complete ---------------------------------------------------------------------------


class Reviewer(Middleware):
    """Refuses the first completion, accepts the second."""

    def __init__(self) -> None:
        self.asked = 0

    def before_complete(self, ctx: CompletionContext) -> Decision:
        self.asked += 1
        return Deny("add a test first") if self.asked == 1 else CONTINUE


def test_before_complete_adds_a_gap_that_blocks_completion_until_it_is_met(
    workspace: Path, store_url: str
) -> None:
    reviewer = Reviewer()
    model = ScriptedModel([DONE, DONE])
    with Harness(store=store_url, model=model, middleware=[reviewer]) as h:
        run = h.run("finish", cwd=workspace)
        events = events_of(h, run.id)
    assert run.status is RunStatus.COMPLETED
    assert reviewer.asked == 2
    assert len(model.requests) == 2
    assert "add a test first" in str(model.requests[1].messages)
    assert [r["decision"] for r in decided(events)] == ["deny"]


# --- on_event ------------------------------------------------------------------------------------


class Observer(Middleware):
    def __init__(self, fail: bool = False) -> None:
        self.name = "observer" if not fail else "flaky"
        self.on_error = "open"
        self.fail = fail
        self.seqs: list[int] = []

    def on_event(self, event: Event) -> None:
        self.seqs.append(event.seq)
        if self.fail:
            raise ValueError("disk full")


def test_on_event_sees_every_stored_event_and_its_failures_are_recorded_once(
    workspace: Path, store_url: str
) -> None:
    good, flaky = Observer(), Observer(fail=True)
    model = ScriptedModel([turn(WRITE), DONE])
    with Harness(store=store_url, model=model, middleware=[good, flaky]) as h:
        run = h.run("write", cwd=workspace)
        events = events_of(h, run.id)
    assert run.status is RunStatus.COMPLETED
    stored = [e.seq for e in events]
    # Every event from the first the driver stored on (run_created came before it).
    assert good.seqs == stored[-len(good.seqs) :] and good.seqs[0] <= 2
    errors = [r for r in decided(events) if r["middleware"] == "flaky"]
    assert len(errors) == 1 and "disk full" in errors[0]["error"]


# --- the write-size guard -------------------------------------------------------------------------


def test_the_write_size_guard_refuses_an_oversized_write_and_allows_a_small_one(
    workspace: Path, store_url: str
) -> None:
    big = call("write_file", path="big.txt", content="x" * 2000)
    small = call("write_file", path="small.txt", content="x" * 10)
    model = ScriptedModel([turn(big), turn(small), DONE])
    with Harness(store=store_url, model=model, middleware=[WriteSizeGuard(max_bytes=1000)]) as h:
        run = h.run("write", cwd=workspace)
    assert run.status is RunStatus.COMPLETED
    assert not (workspace / "big.txt").exists()
    assert (workspace / "small.txt").read_text() == "x" * 10
    assert "2000 bytes to big.txt is over the 1000-byte limit" in last_tool_text(model.requests[1])
