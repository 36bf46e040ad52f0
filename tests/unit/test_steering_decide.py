"""Pause, resume and messages without I/O: the fold, the decision, the model's view and
the follow-up's brief, each built from events as the store would fold them."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from keel.core.events import Event, EventType, NewEvent
from keel.core.records import RunOptions, ValidationRecord
from keel.core.state import RunState, transition
from keel.core.status import RunStatus
from keel.loop.actions import CallModel, Commit, Halt, ReconcileCall, RunTool
from keel.loop.catalog import RegistryCatalog
from keel.loop.decide import Situation, decide
from keel.loop.transcript import Transcript
from keel.policy.rules import Policy
from keel.runtime.steering import FOLLOW_UP_HEADER, outcome_brief
from keel.testing.chat_rules import check_request
from keel.tools.builtin import default_registry

NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)


class Log:
    """A run's events, numbered and folded as a store would; ``events`` keeps them."""

    def __init__(self, *, verify: tuple[str, ...] = ()) -> None:
        self.state = RunState(run_id="run_00000000000a")
        self.events: list[Event] = []
        options = RunOptions(mode="auto", verify=verify).to_dict()
        self.add(
            NewEvent(
                type=EventType.RUN_CREATED,
                data={"goal": "fix the bug", "workspace": "/srv/ws", "options": options},
            )
        )

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
            self.events.append(event)
            self.state = self.state.apply(event)
        return self.state

    def move(self, to: RunStatus, reason: str | None = None) -> RunState:
        return self.add(transition(self.state, to, reason))

    def decide(self) -> Any:
        sit = Situation(
            catalog=RegistryCatalog(default_registry()),
            gate=Policy(),
            workspace=Path("/srv/ws"),
            now=NOW,
        )
        return decide(self.state, sit)


def turn(*calls: tuple[str, str, dict[str, Any]]) -> NewEvent:
    return NewEvent(
        type=EventType.MODEL_RESPONDED,
        data={
            "content": None,
            "tool_calls": [{"id": i, "name": n, "arguments": a} for i, n, a in calls],
            "finish_reason": "tool_calls",
        },
    )


def finished(call_id: str, tool: str = "read_file") -> NewEvent:
    return NewEvent(
        type=EventType.TOOL_FINISHED,
        data={"call_id": call_id, "tool": tool, "arguments": {}, "output": f"out {call_id}"},
    )


def pause_asked(by: str = "alice", reason: str | None = "lunch") -> NewEvent:
    return NewEvent(type=EventType.PAUSE_REQUESTED, data={"by": by, "reason": reason})


def message(text: str, by: str = "bob") -> NewEvent:
    return NewEvent(type=EventType.MESSAGE_RECEIVED, data={"text": text, "by": by})


def is_pause(action: Any) -> bool:
    return isinstance(action, Commit) and any(
        e.type is EventType.STATUS_CHANGED and e.data["to"] == "paused" for e in action.events
    )


# --- the decision ------------------------------------------------------------------------


def test_a_pause_request_pauses_at_the_next_step_boundary_naming_who_and_why() -> None:
    log = Log()
    log.add(pause_asked())
    action = log.decide()
    assert isinstance(action, Commit)
    (event,) = action.events
    assert event.data["to"] == "paused"
    assert event.data["reason"] == "paused by alice: lunch"
    log.add(*action.events)
    assert (log.state.status, log.state.pause_requested) == (RunStatus.PAUSED, None)
    assert log.decide() == Halt(status=RunStatus.PAUSED)  # no process resumes it on its own


def test_a_pause_without_reason_names_only_who() -> None:
    log = Log()
    log.add(pause_asked(by="token:ops", reason=None))
    action = log.decide()
    assert isinstance(action, Commit)
    assert action.events[0].data["reason"] == "paused by token:ops"


def test_a_pause_leaves_the_models_remaining_calls_for_after_the_resume() -> None:
    log = Log()
    log.add(turn(("c1", "read_file", {"path": "a"}), ("c2", "read_file", {"path": "b"})))
    assert isinstance(log.decide(), RunTool)
    log.add(finished("c1"), pause_asked())
    action = log.decide()
    assert isinstance(action, Commit) and action.events[0].data["to"] == "paused"
    log.add(*action.events)
    log.move(RunStatus.RUNNING)  # a person resumed it
    resumed = log.decide()
    assert isinstance(resumed, RunTool) and resumed.call_id == "c2"


def test_a_started_call_is_settled_before_the_pause_takes_effect() -> None:
    log = Log()
    log.add(turn(("c1", "write_file", {"path": "a.txt", "content": "x"})))
    log.add(
        NewEvent(
            type=EventType.TOOL_STARTED,
            data={"call_id": "c1", "key": "k", "tool": "write_file", "arguments": {}},
        ),
        pause_asked(),
    )
    settling = log.decide()  # the open call is settled first (here: a person is asked)
    assert not is_pause(settling)
    assert isinstance(settling, ReconcileCall | RunTool | Commit)
    log.add(finished("c1", "write_file"))
    action = log.decide()
    assert isinstance(action, Commit) and action.events[0].data["to"] == "paused"


def test_a_pause_request_outlives_verification_but_not_a_wait() -> None:
    log = Log(verify=("pytest",))
    log.add(pause_asked())
    log.move(RunStatus.VERIFYING, "completion requested")
    assert log.state.pause_requested == {"by": "alice", "reason": "lunch"}
    log.move(RunStatus.RUNNING)  # the verifiers sent it back to work: it pauses now
    action = log.decide()
    assert isinstance(action, Commit) and action.events[0].data["to"] == "paused"

    other = Log()
    other.add(pause_asked())
    other.move(RunStatus.WAITING, "question:c1")  # stopped for a person anyway
    other.move(RunStatus.RUNNING)  # the answer means go on
    assert other.state.pause_requested is None
    assert isinstance(other.decide(), CallModel)


def test_the_snapshot_keeps_a_pending_pause_and_omits_it_otherwise() -> None:
    log = Log()
    assert "pause_requested" not in log.state.to_dict()
    log.add(pause_asked())
    again = RunState.from_dict(log.state.to_dict())
    assert again == log.state and again.pause_requested == {"by": "alice", "reason": "lunch"}
    assert RunState.from_events(log.events) == log.state


# --- what the model sees -----------------------------------------------------------------


def test_a_message_is_a_user_message_naming_who_sent_it() -> None:
    log = Log()
    log.add(message("use tabs, not spaces"))
    (shown,) = Transcript(log.events).view()
    assert shown.role == "user"
    assert shown.content == "[message from bob] use tabs, not spaces"
    assert log.decide() == CallModel(step=0)  # a message does not stop anything


def test_a_message_during_a_turn_comes_after_that_turns_results() -> None:
    log = Log()
    log.add(turn(("c1", "read_file", {"path": "a"}), ("c2", "read_file", {"path": "b"})))
    log.add(finished("c1"), message("also check b"), finished("c2"))
    view = Transcript(log.events).view()
    assert [m.role for m in view] == ["assistant", "tool", "tool", "user"]
    assert view[-1].content == "[message from bob] also check b"
    wire = {
        "model": "m",
        "messages": [
            {"role": "user", "content": "fix the bug"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": c,
                        "type": "function",
                        "function": {"name": "read_file", "arguments": "{}"},
                    }
                    for c in ("c1", "c2")
                ],
            },
            *(
                {"role": m.role, "tool_call_id": m.tool_call_id, "content": m.content}
                if m.role == "tool"
                else {"role": m.role, "content": m.content}
                for m in view[1:]
            ),
        ],
    }
    assert check_request(wire) == []  # what a strict provider accepts


def test_messages_between_turns_keep_their_order() -> None:
    log = Log()
    log.add(message("first"), turn(("c1", "read_file", {})), finished("c1"), message("second"))
    contents = [m.content for m in Transcript(log.events).view() if m.role == "user"]
    assert contents == ["[message from bob] first", "[message from bob] second"]


# --- the follow-up's brief ---------------------------------------------------------------


def test_the_follow_up_brief_holds_the_first_runs_outcome_and_evidence() -> None:
    log = Log(verify=("pytest -q",))
    log.add(
        NewEvent(
            type=EventType.TODO_UPDATED,
            data={"todos": [{"content": "write docs", "status": "pending"}]},
        ),
        NewEvent(
            type=EventType.TOOL_FINISHED,
            data={"call_id": "w", "tool": "write_file", "changed_files": {"app.py": "ab"}},
        ),
    )
    record = ValidationRecord(
        command="pytest -q",
        exit_code=0,
        duration_s=1.0,
        artifact="art_out",
        mutation_revision=1,
        file_hashes={},
        passed=True,
    )
    log.add(NewEvent(type=EventType.VERIFICATION_PASSED, data={"records": [record.to_dict()]}))
    log.move(RunStatus.VERIFYING, "completion requested")
    log.add(
        transition(
            log.state,
            RunStatus.COMPLETED,
            "verified",
            result={
                "summary": "fixed the parser",
                "evidence": {"unit_tests": "artifact:art_out"},
                "outcome": "change_ready_for_approval",
                "remaining_actions": ["release it"],
            },
        )
    )
    brief = outcome_brief(log.state)
    assert brief.startswith(FOLLOW_UP_HEADER + "run_00000000000a")
    for part in (
        "Its goal was: fix the bug",
        "It ended completed (verified).",
        "Its summary: fixed the parser",
        "Its evidence: unit_tests: artifact:art_out",
        "Its outcome: change_ready_for_approval",
        "Left for people: release it",
        "$ pytest -q: passed at revision 1, output artifact:art_out",
        "Files it changed: app.py",
        "Its unfinished todos: write docs",
    ):
        assert part in brief, part


def test_the_follow_up_brief_of_a_failed_run_gives_its_error_and_structured_result() -> None:
    log = Log()
    log.add(
        transition(
            log.state,
            RunStatus.FAILED,
            "internal_error: ValueError: bad port",
            result={"output": {"port": 0}, "error": {"type": "ValueError", "message": "bad port"}},
        )
    )
    brief = outcome_brief(log.state)
    assert "It ended failed (internal_error: ValueError: bad port)." in brief
    assert 'Its structured result: {"port":0}' in brief
    assert "Its error: ValueError: bad port" in brief
    assert "Its summary" not in brief and "Its evidence" not in brief
