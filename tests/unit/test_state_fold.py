"""A run's state is a pure fold of its events (no store involved)."""

from __future__ import annotations

import random
from datetime import UTC, datetime

import pytest

from keel.core.events import Event, EventType, NewEvent
from keel.core.records import Grant, RunOptions
from keel.core.state import RunState, transition
from keel.core.status import RunStatus
from keel.testing.stores import legal_step

T0 = datetime(2025, 1, 1, tzinfo=UTC)


class Log:
    """Events numbered as a store would, folded as they arrive."""

    def __init__(self, *, verify: tuple[str, ...] = ()) -> None:
        self.events: list[Event] = []
        self.state = RunState(run_id="run_000000000001")
        options = RunOptions(verify=verify).to_dict()
        self.add(NewEvent(type=EventType.RUN_CREATED, data={"goal": "g", "options": options}))

    def add(self, *new: NewEvent) -> RunState:
        for n in new:
            event = Event(
                run_id=self.state.run_id,
                seq=self.state.last_seq + 1,
                event_id=f"e{self.state.last_seq + 1}",
                type=n.type,
                recorded_at=T0,
                data=n.data,
            )
            self.events.append(event)
            self.state = self.state.apply(event)
        return self.state

    def move(self, to: RunStatus, reason: str | None = None) -> RunState:
        return self.add(transition(self.state, to, reason))


def record(command: str, revision: int, passed: bool) -> dict[str, object]:
    return {
        "command": command,
        "exit_code": 0 if passed else 1,
        "duration_s": 1.0,
        "artifact": "art_1",
        "mutation_revision": revision,
        "file_hashes": {},
        "passed": passed,
    }


def test_events_must_be_applied_in_sequence() -> None:
    log = Log()
    late = Event(
        run_id=log.state.run_id,
        seq=5,
        event_id="x",
        type=EventType.NOTE_ADDED,
        recorded_at=T0,
        data={"text": "x"},
    )
    with pytest.raises(ValueError, match="5"):
        log.state.apply(late)


def test_stop_reason_is_kept_and_clears_on_return_to_running() -> None:
    log = Log()
    assert log.move(RunStatus.PAUSED, "waiting for CI").reason == "waiting for CI"
    assert log.move(RunStatus.RUNNING).reason is None


def test_usage_and_validations_survive_waiting_then_running() -> None:
    log = Log(verify=("pytest",))
    log.add(
        NewEvent(
            type=EventType.MODEL_RESPONDED,
            data={"usage": {"input_tokens": 40, "output_tokens": 2}, "cost": 0.02},
        )
    )
    log.add(
        NewEvent(type=EventType.VERIFICATION_PASSED, data={"records": [record("pytest", 0, True)]})
    )
    log.add(NewEvent(type=EventType.INPUT_REQUESTED, data={"call_id": "c1", "question": "ok?"}))
    waiting = log.move(RunStatus.WAITING, "a question")
    assert waiting.pending is not None and waiting.pending.question == "ok?"
    log.add(NewEvent(type=EventType.INPUT_RECEIVED, data={"call_id": "c1", "answer": "yes"}))
    resumed = log.move(RunStatus.RUNNING)
    assert resumed.pending is None and resumed.reason is None
    assert (resumed.usage.steps, resumed.usage.tokens, resumed.usage.cost) == (1, 42, 0.02)
    assert resumed.validations == waiting.validations and len(resumed.validations) == 1
    assert resumed.verification_gaps() == []


def test_changed_files_bump_the_mutation_revision_and_open_verification_gaps() -> None:
    log = Log(verify=("pytest",))
    log.add(
        NewEvent(type=EventType.VERIFICATION_PASSED, data={"records": [record("pytest", 0, True)]})
    )
    log.add(
        NewEvent(type=EventType.TOOL_STARTED, data={"call_id": "c1", "tool": "write_file"}),
        NewEvent(
            type=EventType.TOOL_FINISHED,
            data={"call_id": "c1", "tool": "write_file", "changed_files": {"a.py": "h1"}},
        ),
    )
    state = log.state
    assert state.changed_files == {"a.py": "h1"} and state.mutation_revision == 1
    assert state.open_calls == {}
    assert state.verification_gaps() == [
        "pytest: last run at revision 0, files changed since (now 1)"
    ]


def test_started_but_unfinished_calls_stay_open() -> None:
    log = Log()
    state = log.add(
        NewEvent(
            type=EventType.TOOL_STARTED,
            data={"call_id": "c9", "key": "k9", "tool": "run_command", "arguments": {"argv": []}},
        )
    )
    assert state.open_calls["c9"]["key"] == "k9"


def test_todos_are_replaced_as_a_whole() -> None:
    log = Log()
    log.add(
        NewEvent(
            type=EventType.TODO_UPDATED,
            data={
                "todos": [
                    {"content": "a", "status": "completed"},
                    {"content": "b", "status": "pending"},
                ]
            },
        )
    )
    assert log.state.unfinished_todos() == ["b"]
    log.add(NewEvent(type=EventType.TODO_UPDATED, data={"todos": []}))
    assert log.state.todos == ()


def test_snapshot_round_trips_and_equals_a_fresh_fold() -> None:
    rng = random.Random(7)
    for _ in range(30):
        log = Log(verify=("pytest -q",))
        for _ in range(40):
            step = legal_step(log.state, rng.randrange(10_000))
            if not step:
                break
            log.add(*step)
        assert RunState.from_dict(log.state.to_dict()) == log.state
        assert RunState.from_events(log.events) == log.state


def test_a_snapshot_from_before_grants_expired_still_loads_its_grants() -> None:
    log = Log()
    stored = {**log.state.to_dict(), "grants": {"d1": "call_1"}}

    state = RunState.from_dict(stored)

    assert state.grants == {"d1": Grant(call_id="call_1")}
    assert state.grants["d1"].expires_at is None  # recorded before expiry: it never expires
    assert RunState.from_dict(state.to_dict()) == state


def test_grants_plan_digest_and_paths_survive_the_snapshot() -> None:
    log = Log()
    log.add(
        NewEvent(
            type=EventType.APPROVAL_GRANTED,
            data={
                "call_id": "c1",
                "tool": "write_file",
                "digest": "d1",
                "expires_at": "2025-01-02T00:00:00+00:00",
            },
        ),
        NewEvent(type=EventType.PLAN_APPROVED, data={"plan_sha256": "abc", "paths": ["src/"]}),
    )

    again = RunState.from_dict(log.state.to_dict())

    assert again == log.state
    assert again.grants["d1"].expires_at == "2025-01-02T00:00:00+00:00"
    assert (again.approved_plan_sha256, again.plan_paths) == ("abc", ("src/",))


def test_a_deleted_file_outside_the_plans_paths_is_a_change_outside_the_plan() -> None:
    log = Log()
    log.add(
        NewEvent(type=EventType.PLAN_APPROVED, data={"plan_sha256": "abc", "paths": ["src/"]}),
        NewEvent(
            type=EventType.TOOL_FINISHED,
            data={
                "call_id": "c1",
                "tool": "run_command",
                "changed_files": {"src/a.py": "h", "README.md": "", "plans/PLAN.md": "p"},
            },
        ),
    )

    assert log.state.changes_outside_plan() == ["README.md"]


def responded(finish: str | None = None, calls: int = 0, **usage: int) -> NewEvent:
    data: dict[str, object] = {
        "usage": usage,
        "cost": 0.001,
        "tool_calls": [
            {"id": f"c{i}", "name": "read_file", "arguments": '{"path": "a"}'} for i in range(calls)
        ],
    }
    if finish is not None:
        data["finish_reason"] = finish
    return NewEvent(type=EventType.MODEL_RESPONDED, data=data)


def test_tokens_are_summed_by_kind_while_the_budgets_tokens_stay_input_plus_output() -> None:
    log = Log()
    log.add(
        responded(input_tokens=1000, cached_input_tokens=0, output_tokens=200, reasoning_tokens=50),
        responded(input_tokens=1200, cached_input_tokens=1000, output_tokens=100),
        responded(input_tokens=10, output_tokens=5),  # an older record: two kinds only
    )
    usage = log.state.usage
    assert (usage.input_tokens, usage.cached_input_tokens) == (2210, 1000)
    assert (usage.output_tokens, usage.reasoning_tokens) == (305, 50)
    assert usage.tokens == 2210 + 305
    assert usage.cost == 0.003 and usage.steps == 3
    assert usage.cache_hit_ratio == 1000 / 2210
    assert RunState.from_dict(log.state.to_dict()) == log.state


def test_cut_turns_running_are_counted_by_the_fold_and_survive_the_snapshot() -> None:
    log = Log()
    log.add(responded("length"), responded("length", calls=2))
    assert log.state.truncated_turns == 2
    assert log.state.turn_calls == ()  # a cut turn's calls are incomplete: none to run
    assert RunState.from_dict(log.state.to_dict()).truncated_turns == 2
    assert RunState.from_events(log.events) == log.state
    log.add(responded("tool_calls", calls=1))
    assert log.state.truncated_turns == 0
    assert [c["id"] for c in log.state.turn_calls] == ["c0"]


@pytest.mark.parametrize("finish", ["content_filter", "refusal"])
def test_the_calls_of_a_refused_turn_are_not_to_run(finish: str) -> None:
    log = Log()
    log.add(responded(finish, calls=1))
    assert log.state.turn_calls == () and log.state.truncated_turns == 0


def test_a_turn_recorded_before_finish_reasons_were_kept_runs_its_calls() -> None:
    log = Log()
    log.add(responded(None, calls=1))
    assert [c["id"] for c in log.state.turn_calls] == ["c0"]


def test_a_snapshot_from_before_token_kinds_and_cut_turns_loads_with_zeros() -> None:
    log = Log()
    log.add(responded(input_tokens=40, output_tokens=2))
    stored = log.state.to_dict()
    stored["usage"] = {k: stored["usage"][k] for k in ("steps", "tool_calls", "tokens", "cost")}
    del stored["truncated_turns"]

    state = RunState.from_dict(stored)

    assert (state.usage.tokens, state.usage.input_tokens, state.truncated_turns) == (42, 0, 0)
    assert state.usage.cache_hit_ratio is None
