"""The loop's decision without I/O: run state (a fold of events) in, next action out.

Every test builds the state the way the store would — by folding events — and asks
``decide`` with the real built-in tool registry and the real permission policy.
"""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from keel.core.budget import Budget
from keel.core.events import Event, EventType, NewEvent
from keel.core.records import RunOptions, ValidationRecord
from keel.core.state import RunState, transition
from keel.core.status import RunStatus
from keel.loop.actions import Action, CallModel, Commit, Halt, ReconcileCall, RunTool, RunVerifiers
from keel.loop.catalog import RegistryCatalog
from keel.loop.decide import Situation, decide
from keel.loop.outcomes import after_model, after_verification
from keel.models.base import ModelTurn, TokenUsage, ToolCall
from keel.policy.approvals import approval_digest, decide_approval
from keel.policy.containment import ContainedPolicy
from keel.policy.plans import plan_digest
from keel.policy.rules import Policy, Rule
from keel.tools import Effect, Recovery, ToolRegistry, tool
from keel.tools.builtin import default_registry

NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
WORKSPACE = Path("/srv/ws")


class Run:
    """One run's event log, numbered as a store would and folded as events arrive."""

    def __init__(
        self,
        *,
        mode: str = "edit",
        verify: tuple[str, ...] = (),
        options: dict[str, Any] | None = None,
        **budget: Any,
    ) -> None:
        self.state = RunState(run_id="run_000000000001")
        limits = {"max_steps": 50, "max_tool_calls": 200, **budget}
        options = RunOptions(
            mode=mode, verify=verify, budget=Budget(**limits), **(options or {})
        ).to_dict()
        self.add(
            NewEvent(
                type=EventType.RUN_CREATED,
                data={"goal": "fix the bug", "workspace": str(WORKSPACE), "options": options},
            )
        )
        self.turns = 0
        self.tools = default_registry()  # what the harness was given
        self.gate = Policy()
        self.child_statuses: dict[str, str] = {}  # what the driver reads for a waiting parent
        self.middleware_points: frozenset[str] = frozenset()  # points some middleware is at

    def add(self, *new: NewEvent) -> RunState:
        for n in new:
            seq = self.state.last_seq + 1
            event = Event(
                run_id=self.state.run_id,
                seq=seq,
                event_id=f"e{seq}",
                type=n.type,
                recorded_at=NOW,
                data=n.data,
            )
            self.state = self.state.apply(event)
        return self.state

    def decide(self, now: datetime = NOW) -> Action:
        situation = Situation(
            catalog=RegistryCatalog(self.tools),
            gate=self.gate,
            workspace=WORKSPACE,
            now=now,
            child_statuses=self.child_statuses,
            middleware_points=self.middleware_points,
        )
        return decide(self.state, situation)

    def model(
        self,
        *calls: tuple[str, Any],
        content: str | None = None,
        finish_reason: Any = "stop",
        refusal: str | None = None,
        **usage: Any,
    ) -> None:
        """Record one model turn proposing ``calls`` (arguments: a dict, or raw text)."""
        self.turns += 1
        turn = ModelTurn(
            content=content,
            tool_calls=tuple(
                ToolCall(
                    id=f"c{self.turns}_{i}",
                    name=name,
                    arguments=args if isinstance(args, str) else json.dumps(args),
                )
                for i, (name, args) in enumerate(calls)
            ),
            usage=TokenUsage(
                input_tokens=usage.get("input_tokens", 0),
                output_tokens=usage.get("output_tokens", 0),
            ),
            cost=usage.get("cost", 0.0),
            model="test",
            finish_reason=finish_reason,
            refusal=refusal,
        )
        self.add(*after_model(self.state, turn, elapsed_s=usage.get("elapsed_s", 0.0)))

    def perform(
        self,
        *,
        fail: str | None = None,
        changed: dict[str, str] | None = None,
        now: datetime = NOW,
    ) -> None:
        """Play the decided action the way the driver would: commit, or a tool outcome
        (recording the grant it ran under, as the driver does)."""
        action = self.decide(now)
        if isinstance(action, Commit):
            self.add(*action.events)
            return
        assert isinstance(action, RunTool), action
        data = {
            "call_id": action.call_id,
            "tool": action.tool,
            "arguments": action.arguments,
            "grant": action.grant,
        }
        if fail is not None:
            self.add(
                NewEvent(
                    type=EventType.TOOL_FAILED,
                    data={**data, "error_kind": "tool_error", "message": fail},
                )
            )
        else:
            self.add(
                NewEvent(
                    type=EventType.TOOL_FINISHED,
                    data={**data, "output": "ok", "changed_files": changed or {}},
                )
            )

    def notes(self) -> list[str]:
        return list(self.state.notes)


def committed(action: Action) -> list[NewEvent]:
    assert isinstance(action, Commit), f"expected a Commit, got {action!r}"
    return list(action.events)


def types(action: Action) -> list[str]:
    return [e.type.value for e in committed(action)]


def status_event(action: Action) -> dict[str, Any]:
    [event] = [e for e in committed(action) if e.type is EventType.STATUS_CHANGED]
    return event.data


# --- the shape of a step -----------------------------------------------------------------


def test_a_fresh_run_asks_the_model_for_its_first_turn() -> None:
    assert Run().decide() == CallModel(step=0)


def test_each_terminal_status_halts_the_driver() -> None:
    run = Run()
    run.add(transition(run.state, RunStatus.CANCELLED, "user stopped it"))
    assert run.decide() == Halt(status=RunStatus.CANCELLED)


def test_a_queued_run_is_moved_to_running_before_anything_else() -> None:
    run = Run()
    run.state = RunState.from_dict({**run.state.to_dict(), "status": "queued"})
    assert types(run.decide()) == ["status_changed"]
    assert status_event(run.decide())["to"] == "running"


def test_a_valid_write_becomes_a_tool_run_with_its_effect_and_recovery() -> None:
    run = Run()
    run.model(("write_file", {"path": "a.txt", "content": "x"}))
    action = run.decide()
    assert isinstance(action, RunTool)
    assert (action.tool, action.arguments) == ("write_file", {"path": "a.txt", "content": "x"})
    assert (action.effect, action.recovery, action.grant) == ("write", "verify_then_continue", None)


def test_calls_of_one_turn_run_in_order_and_then_the_model_is_asked_again() -> None:
    run = Run()
    run.model(("read_file", {"path": "a"}), ("read_file", {"path": "b"}))
    first = run.decide()
    assert isinstance(first, RunTool) and first.arguments["path"] == "a"
    run.perform()
    second = run.decide()
    assert isinstance(second, RunTool) and second.arguments["path"] == "b"
    run.perform()
    assert run.decide() == CallModel(step=1)


# --- bad model output becomes a tool error the model can correct ------------------------


def test_malformed_json_arguments_become_a_precise_tool_error_and_the_run_goes_on() -> None:
    run = Run()
    run.model(("read_file", '{"path": "a.txt"'))
    [event] = committed(run.decide())
    assert event.type is EventType.TOOL_FAILED
    assert event.data["error_kind"] == "invalid_arguments"
    assert "read_file" in event.data["message"] and "JSON" in event.data["message"]
    assert event.data["arguments"] == '{"path": "a.txt"'  # kept as the model wrote it
    run.perform()
    assert run.state.failed_attempts == 1
    assert run.state.status is RunStatus.RUNNING
    assert run.decide() == CallModel(step=1)


def test_a_wrongly_typed_argument_names_the_field_and_the_expected_type() -> None:
    run = Run()
    run.model(("run_command", {"argv": "ls -la"}))
    [event] = committed(run.decide())
    assert event.data["error_kind"] == "invalid_arguments"
    assert "argv" in event.data["message"]
    assert "list" in event.data["message"].lower()


def test_an_unknown_tool_is_an_error_that_lists_the_available_tools() -> None:
    run = Run()
    run.model(("delete_everything", {}))
    [event] = committed(run.decide())
    assert event.data["error_kind"] == "unknown_tool"
    assert "delete_everything" in event.data["message"]
    assert "read_file" in event.data["message"]


# --- permissions ------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["../x", "/etc/passwd", "sub/../../x"])
def test_a_path_outside_the_workspace_is_refused_without_asking_anyone(path: str) -> None:
    run = Run(mode="auto")
    run.model(("write_file", {"path": path, "content": "x"}))
    [event] = committed(run.decide())
    assert event.type is EventType.TOOL_FAILED
    assert event.data["error_kind"] == "policy_denied"
    assert "outside the workspace" in event.data["message"]


def test_ask_mode_waits_for_approval_and_the_grant_lets_exactly_that_call_run() -> None:
    run = Run(mode="ask")
    run.model(("write_file", {"path": "a.txt", "content": "x"}))
    action = run.decide()
    assert types(action) == ["approval_requested", "status_changed"]
    run.add(*committed(action))
    assert run.state.status is RunStatus.WAITING
    assert run.decide() == Halt(status=RunStatus.WAITING)
    pending = run.state.pending
    assert pending is not None and pending.digest
    run.add(
        NewEvent(
            type=EventType.APPROVAL_GRANTED,
            data={"call_id": pending.call_id, "digest": pending.digest, "by": "me"},
        ),
        transition(run.state, RunStatus.RUNNING, None),
    )
    action = run.decide()
    assert isinstance(action, RunTool) and action.grant == pending.digest


def test_an_unanswered_approval_fails_the_run_after_its_expiry() -> None:
    run = Run(mode="ask")
    run.model(("write_file", {"path": "a.txt", "content": "x"}))
    run.perform()
    later = Situation(
        catalog=RegistryCatalog(default_registry()),
        gate=Policy(),
        workspace=WORKSPACE,
        now=datetime(2025, 6, 3, tzinfo=UTC),
    )
    event = status_event(decide(run.state, later))
    assert (event["to"], event["reason"]) == ("failed", "approval_timeout")


# --- completion by evidence --------------------------------------------------------------


def test_a_final_answer_requests_verification_instead_of_completing() -> None:
    run = Run(verify=("pytest",))
    run.model(content="all fixed")
    assert run.state.status is RunStatus.VERIFYING
    assert run.decide() == RunVerifiers(commands=("pytest",))


def test_an_empty_reply_gets_a_note_and_the_model_is_asked_again() -> None:
    run = Run()
    run.model(content="  ")
    assert run.state.status is RunStatus.RUNNING
    assert "empty" in run.notes()[-1]
    assert isinstance(run.decide(), CallModel)


# --- how a turn ended -----------------------------------------------------------------------


def test_a_turn_cut_at_the_length_limit_is_never_final_the_model_is_told_and_asked_again() -> None:
    run = Run(verify=("pytest",))
    run.model(content="Here is the whole fix: first", finish_reason="length")
    assert run.state.status is RunStatus.RUNNING  # not a final answer
    assert run.state.truncated_turns == 1
    assert "cut off at the output length limit" in run.notes()[-1]
    assert "1 time(s) running; 3 times running end the run" in run.notes()[-1]
    assert isinstance(run.decide(), CallModel)


def test_the_tool_calls_of_a_cut_turn_are_not_run() -> None:
    run = Run()
    run.model(("write_file", '{"path": "big.py", "content": "def f('), finish_reason="length")
    assert run.state.turn_calls == ()
    assert "its 1 tool call(s) were incomplete and none of them ran" in run.notes()[-1]
    assert isinstance(run.decide(), CallModel)


def test_the_third_cut_turn_running_fails_the_run_saying_how_often() -> None:
    run = Run()
    run.model(content="part", finish_reason="length")
    run.model(("write_file", '{"path": "a'), finish_reason="length")
    assert run.state.status is RunStatus.RUNNING and run.state.truncated_turns == 2
    run.model(content="part again", finish_reason="length")
    assert run.state.status is RunStatus.FAILED
    assert run.state.reason == "model_output_truncated"
    assert run.state.result is not None
    assert run.state.result["truncated_turns"] == 3
    assert "3 times running" in run.state.result["detail"]
    notes = [n for n in run.notes() if "length limit" in n]
    assert len(notes) == 2  # told twice, then stopped


def test_a_turn_that_was_not_cut_resets_the_count_of_cut_turns() -> None:
    run = Run()
    run.model(content="part", finish_reason="length")
    run.model(content="part", finish_reason="length")
    run.model(("read_file", {"path": "a.txt"}), finish_reason="tool_calls")
    assert run.state.truncated_turns == 0
    run.perform()
    run.model(content="part", finish_reason="length")
    run.model(content="part", finish_reason="length")
    assert run.state.status is RunStatus.RUNNING and run.state.truncated_turns == 2


@pytest.mark.parametrize("finish", ["content_filter", "refusal"])
def test_a_refused_turn_fails_the_run_at_once_with_the_providers_words(finish: str) -> None:
    run = Run()
    run.model(
        ("write_file", {"path": "a.txt", "content": "x"}),
        content="I can't help with that.",
        finish_reason=finish,
        refusal="I can't help with that." if finish == "refusal" else None,
    )
    assert run.state.status is RunStatus.FAILED
    assert run.state.reason == f"provider_refused:{finish}"
    assert run.state.turn_calls == ()
    result = run.state.result or {}
    if finish == "refusal":
        assert result["refusal"] == "I can't help with that."
    assert isinstance(run.decide(), Halt)


def test_a_refusal_text_with_an_ordinary_finish_reason_is_a_refusal() -> None:
    run = Run()
    run.model(content=None, refusal="I must decline.", finish_reason="stop")
    assert (run.state.status, run.state.reason) == (RunStatus.FAILED, "provider_refused:refusal")


def test_the_finish_reason_and_the_usage_by_kind_are_on_record() -> None:
    run = Run()
    turn = ModelTurn(
        content="done",
        tool_calls=(),
        usage=TokenUsage(
            input_tokens=100, output_tokens=40, cached_input_tokens=64, reasoning_tokens=30
        ),
        cost=0.001,
        model="test",
        finish_reason="stop",
        provider_finish_reason="eos_token",
    )
    [responded, *_] = after_model(run.state, turn, elapsed_s=0.0)
    assert responded.data["finish_reason"] == "stop"
    assert responded.data["provider_finish_reason"] == "eos_token"
    assert "refusal" not in responded.data
    assert responded.data["usage"] == {
        "input_tokens": 100,
        "output_tokens": 40,
        "cached_input_tokens": 64,
        "reasoning_tokens": 30,
    }


def test_a_finish_reason_no_profile_knows_is_recorded_as_the_providers_and_treated_as_stop() -> (
    None
):
    run = Run()
    odd: Any = "eos"
    turn = ModelTurn(
        content="all done",
        tool_calls=(),
        usage=TokenUsage(input_tokens=1, output_tokens=1),
        cost=0.0,
        model="test",
        finish_reason=odd,
    )
    events = after_model(run.state, turn, elapsed_s=0.0)
    run.add(*events)
    responded = events[0].data
    assert (responded["finish_reason"], responded["provider_finish_reason"]) == ("stop", "eos")
    assert any("finish_reason" in fix for fix in responded["sanitized"])
    assert run.state.status is RunStatus.VERIFYING  # a final answer, as with stop


def test_request_completion_waits_for_the_other_calls_of_its_turn() -> None:
    run = Run()
    run.model(
        ("request_completion", {"summary": "done"}),
        ("write_file", {"path": "a.txt", "content": "x"}),
    )
    first = run.decide()
    assert isinstance(first, RunTool) and first.tool == "write_file"
    run.perform(changed={"a.txt": "h1"})
    event = status_event(run.decide())
    assert (event["to"], event["result"]) == ("verifying", {"summary": "done"})


def verifier(command: str, revision: int, passed: bool) -> ValidationRecord:
    return ValidationRecord(
        command=command,
        exit_code=0 if passed else 2,
        duration_s=0.1,
        artifact="art_1",
        mutation_revision=revision,
        file_hashes={},
        passed=passed,
    )


def test_a_failing_verifier_returns_the_run_to_running_with_the_gaps_as_a_note() -> None:
    run = Run(verify=("pytest -q",))
    run.model(content="done")
    run.add(*after_verification(run.state, [verifier("pytest -q", 0, False)], elapsed_s=0.1))
    assert run.state.status is RunStatus.RUNNING
    assert "pytest -q: failed with exit code 2" in run.notes()[-1]
    assert isinstance(run.decide(), CallModel)


def test_a_passing_verification_completes_with_evidence_references() -> None:
    run = Run(verify=("pytest -q",))
    run.model(content="done")
    run.add(*after_verification(run.state, [verifier("pytest -q", 0, True)], elapsed_s=0.1))
    assert run.state.status is RunStatus.COMPLETED
    assert run.state.result is not None
    assert run.state.result["evidence"] == {"pytest -q": "artifact:art_1"}  # by name
    assert run.state.result["summary"] == "done"
    assert run.state.result["outcome"] == "task_completed"
    assert run.state.result["remaining_actions"] == []


def test_an_edit_after_a_passing_verification_makes_it_stale() -> None:
    run = Run(verify=("pytest -q",))
    run.model(content="done")
    run.add(*after_verification(run.state, [verifier("pytest -q", 0, False)], elapsed_s=0.1))
    # the earlier pass (revision 0) no longer counts once a file changed (revision 1)
    run.add(
        NewEvent(
            type=EventType.VERIFICATION_PASSED,
            data={"records": [verifier("pytest -q", 0, True).to_dict()]},
        )
    )
    assert run.state.verification_gaps() == []
    run.model(("write_file", {"path": "a.txt", "content": "y"}))
    run.perform(changed={"a.txt": "h2"})
    assert run.state.verification_gaps() == [
        "pytest -q: last run at revision 0, files changed since (now 1)"
    ]
    run.model(content="done again")
    stale = after_verification(run.state, [], elapsed_s=0.0)
    assert [e.type for e in stale][-1] is EventType.STATUS_CHANGED
    assert stale[-1].data["to"] == "running"


def test_without_verifiers_completion_says_none_was_configured() -> None:
    run = Run()
    run.model(content="done")
    run.add(*after_verification(run.state, [], elapsed_s=0.0))
    assert run.state.status is RunStatus.COMPLETED
    assert run.state.result is not None
    assert "no verifier was configured" in run.state.result["evidence_note"]


def test_the_model_running_the_verifier_command_itself_is_no_evidence() -> None:
    run = Run(mode="auto", verify=("make test",))
    run.model(("run_command", {"argv": ["make", "test"]}))
    run.perform()
    assert run.state.validations == ()
    assert run.state.verification_gaps() == ["make test: not run"]


# --- budgets ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("limit", "usage", "dimension"),
    [
        ({"max_steps": 2}, {}, "steps"),
        ({"max_tool_calls": 2}, {}, "tool_calls"),
        ({"max_tokens": 100}, {"input_tokens": 40, "output_tokens": 20}, "tokens"),
        ({"max_cost": 0.01}, {"cost": 0.006}, "cost"),
        ({"max_wall_seconds": 1.0}, {"elapsed_s": 0.6}, "wall_time"),
    ],
)
def test_each_exhausted_budget_fails_the_run_with_its_own_reason_and_the_unfinished_todos(
    limit: dict[str, Any], usage: dict[str, Any], dimension: str
) -> None:
    run = Run(**limit)
    run.add(
        NewEvent(
            type=EventType.TODO_UPDATED,
            data={
                "todos": [
                    {"content": "write the fix", "status": "completed"},
                    {"content": "add a test", "status": "in_progress"},
                ]
            },
        )
    )
    for i in range(2):
        run.model(("read_file", {"path": f"f{i}"}), **usage)
        if isinstance(run.decide(), RunTool):  # wall time spent stops even the turn's calls
            run.perform()
    action = run.decide()
    assert types(action) == ["budget_exhausted", "status_changed"]
    assert committed(action)[0].data["dimension"] == dimension
    event = status_event(action)
    assert (event["to"], event["reason"]) == ("failed", f"budget_exhausted:{dimension}")
    assert event["result"]["unfinished"] == ["add a test"]


def test_the_calls_of_the_last_permitted_turn_still_run_before_the_step_budget_stops() -> None:
    run = Run(max_steps=1)
    run.model(("write_file", {"path": "a.txt", "content": "x"}))
    assert isinstance(run.decide(), RunTool)
    run.perform(changed={"a.txt": "h"})
    assert status_event(run.decide())["reason"] == "budget_exhausted:steps"


def test_an_exhausted_tool_call_budget_stops_the_rest_of_a_turn() -> None:
    run = Run(max_tool_calls=1)
    run.model(("read_file", {"path": "a"}), ("read_file", {"path": "b"}))
    run.perform()
    assert status_event(run.decide())["reason"] == "budget_exhausted:tool_calls"


def test_a_budget_warning_at_80_percent_comes_once_with_a_converge_note() -> None:
    run = Run(max_steps=5)
    for _ in range(4):
        assert isinstance(run.decide(), CallModel)
        run.model(("read_file", {"path": f"f{run.turns}"}))
        run.perform()
    action = run.decide()
    assert types(action) == ["budget_warning", "note_added"]
    assert committed(action)[0].data == {"dimension": "steps", "used": 4, "limit": 5}
    run.add(*committed(action))
    assert "Converge now" in run.notes()[-1]
    assert run.decide() == CallModel(step=4)  # warned once, not again


# --- no progress ------------------------------------------------------------------------


def test_the_same_call_three_times_is_detected_then_fails_the_run_two_steps_later() -> None:
    run = Run()
    for _ in range(3):
        run.model(("read_file", {"path": "same.txt"}))
        run.perform()
    action = run.decide()
    assert types(action) == ["no_progress_detected", "note_added"]
    run.add(*committed(action))
    assert run.notes()[-1].startswith("No progress: the same call read_file:")
    for _ in range(2):
        assert isinstance(run.decide(), CallModel)  # the model gets its chance to replan
        run.model(("read_file", {"path": "same.txt"}))
        run.perform()
    event = status_event(run.decide())
    assert (event["to"], event["reason"]) == ("failed", "no_progress")


def test_the_same_error_three_times_counts_as_no_progress_even_with_different_calls() -> None:
    run = Run()
    for i in range(3):
        run.model(("read_file", {"path": f"missing{i}.txt"}))
        run.perform(fail="workspace is read-only")
    action = run.decide()
    assert types(action) == ["no_progress_detected", "note_added"]
    assert "the same error 3 times" in committed(action)[0].data["what"]


def test_a_changed_approach_after_the_replan_note_keeps_the_run_going() -> None:
    run = Run()
    for _ in range(3):
        run.model(("read_file", {"path": "same.txt"}))
        run.perform()
    run.perform()  # no_progress_detected + note
    for i in range(3):
        run.model(("read_file", {"path": f"other{i}.txt"}))
        run.perform()
    assert isinstance(run.decide(), CallModel)


def test_a_repetition_after_a_change_of_course_gets_a_fresh_note_not_a_failure() -> None:
    run = Run()
    for path in ["same.txt"] * 3 + ["other.txt"] * 3:
        run.model(("read_file", {"path": path}))
        run.perform()
        if path == "same.txt" and run.turns == 3:
            run.perform()  # no_progress_detected + note
    assert run.state.no_progress_step is None  # the other call broke the streak
    assert types(run.decide()) == ["no_progress_detected", "note_added"]


def test_two_calls_that_differ_are_not_a_repetition() -> None:
    run = Run()
    for i in range(3):
        run.model(("read_file", {"path": "a.txt", "offset": i}))
        run.perform()
    assert isinstance(run.decide(), CallModel)


# --- a call that started but never finished (resume) ------------------------------------


def started(call_id: str, tool: str, args: dict[str, Any], recovery: str, **extra: Any) -> NewEvent:
    return NewEvent(
        type=EventType.TOOL_STARTED,
        data={"call_id": call_id, "tool": tool, "arguments": args, "recovery": recovery, **extra},
    )


def test_an_unfinished_replay_safe_call_is_run_again_without_a_new_start_record() -> None:
    run = Run()
    run.model(("read_file", {"path": "a"}))
    run.add(started("c1_0", "read_file", {"path": "a"}, "replay_safe", effect="read"))
    action = run.decide()
    assert isinstance(action, RunTool) and action.record_start is False


def test_an_unfinished_write_is_checked_against_its_intent() -> None:
    run = Run()
    run.model(("write_file", {"path": "a", "content": "x"}))
    intent = {"a": "abc"}
    run.add(
        started(
            "c1_0",
            "write_file",
            {"path": "a", "content": "x"},
            "verify_then_continue",
            intent=intent,
        )
    )
    assert run.decide() == ReconcileCall(
        call_id="c1_0", tool="write_file", arguments={"path": "a", "content": "x"}, intent=intent
    )


def test_an_unfinished_command_asks_a_person_rather_than_running_it_again() -> None:
    run = Run(mode="auto")
    run.model(("run_command", {"argv": ["make", "deploy"]}))
    run.add(started("c1_0", "run_command", {"argv": ["make", "deploy"]}, "manual"))
    action = run.decide()
    assert types(action) == ["approval_requested", "status_changed"]
    assert committed(action)[0].data["kind"] == "unknown_outcome"


# --- grants: used up by their attempt, and they expire -------------------------------------


def approve(run: Run, *, now: datetime = NOW) -> dict[str, Any]:
    """A person approves what the run waits for (as ``keel approve`` records it)."""
    granted = decide_approval(run.state, approve=True, by="ana", reason=None, now=now)
    run.add(granted, transition(run.state, RunStatus.RUNNING, None))
    return granted.data


EDIT = ("edit_file", {"path": "a.txt", "old_text": "missing", "new_text": "y"})


def test_a_grant_is_used_up_when_the_approved_calls_pre_check_fails() -> None:
    run = Run(mode="ask")
    run.model(EDIT)
    run.perform()  # asks
    approve(run)
    granted = run.decide()
    assert isinstance(granted, RunTool) and granted.grant is not None

    run.perform(fail="edit_file: old_text not found in a.txt")  # the intent check failed

    assert run.state.grants == {}
    run.model(EDIT)  # the model retries the very same call, with a new id
    retry = run.decide()
    assert types(retry) == ["approval_requested", "status_changed"]
    assert committed(retry)[0].data["call_id"] == "c2_0"


def test_a_grant_past_its_ttl_no_longer_lets_the_call_through_it_asks_again() -> None:
    run = Run(mode="ask", options={"grant_ttl_s": 60})
    run.model(EDIT)
    run.perform()
    granted = approve(run)
    assert granted["expires_at"] == "2025-06-01T12:01:00+00:00"

    in_time = run.decide(NOW + timedelta(seconds=59))
    late = run.decide(NOW + timedelta(seconds=60))

    assert isinstance(in_time, RunTool) and in_time.grant is not None
    assert types(late) == ["approval_requested", "status_changed"]
    request = committed(late)[0].data
    assert request["expired_grant"] == {
        "call_id": "c1_0",
        "expires_at": "2025-06-01T12:01:00+00:00",
    }
    run.add(*committed(late))
    assert run.state.grants == {}  # the new request supersedes the expired grant
    approve(run, now=NOW + timedelta(minutes=2))
    again = run.decide(NOW + timedelta(minutes=2))
    assert isinstance(again, RunTool) and again.grant == request["digest"]


def test_an_expired_grant_for_an_interrupted_call_asks_again_rather_than_rerunning() -> None:
    run = Run(mode="auto", options={"grant_ttl_s": 60})
    run.model(("run_command", {"argv": ["make", "deploy"]}))
    action = run.decide()
    assert isinstance(action, RunTool)
    run.add(
        NewEvent(
            type=EventType.TOOL_STARTED,
            data={
                "call_id": action.call_id,
                "tool": action.tool,
                "arguments": action.arguments,
                "effect": "execute",
                "recovery": "manual",
            },
        )
    )
    run.perform()  # unknown outcome: a person is asked
    approve(run)

    assert isinstance(run.decide(NOW + timedelta(seconds=30)), RunTool)
    late = committed(run.decide(NOW + timedelta(hours=1)))
    assert late[0].type is EventType.APPROVAL_REQUESTED
    assert late[0].data["kind"] == "unknown_outcome"


@pytest.mark.parametrize("stored", [-5, 0])
def test_a_run_stored_with_an_unusable_approval_timeout_still_asks_with_the_default(
    stored: float,
) -> None:
    """Such runs predate the option checks; they must not crash at every approval."""
    run = Run(mode="ask", options={"approval_timeout_s": stored})
    run.model(EDIT)

    [request, _] = committed(run.decide())

    assert request.data["expires_at"] == "2025-06-02T12:00:00+00:00"


# --- plan integrity ------------------------------------------------------------------------

APPROVED_PLAN = "1. Fix the parser\n2. Run the tests\n\nPaths:\n- src/\n"


def approved_plan_run(plan: str = APPROVED_PLAN) -> Run:
    """A run whose plan (naming ``src/``) a person approved; now in edit mode."""
    run = Run(mode="plan", options={"plan_then": "edit"})
    run.model(("plan_write", {"content": plan}))
    run.perform(changed={"plans/PLAN.md": "h0"})
    run.add(NewEvent(type=EventType.PLAN_WRITTEN, data={"content": plan}))
    run.model(("plan_exit", {"summary": "fix the parser"}))
    run.perform()  # asks for the plan's approval
    approve(run)
    run.perform()  # the granted plan_exit leaves plan mode
    assert run.state.mode == "edit"
    return run


def test_approving_a_plan_records_its_digest_and_paths_and_binds_the_grant_to_its_text() -> None:
    run = Run(mode="plan")
    run.model(("plan_write", {"content": APPROVED_PLAN}))
    run.perform(changed={"plans/PLAN.md": "h0"})
    run.add(NewEvent(type=EventType.PLAN_WRITTEN, data={"content": APPROVED_PLAN}))
    run.model(("plan_exit", {"summary": "fix the parser"}))
    [request, _] = committed(run.decide())
    summary_and_plan = {"summary": "fix the parser", "plan_sha256": plan_digest(APPROVED_PLAN)}

    assert request.data["plan_sha256"] == plan_digest(APPROVED_PLAN)
    assert request.data["digest"] == approval_digest("plan_exit", summary_and_plan, WORKSPACE)
    run.add(request, transition(run.state, RunStatus.WAITING, "plan"))
    approve(run)
    events = committed(run.decide())
    approved = next(e for e in events if e.type is EventType.PLAN_APPROVED)
    assert approved.data == {
        "call_id": "c2_0",
        "plan_sha256": plan_digest(APPROVED_PLAN),
        "paths": ["src/"],
    }


def test_an_approved_plan_replaced_without_approval_is_refused_the_gate_asks() -> None:
    run = approved_plan_run()
    hostile = "1. delete everything\n2. push to prod\n"
    run.model(("plan_write", {"content": hostile}))

    action = run.decide()

    assert types(action) == ["approval_requested", "status_changed"]
    request = committed(action)[0].data
    assert (request["tool"], request["rule"]) == ("plan_write", "plan")
    assert request["plan_sha256"] == plan_digest(hostile)
    assert request["approved_plan_sha256"] == plan_digest(APPROVED_PLAN)
    assert "approved plan" in request["reason"]
    run.add(*committed(action))
    run.add(
        decide_approval(run.state, approve=False, by="ana", reason="no", now=NOW),
        transition(run.state, RunStatus.RUNNING, None),
    )
    assert run.state.approved_plan_sha256 == plan_digest(APPROVED_PLAN)


def test_an_approved_change_of_the_plan_makes_the_new_digest_the_approved_one() -> None:
    run = approved_plan_run()
    revised = APPROVED_PLAN + "- docs/\n"
    run.model(("plan_write", {"content": revised}))
    run.perform()  # asks
    approve(run)

    [approved] = committed(run.decide())  # first the new plan becomes the approved one
    run.add(approved)
    write = run.decide()  # then the write runs under the same grant

    assert approved.type is EventType.PLAN_APPROVED
    assert run.state.approved_plan_sha256 == plan_digest(revised)
    assert run.state.plan_paths == ("src/", "docs/")
    assert isinstance(write, RunTool) and write.tool == "plan_write" and write.grant


def test_rewriting_the_approved_plan_unchanged_needs_no_approval() -> None:
    run = approved_plan_run()
    run.model(("plan_write", {"content": APPROVED_PLAN}))

    assert isinstance(run.decide(), RunTool)


def test_writing_the_plan_file_with_another_tool_after_approval_is_refused() -> None:
    run = approved_plan_run()
    run.model(("write_file", {"path": "plans/PLAN.md", "content": "push to prod"}))

    [event] = committed(run.decide())

    assert event.data["error_kind"] == "policy_denied"
    assert "change it with plan_write" in event.data["message"]


def test_a_policy_denial_of_the_plan_file_names_the_policys_rule_not_the_plan_guard() -> None:
    run = approved_plan_run()
    run.gate = Policy(
        rules=(Rule(action="deny", tool="write_file", reason="no writes", origin="p:1"),)
    )
    run.model(("write_file", {"path": "plans/PLAN.md", "content": "push to prod"}))

    [event] = committed(run.decide())

    assert event.data["error_kind"] == "policy_denied"
    assert event.data["message"] == "policy_denied: no writes (rule: p:1 deny write_file)"


def test_another_tools_write_of_the_approved_plan_is_refused_where_the_policy_asks() -> None:
    run = approved_plan_run()
    run.gate = Policy(
        rules=(Rule(action="ask", tool="write_file", reason="review writes", origin="p:1"),)
    )
    run.model(("write_file", {"path": "plans/PLAN.md", "content": "push to prod"}))

    [event] = committed(run.decide())  # refused outright: no approval could make it right

    assert event.data["error_kind"] == "policy_denied"
    assert event.data["message"] == (
        "policy_denied: plans/PLAN.md holds the approved plan: change it with plan_write, "
        "which asks for a new approval (rule: plan)"
    )


def test_changes_outside_the_approved_plans_paths_are_a_verification_gap() -> None:
    run = approved_plan_run()
    run.model(
        ("write_file", {"path": "src/parser.py", "content": "x"}),
        ("write_file", {"path": "deploy.sh", "content": "rm -rf /"}),
    )
    run.perform(changed={"src/parser.py": "h1"})
    run.perform(changed={"deploy.sh": "h2"})
    run.model(content="parser fixed")

    events = after_verification(run.state, [], elapsed_s=0.0)
    run.add(*events)

    failed = next(e for e in events if e.type is EventType.VERIFICATION_FAILED)
    assert failed.data["outside_plan"] == ["deploy.sh"]
    [gap] = failed.data["gaps"]
    assert "changes outside the approved plan's paths: deploy.sh" in gap
    assert run.state.status is RunStatus.RUNNING
    assert "deploy.sh" in run.notes()[-1]


def test_a_plan_without_paths_does_not_limit_what_may_change() -> None:
    run = approved_plan_run("1. Fix the parser\n")
    run.model(("write_file", {"path": "anything.txt", "content": "x"}))
    run.perform(changed={"anything.txt": "h1"})
    run.model(content="done")

    run.add(*after_verification(run.state, [], elapsed_s=0.0))

    assert run.state.status is RunStatus.COMPLETED


# --- the control tools: what the run records and the model reads ---------------------------


def test_request_completion_finishes_its_call_and_hands_the_summary_to_verification() -> None:
    run = Run(verify=("pytest",))
    args = {"summary": "fixed the parser", "remaining_actions": ["tag the release", "announce"]}
    run.model(("request_completion", args))

    assert committed(run.decide()) == [
        NewEvent(
            type=EventType.TOOL_FINISHED,
            data={
                "call_id": "c1_0",
                "tool": "request_completion",
                "arguments": {**args, "output": None},  # as validated: defaults filled in
                "output": "completion requested: the harness runs the verifiers",
            },
        ),
        transition(
            run.state,
            RunStatus.VERIFYING,
            "completion requested",
            result={
                "summary": "fixed the parser",
                "remaining_actions": ["tag the release", "announce"],
            },
        ),
    ]


def test_request_completion_without_remaining_actions_records_only_the_summary() -> None:
    run = Run()
    run.model(("request_completion", {"summary": "done", "remaining_actions": []}))
    assert status_event(run.decide())["result"] == {"summary": "done"}


def test_a_structured_result_is_kept_with_the_summary_when_no_schema_is_asked_for() -> None:
    run = Run()
    run.model(("request_completion", {"summary": "done", "output": {"answer": 42}}))
    assert status_event(run.decide())["result"] == {"summary": "done", "output": {"answer": 42}}


def test_a_completion_tool_without_a_summary_completes_with_an_empty_summary() -> None:
    @tool(
        effect=Effect.STATE, recovery=Recovery.IDEMPOTENT, control=True, name="request_completion"
    )
    def finish() -> None:
        """Finish the task."""

    run = Run()
    run.tools = ToolRegistry([finish])  # a harness given its own completion tool
    run.model(("request_completion", {}))
    assert status_event(run.decide())["result"] == {"summary": ""}


ANSWER_SCHEMA = {
    "type": "object",
    "required": ["answer"],
    "properties": {"answer": {"type": "string"}},
}


def schema_refusal(problems: str, schema: dict[str, Any] = ANSWER_SCHEMA) -> str:
    """What a child is told when its result does not match its parent's schema."""
    return (
        "your structured result (request_completion's `output`) does not match the schema "
        f"your parent asked for: {problems}. Call request_completion again with an `output` "
        "matching: " + json.dumps(schema, sort_keys=True, separators=(",", ":"))[:4000]
    )


@pytest.mark.parametrize(
    ("args", "problems"),
    [
        ({"summary": "done"}, "missing"),
        ({"summary": "done", "output": {"answer": 42}}, "answer: 42 is not of type 'string'"),
        (
            {"summary": "done", "output": {"other": 1}},
            "(the whole output): 'answer' is a required property",
        ),
    ],
)
def test_a_result_that_does_not_match_the_schema_is_refused_naming_each_problem(
    args: dict[str, Any], problems: str
) -> None:
    run = Run(options={"output_schema": ANSWER_SCHEMA})
    run.model(("request_completion", args))
    assert committed(run.decide()) == [
        NewEvent(
            type=EventType.TOOL_FAILED,
            data={
                "call_id": "c1_0",
                "tool": "request_completion",
                "arguments": {"output": None, "remaining_actions": None, **args},
                "error_kind": "invalid_output",
                "message": schema_refusal(problems),
            },
        )
    ]


def test_several_schema_problems_are_listed_one_after_another_separated_by_semicolons() -> None:
    schema = {
        "type": "object",
        "properties": {"answer": {"type": "string"}, "count": {"type": "integer"}},
    }
    run = Run(options={"output_schema": schema})
    run.model(("request_completion", {"summary": "done", "output": {"answer": 1, "count": "x"}}))
    [event] = committed(run.decide())
    assert event.data["message"] == schema_refusal(
        "answer: 1 is not of type 'string'; count: 'x' is not of type 'integer'", schema
    )


def test_a_result_matching_the_schema_completes_with_it() -> None:
    run = Run(options={"output_schema": ANSWER_SCHEMA})
    run.model(("request_completion", {"summary": "done", "output": {"answer": "yes"}}))
    assert status_event(run.decide())["result"] == {"summary": "done", "output": {"answer": "yes"}}


def test_a_huge_schema_is_quoted_to_the_model_cut_at_four_thousand_characters() -> None:
    schema = {**ANSWER_SCHEMA, "description": "x" * 5000}
    run = Run(options={"output_schema": schema})
    run.model(("request_completion", {"summary": "done"}))
    [event] = committed(run.decide())
    assert event.data["message"] == schema_refusal("missing", schema)
    assert event.data["message"].endswith("x" * 100)


def test_completion_a_person_approved_spends_the_grant_it_ran_under() -> None:
    run = Run()
    run.gate = Policy(rules=(Rule(action="ask", tool="request_completion", reason="sign-off"),))
    run.model(("request_completion", {"summary": "done"}))
    run.perform()
    assert run.state.status is RunStatus.WAITING
    approve(run)
    [finished, _] = committed(run.decide())
    assert finished.data["grant"] == next(iter(run.state.grants))


def test_ask_user_records_the_question_and_the_run_waits_for_the_answer() -> None:
    run = Run()
    run.model(("ask_user", {"question": "Which database?"}))
    assert committed(run.decide()) == [
        NewEvent(
            type=EventType.INPUT_REQUESTED, data={"call_id": "c1_0", "question": "Which database?"}
        ),
        transition(run.state, RunStatus.WAITING, "question:c1_0"),
    ]


def test_ask_user_beside_side_effecting_calls_refuses_every_call_of_the_turn() -> None:
    run = Run(mode="auto")
    run.model(
        ("write_file", {"path": "a", "content": "x"}),
        ("ask_user", {"question": "ok?"}),
        ("run_command", {"argv": ["ls"]}),
        ("write_file", {"path": "b", "content": "y"}),
        ("read_file", {"path": "a"}),
        ("no_such_tool", {}),
    )
    message = (
        "invalid model output: ask_user cannot share a turn with side-effecting calls "
        "(run_command, write_file); ask alone, then act on the answer"
    )
    events = committed(run.decide())
    assert [(e.type, e.data["call_id"], e.data["error_kind"]) for e in events] == [
        (EventType.TOOL_FAILED, f"c1_{i}", "invalid_turn") for i in range(6)
    ]
    assert {e.data["message"] for e in events} == {message}
    assert [e.data["arguments"] for e in events][:2] == [
        {"path": "a", "content": "x"},
        {"question": "ok?"},
    ]
    assert [e.data["tool"] for e in events][:2] == ["write_file", "ask_user"]


def test_a_second_question_in_one_turn_is_refused_the_first_is_asked() -> None:
    run = Run()
    run.model(
        ("read_file", {"path": "a"}),
        ("ask_user", {"question": "first?"}),
        ("ask_user", {"question": "second?"}),
        ("ask_user", {"question": "third?"}),
    )
    message = (
        "invalid model output: one question at a time; this turn already asks another "
        "question with ask_user. Ask this one after the answer, if it is still needed"
    )
    assert committed(run.decide()) == [
        NewEvent(
            type=EventType.TOOL_FAILED,
            data={
                "call_id": call_id,
                "tool": "ask_user",
                "arguments": {"question": question},
                "error_kind": "invalid_turn",
                "message": message,
            },
        )
        for call_id, question in (("c1_2", "second?"), ("c1_3", "third?"))
    ]
    run.perform()
    action = run.decide()
    assert isinstance(action, RunTool) and action.tool == "read_file"


def test_exactly_two_questions_in_one_turn_ask_the_first_and_refuse_the_second() -> None:
    run = Run()
    run.model(("ask_user", {"question": "first?"}), ("ask_user", {"question": "second?"}))
    [refused] = committed(run.decide())
    assert (refused.type, refused.data["call_id"]) == (EventType.TOOL_FAILED, "c1_1")
    assert refused.data["error_kind"] == "invalid_turn"
    run.perform()
    assert committed(run.decide())[0].data == {"call_id": "c1_0", "question": "first?"}


def test_an_unknown_tool_before_a_write_does_not_hide_the_write_from_the_question_rule() -> None:
    run = Run(mode="auto")
    run.model(
        ("no_such_tool", {}),
        ("ask_user", {"question": "ok?"}),
        ("write_file", {"path": "a", "content": "x"}),
    )
    events = committed(run.decide())
    assert [(e.data["call_id"], e.data["error_kind"]) for e in events] == [
        ("c1_0", "invalid_turn"),
        ("c1_1", "invalid_turn"),
        ("c1_2", "invalid_turn"),
    ]
    assert "(write_file)" in events[0].data["message"]


def test_one_question_beside_reads_is_asked_in_the_models_order() -> None:
    run = Run()
    run.model(("ask_user", {"question": "first?"}), ("read_file", {"path": "a"}))
    assert types(run.decide()) == ["input_requested", "status_changed"]


def test_a_question_alone_in_its_turn_is_asked_even_when_its_tool_has_a_side_effect() -> None:
    @tool(effect=Effect.EXTERNAL, recovery=Recovery.IDEMPOTENT, control=True, name="ask_user")
    def ask(question: str) -> None:
        """Ask the user, by posting the question to the team's chat."""

    run = Run(mode="auto")
    run.tools = ToolRegistry([ask])  # a harness given its own way of asking
    run.gate = Policy(rules=(Rule(action="allow", tool="ask_user"),))
    run.model(("ask_user", {"question": "Which database?"}))
    assert committed(run.decide()) == [
        NewEvent(
            type=EventType.INPUT_REQUESTED, data={"call_id": "c1_0", "question": "Which database?"}
        ),
        transition(run.state, RunStatus.WAITING, "question:c1_0"),
    ]


# --- plan_exit ------------------------------------------------------------------------------


def test_plan_exit_outside_plan_mode_is_an_invalid_call_even_when_a_rule_allows_it() -> None:
    run = Run(mode="edit")
    run.gate = Policy(rules=(Rule(action="allow", tool="plan_exit"),))
    run.model(("plan_exit", {"summary": "go"}))
    assert committed(run.decide()) == [
        NewEvent(
            type=EventType.TOOL_FAILED,
            data={
                "call_id": "c1_0",
                "tool": "plan_exit",
                "arguments": {"summary": "go"},
                "error_kind": "invalid_call",
                "message": "plan_exit: not in plan mode",
            },
        )
    ]


def test_plan_exit_before_a_plan_is_written_says_to_write_it_first() -> None:
    run = Run(mode="plan")
    run.model(("plan_exit", {"summary": "go"}))
    assert committed(run.decide()) == [
        NewEvent(
            type=EventType.TOOL_FAILED,
            data={
                "call_id": "c1_0",
                "tool": "plan_exit",
                "arguments": {"summary": "go"},
                "error_kind": "invalid_call",
                "message": "plan_exit: write the plan with plan_write first",
            },
        )
    ]


def test_plan_exit_asks_a_person_to_approve_the_plan_with_its_text_and_summary() -> None:
    run = Run(mode="plan")
    run.add(NewEvent(type=EventType.PLAN_WRITTEN, data={"content": APPROVED_PLAN}))
    run.model(("plan_exit", {"summary": "fix the parser"}))
    request, waiting = committed(run.decide())
    plan_sha256 = plan_digest(APPROVED_PLAN)
    assert request == NewEvent(
        type=EventType.APPROVAL_REQUESTED,
        data={
            "kind": "plan",
            "call_id": "c1_0",
            "tool": "plan_exit",
            "arguments": {"summary": "fix the parser", "plan": APPROVED_PLAN},
            "digest": approval_digest(
                "plan_exit", {"summary": "fix the parser", "plan_sha256": plan_sha256}, WORKSPACE
            ),
            "plan_sha256": plan_sha256,
            "risk": "medium",
            "why": "leaving plan mode needs the plan approved",
            "expires_at": (NOW + timedelta(days=1)).isoformat(),
        },
    )
    assert waiting == transition(run.state, RunStatus.WAITING, "plan_approval:c1_0")


def test_a_plan_exit_tool_without_a_summary_asks_with_an_empty_summary() -> None:
    @tool(effect=Effect.STATE, recovery=Recovery.IDEMPOTENT, control=True, name="plan_exit")
    def leave() -> None:
        """Leave plan mode."""

    run = Run(mode="plan")
    run.tools = ToolRegistry([leave])  # a harness given its own plan_exit
    run.add(NewEvent(type=EventType.PLAN_WRITTEN, data={"content": APPROVED_PLAN}))
    run.model(("plan_exit", {}))
    request, _ = committed(run.decide())
    assert request.data["arguments"] == {"summary": "", "plan": APPROVED_PLAN}


@pytest.mark.parametrize(
    ("plan", "seeded"),
    [
        (APPROVED_PLAN, " The todos were seeded from the plan."),
        ("Fix the parser, then run the tests.", ""),
    ],
)
def test_an_approved_plan_exit_finishes_saying_the_mode_and_whether_todos_were_seeded(
    plan: str, seeded: str
) -> None:
    run = Run(mode="plan", options={"plan_then": "auto"})
    run.add(NewEvent(type=EventType.PLAN_WRITTEN, data={"content": plan}))
    run.model(("plan_exit", {"summary": "go"}))
    run.perform()
    approve(run)
    events = committed(run.decide())
    assert events[-1] == NewEvent(
        type=EventType.TOOL_FINISHED,
        data={
            "call_id": "c1_0",
            "tool": "plan_exit",
            "arguments": {"summary": "go"},
            "grant": next(iter(run.state.grants)),
            "output": f"plan approved; you are now in auto mode.{seeded}",
        },
    )
    assert [e.type for e in events[:2]] == [EventType.PLAN_APPROVED, EventType.MODE_CHANGED]


# --- waiting, pausing, warning --------------------------------------------------------------


def waiting_on_child(run: Run, child: str = "run_child") -> None:
    run.add(
        NewEvent(
            type=EventType.WAITING_ON_CHILD,
            data={"call_id": "c9", "tool": "agent_wait", "child_run_id": child, "what": "x"},
        )
    )
    run.perform()  # the parent waits too
    assert run.state.status is RunStatus.WAITING


def test_a_parent_waits_while_its_child_waits_for_a_person() -> None:
    run = Run()
    waiting_on_child(run)
    assert run.state.reason == "child_waiting:run_child"
    assert run.decide() == Halt(status=RunStatus.WAITING)  # status unknown
    run.child_statuses = {"run_child": "waiting", "run_other": "running"}
    assert run.decide() == Halt(status=RunStatus.WAITING)


def test_a_parent_whose_child_no_longer_waits_goes_on_told_how_to_collect_it() -> None:
    run = Run()
    waiting_on_child(run)
    run.child_statuses = {"run_child": "completed"}
    assert committed(run.decide()) == [
        NewEvent(
            type=EventType.NOTE_ADDED,
            data={
                "text": "Child run run_child no longer waits for a person (it is completed "
                'now). Collect its result with agent_wait(["run_child"]) or '
                'agent_result("run_child").'
            },
        ),
        transition(run.state, RunStatus.RUNNING, None),
    ]


def test_an_expired_approval_fails_the_run_with_the_request_and_the_unfinished_todos() -> None:
    run = Run(mode="ask")
    run.add(
        NewEvent(
            type=EventType.TODO_UPDATED,
            data={"todos": [{"content": "write a", "status": "in_progress"}]},
        )
    )
    run.model(("write_file", {"path": "a.txt", "content": "x"}))
    run.perform()
    pending = run.state.pending
    assert pending is not None and pending.expires_at is not None
    action = run.decide(now=datetime.fromisoformat(pending.expires_at) + timedelta(seconds=1))
    assert committed(action) == [
        transition(
            run.state,
            RunStatus.FAILED,
            "approval_timeout",
            result={"unfinished": ["write a"], "expired": pending.to_dict()},
        )
    ]


@pytest.mark.parametrize(
    ("asked", "reason"),
    [
        ({}, "paused by someone"),
        ({"by": "ana"}, "paused by ana"),
        ({"by": "ana", "reason": "lunch"}, "paused by ana: lunch"),
    ],
)
def test_a_pause_request_pauses_the_run_saying_who_asked_and_why(
    asked: dict[str, Any], reason: str
) -> None:
    run = Run()
    run.add(NewEvent(type=EventType.PAUSE_REQUESTED, data=asked))
    assert committed(run.decide()) == [transition(run.state, RunStatus.PAUSED, reason)]


def test_the_budget_warning_note_names_the_dimensions_in_words() -> None:
    run = Run(max_tool_calls=10, max_wall_seconds=100)
    run.state = RunState.from_dict(
        {**run.state.to_dict(), "usage": {"tool_calls": 9, "wall_seconds": 90.0}}
    )
    note = committed(run.decide())[-1].data["text"]
    assert note.startswith("Budget warning: tool calls, wall time at or past 80 % of the limit.")


# --- a child failed: fail_fast, escalate ----------------------------------------------------


def failed_child(run: Run, policy: str, *, task: str | None = "port the parser") -> None:
    """A background child ``run_kid`` (agent ``coder``) spawned, then failed under ``policy``."""
    run.add(
        NewEvent(
            type=EventType.SUBAGENT_SPAWNED,
            data={"child_run_id": "run_kid", "call_id": "c0", "agent": "coder", "background": True},
        ),
        NewEvent(
            type=EventType.SUBAGENT_FINISHED,
            data={
                "child_run_id": "run_kid",
                "status": "failed",
                "reason": "budget_exhausted:steps",
                "policy": policy,
                "agent": "coder",
                "task": task,
                "inputs": {"file": "p.py"},
            },
        ),
    )


def test_a_fail_fast_child_failing_fails_the_parent_naming_the_child() -> None:
    run = Run()
    failed_child(run, "fail_fast")
    assert committed(run.decide()) == [
        transition(
            run.state,
            RunStatus.FAILED,
            "child_failed:run_kid",
            result={
                "unfinished": [],
                "child": {
                    "child_run_id": "run_kid",
                    "status": "failed",
                    "reason": "budget_exhausted:steps",
                },
            },
        )
    ]


def test_an_escalated_child_failure_asks_a_person_what_next_with_the_childs_end() -> None:
    run = Run()
    failed_child(run, "escalate")
    assert committed(run.decide()) == [
        NewEvent(
            type=EventType.APPROVAL_REQUESTED,
            data={
                "kind": "child_failure",
                "call_id": "escalate:run_kid",
                "tool": "agent_spawn",
                "arguments": {
                    "child_run_id": "run_kid",
                    "agent": "coder",
                    "task": "port the parser",
                    "status": "failed",
                    "reason": "budget_exhausted:steps",
                },
                "risk": "medium",
                "why": "child run_kid (coder) ended failed: budget_exhausted:steps. Approve to "
                "retry with a fresh child, deny with a reason to give up (the run fails), or "
                "answer with an instruction for this run",
            },
        ),
        transition(run.state, RunStatus.WAITING, "child_failure:run_kid"),
    ]


def test_a_person_giving_up_on_a_failed_child_fails_the_run_saying_who_and_why() -> None:
    run = Run()
    failed_child(run, "escalate")
    run.perform()
    denied = decide_approval(run.state, approve=False, by="ana", reason="not worth it", now=NOW)
    run.add(denied, transition(run.state, RunStatus.RUNNING, None))
    assert committed(run.decide()) == [
        transition(
            run.state,
            RunStatus.FAILED,
            "child_failed:run_kid",
            result={
                "unfinished": [],
                "child": {
                    "child_run_id": "run_kid",
                    "status": "failed",
                    "reason": "budget_exhausted:steps",
                },
                "given_up_by": "ana",
                "why": "not worth it",
            },
        )
    ]


@pytest.mark.parametrize(("task", "told"), [("port the parser", "port the parser"), (None, "")])
def test_a_person_asking_for_a_retry_spawns_a_fresh_child_with_the_same_task(
    task: str | None, told: str
) -> None:
    run = Run()
    failed_child(run, "escalate", task=task)
    run.perform()
    approve(run)
    assert run.decide() == RunTool(
        call_id="retry:run_kid",
        tool="agent_spawn",
        arguments={
            "agent": "coder",
            "task": told,
            "inputs": {"file": "p.py"},
            "background": True,
            "on_failure": "escalate",
        },
        effect="state",
        recovery="idempotent",
    )


def test_an_approval_request_says_what_kind_of_effect_the_call_has() -> None:
    run = Run(mode="ask")
    run.model(("run_command", {"argv": ["make", "test"]}))
    request, _ = committed(run.decide())
    assert (request.data["tool"], request.data["effect"]) == ("run_command", "execute")


# --- handoff, budgets, repetition: what each records ----------------------------------------


def test_a_run_that_handed_its_work_over_completes_naming_who_took_over() -> None:
    run = Run()
    run.add(
        NewEvent(
            type=EventType.TODO_UPDATED,
            data={"todos": [{"content": "port it", "status": "pending"}]},
        ),
        NewEvent(type=EventType.HANDED_OFF, data={"run_id": "run_next", "agent": "coder"}),
    )
    verifying = replace(run.state, status=RunStatus.VERIFYING)
    assert committed(run.decide()) == [
        transition(run.state, RunStatus.VERIFYING, "handing off to run_next"),
        transition(
            verifying,
            RunStatus.COMPLETED,
            "handed_off:run_next",
            result={
                "outcome": "handed_off",
                "handed_off_to": "run_next",
                "agent": "coder",
                "summary": "handed off to run run_next",
                "unfinished": ["port it"],
            },
        ),
    ]


def test_an_exhausted_budget_records_what_was_used_against_the_limit() -> None:
    run = Run(max_steps=1)
    run.model(content="", input_tokens=3, output_tokens=2)
    [exhausted, failed] = committed(run.decide())
    assert exhausted == NewEvent(
        type=EventType.BUDGET_EXHAUSTED, data={"dimension": "steps", "used": 1, "limit": 1}
    )
    assert failed.data["result"] == {"unfinished": [], "usage": run.state.usage.to_dict()}


def test_no_progress_is_recorded_at_its_step_and_the_failure_names_the_repetition() -> None:
    run = Run()
    for _ in range(3):
        run.model(("read_file", {"path": "same.txt"}))
        run.perform()
    detected, note = committed(run.decide())
    what = 'the same call read_file:{"limit":null,"offset":null,"path":"same.txt"} 3 times running'
    assert detected.data == {"what": what, "step": 3}
    assert note.data["text"].startswith(f"No progress: {what}. Stop repeating it. Re-read the goal")
    run.add(detected, note)
    for _ in range(2):
        run.model(("read_file", {"path": "same.txt"}))
        run.perform()
    assert status_event(run.decide())["result"] == {"unfinished": [], "repeated": what}


def test_in_plan_mode_no_progress_points_at_the_plan() -> None:
    run = Run(mode="plan")
    for _ in range(3):
        run.model(("read_file", {"path": "same.txt"}))
        run.perform()
    [_, note] = committed(run.decide())
    assert "you are in plan mode" in note.data["text"]
    assert "plan_exit" in note.data["text"] and "todo_write" not in note.data["text"]


def test_a_repeated_long_call_or_error_is_named_by_its_first_200_characters() -> None:
    run = Run()
    long_path = "p" * 300
    for _ in range(3):
        run.model(("read_file", {"path": long_path}))
        run.perform(fail="e" * 300)
    [detected, _] = committed(run.decide())
    signature = run.state.recent_calls[-1]
    assert len(signature) > 300 and signature.startswith("read_file:")
    assert detected.data["what"] == f"the same call {signature[:200]} 3 times running"
    run = Run()
    for i in range(3):
        run.model(("read_file", {"path": f"f{i}"}))
        run.perform(fail="e" * 300)
    [detected, _] = committed(run.decide())
    assert detected.data["what"] == f"the same error 3 times running: {'e' * 200}"


# --- one call: refusals, middleware, approvals ------------------------------------------------


def test_ask_user_beside_one_write_refuses_both() -> None:
    run = Run()
    run.model(("ask_user", {"question": "ok?"}), ("write_file", {"path": "a", "content": "x"}))
    assert [e.data["error_kind"] for e in committed(run.decide())] == ["invalid_turn"] * 2


def test_an_unknown_tool_and_bad_arguments_are_recorded_as_the_model_wrote_them() -> None:
    run = Run()
    run.model(("no_such_tool", '{"a": 1}'))
    [event] = committed(run.decide())
    assert {k: event.data[k] for k in ("call_id", "tool", "arguments", "error_kind")} == {
        "call_id": "c1_0",
        "tool": "no_such_tool",
        "arguments": {"a": 1},
        "error_kind": "unknown_tool",
    }
    run = Run()
    run.model(("read_file", '{"path": 3}'))
    [event] = committed(run.decide())
    assert (event.data["tool"], event.data["arguments"]) == ("read_file", {"path": 3})


def test_a_policy_denial_is_recorded_with_the_rule_and_a_third_one_running_blocks_the_run() -> None:
    run = Run()
    run.gate = Policy(
        rules=(Rule(action="deny", tool="run_command", reason="no commands", origin="p:1"),)
    )
    run.add(
        NewEvent(
            type=EventType.TODO_UPDATED,
            data={"todos": [{"content": "build", "status": "pending"}]},
        )
    )
    run.model(("read_file", {"path": "a"}))
    run.perform()  # a success first: the denials are the three latest outcomes
    for attempt in range(3):
        run.model(("run_command", {"argv": ["make"]}))
        events = committed(run.decide())
        [denied, *rest] = events
        assert denied.data["call_id"] == f"c{attempt + 2}_0"
        assert (denied.data["tool"], denied.data["error_kind"]) == ("run_command", "policy_denied")
        assert denied.data["arguments"].items() >= {"argv": ["make"]}.items()
        message = denied.data["message"]
        assert message.startswith("policy_denied: no commands (rule: p:1 deny run_command")
        if attempt < 2:
            assert rest == []
            run.add(*events)
    assert rest == [
        transition(
            run.state,
            RunStatus.BLOCKED,
            f"policy forbids run_command: no commands (rule: {message.partition('(rule: ')[2]}",
            result={"unfinished": ["build"]},
        )
    ]


def test_a_middleware_change_of_arguments_is_judged_and_run_with_its_notes() -> None:
    run = Run()
    run.model(("write_file", {"path": "a.txt", "content": "x"}))
    for data in (
        {"decision": "modify", "patch": {"arguments": {"path": "b.txt"}}},
        {"decision": "append", "note": "wrote elsewhere"},
    ):
        run.add(
            NewEvent(
                type=EventType.MIDDLEWARE_DECIDED,
                data={"middleware": "guard", "point": "before_tool", "call_id": "c1_0", **data},
            )
        )
    action = run.decide()
    assert isinstance(action, RunTool)
    assert action.arguments == {"path": "b.txt", "content": "x"}
    assert (action.notes, action.consult) == (("guard: wrote elsewhere",), False)


def test_a_middleware_ask_makes_an_allowed_call_wait_for_a_person() -> None:
    run = Run()
    run.model(("write_file", {"path": "a.txt", "content": "x"}))
    run.add(
        NewEvent(
            type=EventType.MIDDLEWARE_DECIDED,
            data={
                "middleware": "guard",
                "point": "before_tool",
                "call_id": "c1_0",
                "decision": "ask",
                "reason": "a person looks first",
            },
        )
    )
    request, _ = committed(run.decide())
    assert (request.data["rule"], request.data["reason"]) == (
        "middleware:guard",
        "a person looks first",
    )


def test_a_call_is_sent_to_the_middleware_when_some_listen_before_tools() -> None:
    run = Run()
    run.middleware_points = frozenset({"before_tool"})
    run.model(("read_file", {"path": "a"}))
    action = run.decide()
    assert isinstance(action, RunTool) and action.consult


def test_a_middleware_deny_around_the_model_blocks_the_run() -> None:
    run = Run()
    block = {"middleware": "guard", "point": "before_model", "decision": "deny", "reason": "no"}
    run.add(NewEvent(type=EventType.MIDDLEWARE_DECIDED, data=block))
    assert committed(run.decide()) == [
        transition(
            run.state,
            RunStatus.BLOCKED,
            "middleware_denied:guard: no (at before_model)",
            result={"unfinished": [], "middleware": block},
        )
    ]


def test_an_approved_git_command_runs_with_a_writable_git() -> None:
    run = Run(mode="auto")
    run.gate = ContainedPolicy()
    run.model(("run_command", {"argv": ["git", "commit", "-m", "x"]}))
    run.perform()
    approve(run)
    action = run.decide()
    assert isinstance(action, RunTool) and action.git_writable is True


def test_the_runs_approval_timeout_sets_when_a_request_expires() -> None:
    run = Run(mode="ask", options={"approval_timeout_s": 600})
    run.model(("write_file", {"path": "a.txt", "content": "x"}))
    request, _ = committed(run.decide())
    assert request.data["expires_at"] == (NOW + timedelta(seconds=600)).isoformat()


def test_when_the_mode_already_asks_a_plan_change_is_asked_for_under_the_modes_rule() -> None:
    run = approved_plan_run()
    run.add(NewEvent(type=EventType.MODE_CHANGED, data={"from": "edit", "to": "ask"}))
    run.model(("plan_write", {"content": "1. something else\n"}))
    request, _ = committed(run.decide())
    assert request.data["rule"] == "mode:ask"
    assert request.data["plan_sha256"] == plan_digest("1. something else\n")


def test_the_plan_file_written_by_its_absolute_path_is_refused_too() -> None:
    run = approved_plan_run()
    run.model(("write_file", {"path": f"{WORKSPACE}/plans/PLAN.md", "content": "x"}))
    [event] = committed(run.decide())
    assert event.data["error_kind"] == "policy_denied" and "plan_write" in event.data["message"]


def test_an_approved_plan_change_records_the_new_plan_under_the_call() -> None:
    run = approved_plan_run()
    new_plan = "1. Fix the parser\n2. Run the tests twice\n\nPaths:\n- src/\n"
    run.model(("plan_write", {"content": new_plan}))
    run.perform()
    approve(run)
    [approved] = committed(run.decide())
    assert approved.data == {
        "call_id": "c3_0",
        "plan_sha256": plan_digest(new_plan),
        "paths": ["src/"],
    }
