"""The loop's decision without I/O: run state (a fold of events) in, next action out.

Every test builds the state the way the store would — by folding events — and asks
``decide`` with the real built-in tool registry and the real permission policy.
"""

from __future__ import annotations

import json
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
from keel.policy.plans import plan_digest
from keel.policy.rules import Policy
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
            catalog=RegistryCatalog(default_registry()),
            gate=Policy(),
            workspace=WORKSPACE,
            now=now,
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
