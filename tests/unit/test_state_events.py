"""What each event does to a run's state (keel.core.state): the fold, event by event,
and the verification gaps read from it."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from keel.core.budget import Usage
from keel.core.events import Event, EventType
from keel.core.records import Grant, PendingRequest, RunOptions, ValidationRecord
from keel.core.state import OUTSIDE_SHOWN as OUTSIDE
from keel.core.state import RunState

NOW = datetime(2026, 3, 1, tzinfo=UTC)


class Log:
    """One run's events, folded as they come."""

    def __init__(self, **options: Any) -> None:
        self.state = RunState(run_id="run_1")
        self.add(EventType.RUN_CREATED, goal="g", options=RunOptions(**options).to_dict())

    def add(self, kind: EventType, /, **data: Any) -> RunState:
        event = Event(
            run_id="run_1",
            seq=self.state.last_seq + 1,
            event_id=f"e{self.state.last_seq + 1}",
            type=kind,
            recorded_at=NOW,
            data=data,
        )
        self.state = self.state.apply(event)
        return self.state

    def started(self, call_id: str, tool: str = "run_command", **extra: Any) -> RunState:
        return self.add(EventType.TOOL_STARTED, call_id=call_id, tool=tool, arguments={}, **extra)


def record(command: str, revision: int, passed: bool, **extra: Any) -> dict[str, Any]:
    code = 0 if passed else extra.pop("exit_code", 1)
    return ValidationRecord(
        command=command,
        exit_code=code,
        duration_s=0.1,
        artifact="art",
        mutation_revision=revision,
        file_hashes={},
        passed=passed,
        **extra,
    ).to_dict()


def test_a_log_without_events_describes_no_run() -> None:
    with pytest.raises(ValueError, match=r"^a run has at least its run_created event$"):
        RunState.from_events([])
    first = Event(
        run_id="run_7", seq=1, event_id="e1", type=EventType.RUN_CREATED, recorded_at=NOW, data={}
    )
    assert RunState.from_events([first]).run_id == "run_7"


# --- model turns ----------------------------------------------------------------------------


def test_a_model_turn_counts_its_usage_keeps_its_calls_and_answers_the_model_decisions() -> None:
    log = Log()
    log.add(EventType.MIDDLEWARE_DECIDED, point="before_model", decision="append", note="n")
    log.add(EventType.MIDDLEWARE_DECIDED, point="before_tool", call_id="c1", decision="append")
    call = {"id": "c1", "name": "read_file", "arguments": '{"path":"a"}'}
    state = log.add(
        EventType.MODEL_RESPONDED,
        tool_calls=[{**call, "extra": "x"}],
        usage={"input_tokens": 3, "output_tokens": 2},
        cost=0.25,
        finish_reason="tool_calls",
    )
    assert state.turn_calls == (call,)
    assert (state.usage.steps, state.usage.tokens, state.usage.cost) == (1, 5, 0.25)
    assert list(state.decisions) == ["call:c1"]
    bare = log.add(EventType.MODEL_RESPONDED)
    assert (bare.turn_calls, bare.truncated_turns) == ((), 0)
    assert (bare.usage.steps, bare.usage.tokens, bare.usage.cost) == (2, 5, 0.25)


def test_turns_cut_at_the_length_limit_run_no_calls_and_are_counted_until_one_is_not() -> None:
    log = Log()
    call = {"id": "c1", "name": "read_file", "arguments": "{"}
    for running in (1, 2):
        cut = log.add(EventType.MODEL_RESPONDED, tool_calls=[call], finish_reason="length")
        assert (cut.turn_calls, cut.truncated_turns) == ((), running)
    whole = log.add(EventType.MODEL_RESPONDED, tool_calls=[call], finish_reason="stop")
    assert (whole.turn_calls, whole.truncated_turns) == ((call,), 0)


# --- status -----------------------------------------------------------------------------------


def test_a_pending_request_outlives_only_a_move_to_waiting() -> None:
    log = Log()
    log.add(EventType.APPROVAL_REQUESTED, call_id="c1", digest="d", tool="t")
    waiting = log.add(EventType.STATUS_CHANGED, to="waiting", reason="approval")
    assert waiting.pending == PendingRequest(kind="approval", call_id="c1", tool="t", digest="d")
    cancelled = log.add(EventType.STATUS_CHANGED, to="cancelled", reason="stop")
    assert cancelled.pending is None


def test_a_result_is_kept_through_later_moves_that_carry_none() -> None:
    log = Log()
    log.add(EventType.STATUS_CHANGED, to="verifying", reason="done", result={"summary": "s"})
    completed = log.add(EventType.STATUS_CHANGED, to="completed", reason="verified")
    assert completed.result == {"summary": "s"}


# --- tool calls -----------------------------------------------------------------------------


@pytest.mark.parametrize("outcome", [EventType.TOOL_FINISHED, EventType.TOOL_FAILED])
def test_a_calls_outcome_counts_one_call_and_closes_only_that_call(outcome: EventType) -> None:
    log = Log()
    log.started("c1")
    log.started("c2")
    log.add(
        EventType.MIDDLEWARE_DECIDED,
        middleware="m",
        point="before_tool",
        call_id="c1",
        decision="append",
        note="n",
    )
    log.add(
        EventType.MIDDLEWARE_DECIDED,
        middleware="m",
        point="before_tool",
        call_id="c2",
        decision="append",
        note="n",
    )
    state = log.add(outcome, call_id="c1", tool="run_command", arguments={"argv": ["ls"]})
    assert state.usage.tool_calls == 1
    assert list(state.open_calls) == ["c2"]
    assert list(state.decisions) == ["call:c2"]
    assert state.recent_calls == ('run_command:{"argv":["ls"]}',)
    assert state.mutation_revision == 0 and state.changed_files == {}


@pytest.mark.parametrize("outcome", [EventType.TOOL_FINISHED, EventType.TOOL_FAILED])
def test_a_call_that_changed_files_moves_the_revision_by_one(outcome: EventType) -> None:
    log = Log()
    log.add(outcome, call_id="c1", tool="write_file", changed_files={"a.py": "h1"})
    state = log.add(outcome, call_id="c2", tool="write_file", changed_files={"b.py": "h2"})
    assert state.mutation_revision == 2
    assert state.changed_files == {"a.py": "h1", "b.py": "h2"}


def test_a_failure_without_a_message_or_tool_is_recorded_as_empty() -> None:
    state = Log().add(EventType.TOOL_FAILED, call_id="c1")
    assert state.recent_errors == ("",)
    assert state.recent_calls == (":null",)
    assert state.failed_attempts == 1


@pytest.mark.parametrize("outcome", [EventType.TOOL_FINISHED, EventType.TOOL_FAILED])
def test_the_retry_a_person_asked_for_ends_the_escalation(outcome: EventType) -> None:
    log = escalated()
    assert log.add(outcome, call_id="retry:run_kid", tool="agent_spawn").escalation is None
    log = escalated()
    assert log.add(outcome, call_id="other", tool="read_file").escalation is not None


def test_a_repetition_keeps_the_no_progress_mark_and_a_change_of_course_drops_it() -> None:
    log = Log()
    for _ in range(3):
        log.add(EventType.TOOL_FAILED, call_id="c", tool="read_file", arguments={}, message="boom")
    log.add(EventType.NO_PROGRESS_DETECTED)
    marked = log.state.no_progress_step
    assert marked == 0
    same_error = log.add(
        EventType.TOOL_FAILED, call_id="d", tool="grep", arguments={}, message="boom"
    )
    assert same_error.no_progress_step == marked
    same_call = log.add(EventType.TOOL_FINISHED, call_id="e", tool="grep", arguments={})
    assert same_call.no_progress_step == marked
    changed = log.add(EventType.TOOL_FINISHED, call_id="f", tool="glob", arguments={})
    assert changed.no_progress_step is None


def test_a_success_without_a_tool_is_recorded_under_an_empty_tool_name() -> None:
    state = Log().add(EventType.TOOL_FINISHED, call_id="c1")
    assert state.recent_errors == ("",)
    assert state.recent_calls == (":null",)


def test_the_same_call_failing_with_another_error_keeps_the_no_progress_mark() -> None:
    log = Log()
    for _ in range(3):
        log.add(EventType.TOOL_FAILED, call_id="c", tool="read_file", arguments={}, message="boom")
    log.add(EventType.NO_PROGRESS_DETECTED)
    again = log.add(
        EventType.TOOL_FAILED, call_id="d", tool="read_file", arguments={}, message="other"
    )
    assert again.no_progress_step == 0


def test_a_different_successful_call_ends_a_streak_of_errors_whatever_they_said() -> None:
    # A success carries no error, so it continues no streak of errors, whatever text
    # the tool failed with (placeholder-like texts included).
    for message in ("boom", "XXXX", "None", "error: file not found"):
        log = Log()
        for n in range(3):
            log.add(EventType.TOOL_FAILED, call_id=f"c{n}", tool=f"t{n}", message=message)
        log.add(EventType.NO_PROGRESS_DETECTED)
        assert log.state.no_progress_step == 0
        done = log.add(EventType.TOOL_FINISHED, call_id="d", tool="other", arguments={})
        assert done.no_progress_step is None, message


def test_an_error_after_a_success_is_no_repetition_of_the_earlier_error() -> None:
    log = Log()
    log.add(EventType.TOOL_FAILED, call_id="c", tool="a", arguments={}, message="boom")
    log.add(EventType.TOOL_FINISHED, call_id="d", tool="b", arguments={})
    log.add(EventType.NO_PROGRESS_DETECTED)
    again = log.add(EventType.TOOL_FAILED, call_id="e", tool="c", arguments={}, message="boom")
    assert again.no_progress_step is None


def test_an_attempt_spends_the_grant_it_names_and_any_grant_of_its_call() -> None:
    log = Log()
    for digest, call in (("d1", "c1"), ("d2", "c2"), ("d3", "c3")):
        log.add(EventType.APPROVAL_GRANTED, call_id=call, digest=digest, tool="t")
    state = log.started("c2", grant="d1")
    assert state.grants == {"d3": Grant(call_id="c3", tool="t")}


def test_an_attempt_spends_the_grant_it_names_though_its_own_call_has_none() -> None:
    log = Log()
    for digest, call in (("d1", "c1"), ("d3", "c3")):
        log.add(EventType.APPROVAL_GRANTED, call_id=call, digest=digest, tool="t")
    assert log.started("c9", grant="d1").grants == {"d3": Grant(call_id="c3", tool="t")}


def test_the_same_error_as_the_latest_keeps_the_no_progress_mark() -> None:
    log = Log()
    for n, message in enumerate(("a", "b", "boom")):
        log.add(EventType.TOOL_FAILED, call_id=f"c{n}", tool=f"t{n}", arguments={}, message=message)
    log.add(EventType.NO_PROGRESS_DETECTED)
    again = log.add(EventType.TOOL_FAILED, call_id="d", tool="other", arguments={}, message="boom")
    assert again.no_progress_step == 0


# --- processes and reconciliation -----------------------------------------------------------


PROCESS = {"pgid": 41, "host": "h", "boot_id": "b", "start_ticks": 7, "timeout_s": 30.0}


def test_an_open_calls_process_and_its_settling_are_remembered() -> None:
    log = Log()
    log.started("c1")
    started = log.add(EventType.PROCESS_STARTED, call_id="c1", **PROCESS, other="x")
    assert started.open_calls["c1"]["process"] == PROCESS
    settled = log.add(EventType.PROCESS_SETTLED, call_id="c1", outcome="killed")
    assert settled.open_calls["c1"]["settled"] == "killed"
    assert settled.open_calls["c1"]["process"] == PROCESS
    assert log.add(EventType.PROCESS_SETTLED, call_id="c1").open_calls["c1"]["settled"] == ""


@pytest.mark.parametrize("kind", [EventType.PROCESS_STARTED, EventType.PROCESS_SETTLED])
def test_a_process_of_a_call_no_longer_open_changes_nothing(kind: EventType) -> None:
    log = Log()
    log.started("c1")
    before = log.state.open_calls
    assert log.add(kind, call_id="gone", **PROCESS).open_calls == before
    assert log.add(kind, **PROCESS).open_calls == before


def test_a_reconciled_call_is_closed_unless_it_is_run_again() -> None:
    log = Log()
    log.started("c1")
    log.started("c2")
    rerun = log.add(EventType.CALL_RECONCILED, call_id="c1", outcome="rerun")
    assert list(rerun.open_calls) == ["c1", "c2"]
    done = log.add(
        EventType.CALL_RECONCILED, call_id="c1", outcome="done", changed_files={"a": "h"}
    )
    assert list(done.open_calls) == ["c2"]
    assert (done.changed_files, done.mutation_revision) == ({"a": "h"}, 1)
    unchanged = log.add(EventType.CALL_RECONCILED, call_id="c2", outcome="done")
    assert (unchanged.open_calls, unchanged.mutation_revision) == ({}, 1)


# --- approvals, questions, escalations ------------------------------------------------------


def test_an_approval_request_waits_for_its_kind_and_supersedes_only_its_own_grant() -> None:
    log = Log()
    log.add(EventType.APPROVAL_GRANTED, call_id="c0", digest="old", tool="t")
    log.add(EventType.APPROVAL_GRANTED, call_id="c9", digest="keep", tool="t")
    state = log.add(EventType.APPROVAL_REQUESTED, call_id="c1", digest="old", tool="t")
    assert state.pending == PendingRequest(kind="approval", call_id="c1", tool="t", digest="old")
    assert list(state.grants) == ["keep"]
    other = log.add(EventType.APPROVAL_REQUESTED, call_id="c2", digest="new", kind="plan")
    assert (other.pending is not None and other.pending.kind, list(other.grants)) == (
        "plan",
        ["keep"],
    )


def test_a_grant_without_a_digest_grants_nothing_but_ends_the_wait() -> None:
    log = Log()
    log.add(EventType.APPROVAL_REQUESTED, call_id="c1", digest="d", tool="t")
    state = log.add(EventType.APPROVAL_GRANTED, call_id="c1", tool="t")
    assert (state.pending, state.grants) == (None, {})


def escalated() -> Log:
    log = Log()
    log.add(EventType.SUBAGENT_SPAWNED, child_run_id="run_kid", call_id="c0", agent="coder")
    log.add(
        EventType.SUBAGENT_FINISHED,
        child_run_id="run_kid",
        status="failed",
        reason="r",
        policy="escalate",
        agent="coder",
        task="t",
        inputs={"x": 1},
    )
    log.add(EventType.APPROVAL_REQUESTED, call_id="escalate:run_kid", kind="child_failure")
    return log


def test_a_child_failure_approved_asks_for_a_retry() -> None:
    log = escalated()
    state = log.add(EventType.APPROVAL_GRANTED, call_id="escalate:run_kid", kind="child_failure")
    assert state.pending is None and state.grants == {}
    assert state.escalation is not None and state.escalation["decision"] == "retry"
    assert state.escalation["retry_call"] == "retry:run_kid"


def test_a_child_failure_denied_gives_up_saying_who_and_why() -> None:
    log = escalated()
    before = log.state.escalation
    assert before is not None
    state = log.add(
        EventType.APPROVAL_DENIED, call_id="e", kind="child_failure", by="ana", reason="enough"
    )
    assert state.pending is None
    assert state.escalation == {**before, "decision": "give_up", "by": "ana", "why": "enough"}


def test_an_ordinary_decision_leaves_an_escalation_alone() -> None:
    log = escalated()
    before = log.state.escalation
    granted = log.add(EventType.APPROVAL_GRANTED, call_id="c1", digest="d", tool="t")
    assert granted.escalation == before and "d" in granted.grants
    denied = log.add(EventType.APPROVAL_DENIED, call_id="c2", by="ana", reason="no")
    assert (denied.escalation, denied.pending) == (before, None)


def test_a_child_failure_decision_without_an_escalation_is_an_ordinary_one() -> None:
    log = Log()
    granted = log.add(EventType.APPROVAL_GRANTED, call_id="c", kind="child_failure", digest="d")
    assert granted.escalation is None and "d" in granted.grants
    log.add(EventType.APPROVAL_REQUESTED, call_id="c", kind="child_failure")
    denied = log.add(EventType.APPROVAL_DENIED, call_id="c", kind="child_failure", by="a")
    assert (denied.escalation, denied.pending) == (None, None)


def test_a_question_waits_and_its_answer_answers_that_call_only() -> None:
    log = Log()
    log.add(
        EventType.MODEL_RESPONDED,
        tool_calls=[
            {"id": "q1", "name": "ask_user", "arguments": "{}"},
            {"id": "r1", "name": "read_file", "arguments": "{}"},
        ],
    )
    asked = log.add(EventType.INPUT_REQUESTED, call_id="q1", question="Which?")
    assert asked.pending == PendingRequest(kind="question", call_id="q1", question="Which?")
    answered = log.add(EventType.INPUT_RECEIVED, call_id="q1", answer="That.")
    assert answered.pending is None
    assert [c["id"] for c in answered.turn_calls] == ["r1"]


def test_an_instruction_about_a_failed_child_ends_its_escalation() -> None:
    log = escalated()
    kept = log.add(EventType.INPUT_RECEIVED, call_id="other", answer="x")
    assert kept.escalation is not None
    cleared = log.add(EventType.INPUT_RECEIVED, call_id="escalate:run_kid", answer="do it yourself")
    assert cleared.escalation is None and cleared.pending is None


# --- children ---------------------------------------------------------------------------------


def finished_child(policy: str | None, **extra: Any) -> RunState:
    log = Log()
    log.add(EventType.SUBAGENT_SPAWNED, child_run_id="run_kid", call_id="c0", agent="coder")
    data = {"child_run_id": "run_kid", "status": "failed", "reason": "r", "policy": policy}
    return log.add(EventType.SUBAGENT_FINISHED, **data, usage={"tokens": 5, "cost": 0.5}, **extra)


def test_a_child_failing_under_each_policy_marks_what_the_parent_does_next() -> None:
    fail_fast = finished_child("fail_fast")
    assert fail_fast.child_failure == {"child_run_id": "run_kid", "status": "failed", "reason": "r"}
    assert fail_fast.escalation is None and fail_fast.usage.tokens == 5
    escalate = finished_child("escalate", agent="coder", task="t", inputs={"x": 1})
    assert escalate.escalation == {
        "child_run_id": "run_kid",
        "status": "failed",
        "reason": "r",
        "call_id": "escalate:run_kid",
        "retry_call": "retry:run_kid",
        "agent": "coder",
        "task": "t",
        "inputs": {"x": 1},
        "decision": None,
    }
    assert escalate.child_failure is None and escalate.usage.cost == 0.5
    best_effort = finished_child("best_effort")
    assert (best_effort.child_failure, best_effort.escalation) == (None, None)
    assert best_effort.usage == Usage(tokens=5, cost=0.5)
    for ended in (fail_fast, escalate, best_effort):
        assert ended.children["run_kid"].status == "failed"


def test_the_end_of_a_child_twice_changes_nothing_the_second_time() -> None:
    log = Log()
    log.add(EventType.SUBAGENT_SPAWNED, child_run_id="run_kid", call_id="c0", agent="coder")
    end = {"child_run_id": "run_kid", "status": "completed", "usage": {"tokens": 5}}
    once = log.add(EventType.SUBAGENT_FINISHED, **end)
    twice = log.add(EventType.SUBAGENT_FINISHED, **{**end, "policy": "fail_fast"})
    assert (twice.usage, twice.child_failure, twice.children) == (once.usage, None, once.children)


# --- smaller events ---------------------------------------------------------------------------


def test_smaller_events_record_what_they_carry() -> None:
    log = Log()
    assert log.add(EventType.TASK_LINKED, task_id="task_1").task_id == "task_1"
    handed = log.add(EventType.HANDED_OFF, run_id="run_2", agent="coder")
    assert handed.handoff == {"run_id": "run_2", "agent": "coder"}
    waiting = log.add(
        EventType.WAITING_ON_CHILD, call_id="c5", tool="agent_wait", child_run_id="run_k", what="w"
    )
    assert waiting.pending == PendingRequest(
        kind="child",
        call_id="c5",
        tool="agent_wait",
        arguments={"child_run_id": "run_k", "what": "w"},
    )
    bare = log.add(EventType.WAITING_ON_CHILD)
    assert bare.pending is not None and bare.pending.call_id == ""
    assert log.add(EventType.NOTE_ADDED).notes[-1] == ""
    assert log.add(EventType.TODO_UPDATED).todos == ()
    warned = log.add(EventType.BUDGET_WARNING, dimension="steps")
    assert (
        log.add(EventType.BUDGET_WARNING, dimension="steps").warned == warned.warned == ("steps",)
    )
    assert log.add(EventType.VERIFICATION_PASSED).validations == ()
    spawned = log.add(EventType.SUBAGENT_SPAWNED, child_run_id="run_c", call_id="c9", agent="a")
    assert spawned.children["run_c"].call_id == "c9"


def test_middleware_decisions_wait_at_their_point_and_a_deny_around_the_model_blocks() -> None:
    log = Log()
    model = {"middleware": "m", "point": "before_model", "decision": "modify", "patch": {}}
    tool = {"middleware": "m", "point": "before_tool", "call_id": "c1", "decision": "append"}
    log.add(EventType.MIDDLEWARE_DECIDED, **model)
    log.add(EventType.MIDDLEWARE_DECIDED, **model)
    state = log.add(EventType.MIDDLEWARE_DECIDED, **tool)
    assert state.decisions == {"model": (model, model), "call:c1": (tool,)}
    assert state.middleware_block is None
    other = {"middleware": "m", "point": "after_tool", "call_id": "c1", "decision": "deny"}
    assert log.add(EventType.MIDDLEWARE_DECIDED, **other).decisions == state.decisions
    tool_deny = {"middleware": "m", "point": "before_tool", "call_id": "c2", "decision": "deny"}
    assert log.add(EventType.MIDDLEWARE_DECIDED, **tool_deny).middleware_block is None
    for point in ("before_model", "after_model"):
        blocked = Log().add(
            EventType.MIDDLEWARE_DECIDED, middleware="m", point=point, decision="deny", reason="r"
        )
        assert blocked.middleware_block == {
            "middleware": "m",
            "point": point,
            "decision": "deny",
            "reason": "r",
        }
    modify = Log().add(EventType.MIDDLEWARE_DECIDED, point="after_model", decision="modify")
    assert modify.middleware_block is None


@pytest.mark.parametrize(
    ("summary", "tokens", "cost"),
    [
        ({"usage": {"input_tokens": 7, "output_tokens": 3}, "cost": 0.25}, 10, 0.25),
        ({"usage": {"input_tokens": 7}}, 7, 0.0),
        ({"usage": {"input_tokens": True, "output_tokens": -2}, "cost": 0.5}, 0, 0.5),
        ({"usage": {"input_tokens": 1.5, "output_tokens": 1}}, 1, 0.0),
        ({"usage": "lots", "cost": 0.5}, 0, 0.5),
        ({"cost": 0.5}, 0, 0.5),
    ],
)
def test_a_compactions_summary_call_counts_its_tokens_and_cost(
    summary: dict[str, Any], tokens: int, cost: float
) -> None:
    state = Log().add(EventType.CONTEXT_COMPACTED, summary=summary)
    assert (state.usage.tokens, state.usage.cost, state.usage.steps) == (tokens, cost, 0)


def test_a_compaction_without_a_summary_call_changes_no_usage() -> None:
    assert Log().add(EventType.CONTEXT_COMPACTED, summary="text").usage == Usage()
    assert Log().add(EventType.CONTEXT_COMPACTED).usage == Usage()


# --- sign-offs and verification gaps --------------------------------------------------------


def test_a_signoff_asked_for_waits_for_that_person_with_the_commands_records() -> None:
    log = Log()
    state = log.add(
        EventType.SIGNOFF_REQUESTED, verifier="security", records=[record("pytest", 0, True)]
    )
    assert state.pending == PendingRequest(
        kind="signoff", call_id="signoff:security", question="security"
    )
    assert [r.command for r in state.validations] == ["pytest"]
    assert log.add(EventType.SIGNOFF_REQUESTED, verifier="x").validations == state.validations


def test_a_persons_signoff_ends_the_wait_for_it() -> None:
    log = Log(signoffs=("security",))
    log.add(EventType.SIGNOFF_REQUESTED, verifier="security")
    state = log.add(
        EventType.SIGNOFF_RECORDED, verifier="security", passed=True, mutation_revision=0
    )
    assert state.pending is None
    assert state.verification_gaps() == []


@pytest.mark.parametrize("passed", [True, False])
def test_a_signoff_is_recorded_as_the_persons_verdict_on_a_revision(passed: bool) -> None:
    log = Log()
    log.add(EventType.TOOL_FINISHED, call_id="c", tool="write_file", changed_files={"a": "h"})
    state = log.add(
        EventType.SIGNOFF_RECORDED,
        verifier="security",
        passed=passed,
        mutation_revision=1,
        note="ana: ok",
        artifact="art_1",
    )
    assert state.validations[-1] == ValidationRecord(
        command="human:security",
        exit_code=0 if passed else 1,
        duration_s=0.0,
        artifact="art_1",
        mutation_revision=1,
        file_hashes={"a": "h"},
        passed=passed,
        note="ana: ok",
    )
    assert state.pending is None


def gaps(**options: Any) -> list[str]:
    return Log(**options).state.verification_gaps()


def test_a_command_that_could_not_run_says_no_change_fixes_it() -> None:
    log = Log(verify=("pytest",))
    log.add(EventType.VERIFICATION_FAILED, records=[record("pytest", 0, False, exit_code=127)])
    assert log.state.verification_gaps() == [
        "pytest: failed with exit code 127 (the command was not found: no change to the "
        "workspace fixes it)"
    ]
    assert log.state.unfixable_gaps() == ["pytest: the command was not found"]
    log.add(EventType.VERIFICATION_FAILED, records=[record("pytest", 0, False, exit_code=2)])
    assert log.state.verification_gaps() == ["pytest: failed with exit code 2"]
    assert log.state.unfixable_gaps() == []


def test_a_command_that_could_not_run_at_an_older_revision_is_no_longer_unfixable() -> None:
    log = Log(verify=("pytest",))
    log.add(EventType.VERIFICATION_FAILED, records=[record("pytest", 0, False, exit_code=127)])
    log.add(EventType.WORKSPACE_CHANGED, changed_files={"a": "h"})
    assert log.state.unfixable_gaps() == []


@pytest.mark.parametrize(("count", "more"), [(OUTSIDE, ""), (OUTSIDE + 1, " and 1 more")])
def test_changes_outside_the_plan_are_named_up_to_twenty(count: int, more: str) -> None:
    log = Log()
    log.add(EventType.PLAN_APPROVED, plan_sha256="p", paths=["src/", "docs/"])
    files = {f"f{i:02}.txt": "h" for i in range(count)}
    log.add(EventType.TOOL_FINISHED, call_id="c", tool="write_file", changed_files=files)
    named = ", ".join(sorted(files)[:OUTSIDE])
    assert log.state.verification_gaps() == [
        f"changes outside the approved plan's paths: {named}{more} (the plan names src/, "
        "docs/); if they belong to the task, name them under Paths: with plan_write (a person "
        "approves the new plan)"
    ]


def test_a_plan_naming_no_paths_says_so_in_the_gap() -> None:
    log = Log()
    log.add(EventType.PLAN_APPROVED, plan_sha256="p", paths=[])
    log.add(EventType.TOOL_FINISHED, call_id="c", tool="write_file", changed_files={"a": "h"})
    assert "(the plan names no paths)" in log.state.verification_gaps()[0]


def test_a_declined_signoff_without_a_note_says_a_person_declined() -> None:
    log = Log(signoffs=("security",))
    log.add(EventType.SIGNOFF_RECORDED, verifier="security", passed=False, mutation_revision=0)
    assert log.state.verification_gaps() == ["security: a person declined to sign off"]


def review(revision: int, passed: bool, **extra: Any) -> dict[str, Any]:
    return record("agent:review", revision, passed, **extra)


@pytest.mark.parametrize(
    ("records", "gap", "unfixable"),
    [
        (
            [],
            "review (reviewer agent reviewer): not reviewed yet (it reviews once the commands "
            "pass)",
            [],
        ),
        ([review(0, True)], None, []),
        (
            [review(0, False, note="2 blocking issues")],
            "review (reviewer agent reviewer): 2 blocking issues",
            [],
        ),
        ([review(0, False)], "review (reviewer agent reviewer): not passed", []),
        (
            [review(0, False, note="n", unfixable="the reviewer ran out of budget")],
            "review (reviewer agent reviewer): the reviewer ran out of budget",
            ["review: the reviewer ran out of budget"],
        ),
    ],
)
def test_a_reviewer_agents_gap_says_how_far_its_review_got(
    records: list[dict[str, Any]], gap: str | None, unfixable: list[str]
) -> None:
    log = Log(reviewers=(("review", "reviewer"),))
    if records:
        log.add(EventType.VERIFICATION_FAILED, records=records)
    assert log.state.review_gaps() == ([] if gap is None else [gap])
    assert log.state.unfixable_gaps() == unfixable


def test_a_review_of_an_older_revision_is_stale_and_no_longer_unfixable() -> None:
    log = Log(reviewers=(("review", "reviewer"),))
    log.add(EventType.VERIFICATION_FAILED, records=[review(0, False, unfixable="u")])
    log.add(EventType.WORKSPACE_CHANGED, changed_files={"a": "h"})
    assert log.state.review_gaps() == [
        "review (reviewer agent reviewer): reviewed revision 0, files changed since (now 1)"
    ]
    assert log.state.unfixable_gaps() == []
