"""Folding one event (keel.core.state.RunState.apply): events arrive in sequence, and
every event, even one that changes nothing else, moves the state to its position (seq,
chain hash, time) and counts its elapsed time, leaving the state it was applied to as
it was. The first event, run_created, sets what the run is."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from keel.core.events import Event, EventType
from keel.core.records import RunOptions
from keel.core.state import RunState
from keel.core.status import RunStatus

CREATED_AT = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
LATER = datetime(2026, 3, 1, 12, 5, tzinfo=UTC)


def event(seq: int, kind: EventType, *, at: datetime = LATER, **data: Any) -> Event:
    return Event(
        run_id="run_1",
        seq=seq,
        event_id=f"e{seq}",
        type=kind,
        recorded_at=at,
        data=data,
        hash=f"h{seq}",
    )


def created() -> RunState:
    return RunState(run_id="run_1").apply(
        event(1, EventType.RUN_CREATED, at=CREATED_AT, goal="g", elapsed_s=0.5)
    )


@pytest.mark.parametrize("seq", [1, 3])
def test_an_event_out_of_sequence_is_refused_naming_both_positions(seq: int) -> None:
    with pytest.raises(ValueError) as err:
        created().apply(event(seq, EventType.NOTE_ADDED, text="n"))
    assert str(err.value) == f"event {seq} applied after 1 on run_1"


@pytest.mark.parametrize(
    ("kind", "data"),
    [(EventType.RUN_RESUMED, {}), (EventType.NOTE_ADDED, {"text": "n"})],
)
def test_every_event_moves_the_state_to_its_position_and_counts_its_time(
    kind: EventType, data: dict[str, Any]
) -> None:
    before = created()
    after = before.apply(event(2, kind, elapsed_s=1.5, **data))
    assert (after.last_seq, after.last_hash, after.updated_at) == (2, "h2", LATER.isoformat())
    assert after.usage.wall_seconds == 2.0
    assert (before.last_seq, before.last_hash, before.updated_at) == (
        1,
        "h1",
        CREATED_AT.isoformat(),
    )
    assert before.usage.wall_seconds == 0.5


def test_an_event_without_elapsed_time_adds_none() -> None:
    after = created().apply(event(2, EventType.RUN_RESUMED))
    assert after.usage.wall_seconds == 0.5


def test_run_created_sets_what_the_run_is() -> None:
    options = RunOptions(mode="plan", verify=("pytest",))
    state = RunState(run_id="run_1").apply(
        event(
            1,
            EventType.RUN_CREATED,
            parent_id="run_0",
            goal="fix it",
            workspace="/ws",
            options=options.to_dict(),
            status="queued",
            task_id="task_1",
        )
    )
    assert (state.parent_id, state.goal, state.workspace, state.task_id) == (
        "run_0",
        "fix it",
        "/ws",
        "task_1",
    )
    assert (state.options, state.status, state.mode) == (options, RunStatus.QUEUED, "plan")


def test_a_bare_run_created_reads_the_defaults() -> None:
    state = RunState(run_id="run_1").apply(event(1, EventType.RUN_CREATED))
    assert (state.parent_id, state.goal, state.workspace, state.task_id) == (None, "", "", None)
    assert (state.options, state.status, state.mode) == (
        RunOptions.from_dict({}),
        RunStatus.RUNNING,
        "edit",
    )
