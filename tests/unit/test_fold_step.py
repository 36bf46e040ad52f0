"""What a writer folds before a store writes it (keel.store.step.fold_step), without a
store: the text each event is stored as."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from keel.core.chain import ChainCheck, chain_time, genesis
from keel.core.errors import InvalidTransition
from keel.core.events import Event, EventType, NewEvent
from keel.core.state import RunState
from keel.core.status import RunStatus
from keel.store.step import dump_json, first_event, fold_step

NOW = datetime(2026, 12, 1, 2, 11, 54, 123, tzinfo=UTC)
RUN = "run_0123456789ab"


def created() -> RunState:
    data = {"goal": "réparer le café ☕", "workspace": "/tmp/w", "status": "running"}
    return RunState(run_id=RUN).apply(first_event(RUN, data, dump_json(data), now=NOW))


def check_chain(run_id: str, events: list[Event], texts: list[str], head: str) -> None:
    """Re-hash ``events`` (stored as ``texts``) from the run's genesis as ``keel verify``
    does; LogDamaged names the first one that is not what its hash says."""
    check = ChainCheck(run_id, head_seq=len(events))
    for event, text in zip(events, texts, strict=True):
        stamp = chain_time(event.recorded_at)
        check.row(event.seq, event.event_id, event.type.value, stamp, text, event.hash)
    check.end(head)


def test_event_data_is_stored_as_compact_json_keeping_non_ascii_text() -> None:
    data = {"text": "café ☕", "tags": ["a", "b"], "n": {"k": 1}}
    step = fold_step(created(), [NewEvent(type=EventType.NOTE_ADDED, data=data)], now=NOW)
    assert step.texts == ['{"text":"café ☕","tags":["a","b"],"n":{"k":1}}']
    assert step.events[0].data == data
    assert dump_json(["é", {"a": None}]) == '["é",{"a":null}]'


def test_a_status_change_is_stored_as_checked_even_when_its_text_was_given() -> None:
    """The caller's text of a status change lacks what the check fills in (``from``):
    the stored text is that of the checked data, not the caller's."""
    data = {"to": "paused", "reason": "a break"}
    step = fold_step(
        created(),
        [NewEvent(type=EventType.STATUS_CHANGED, data=data)],
        now=NOW,
        encoded=[dump_json(data)],
    )
    assert json.loads(step.texts[0]) == {"to": "paused", "reason": "a break", "from": "running"}
    assert step.events[0].data == json.loads(step.texts[0])


def test_no_action_starts_on_an_ended_run_and_the_refusal_says_why() -> None:
    ends = {"to": "verifying", "reason": "done"}, {"to": "completed", "reason": "checked"}
    moves = [NewEvent(type=EventType.STATUS_CHANGED, data=dict(d)) for d in ends]
    ended = fold_step(created(), moves, now=NOW).state
    assert ended.status is RunStatus.COMPLETED
    with pytest.raises(InvalidTransition) as caught:
        fold_step(ended, [NewEvent(type=EventType.TOOL_STARTED, data={})], now=NOW)
    assert str(caught.value) == (
        f"cannot move a run from completed to tool_started: run {RUN} is completed:"
        " no new action may start"
    )
    assert caught.value.current is RunStatus.COMPLETED
    assert caught.value.target == "tool_started"


def test_a_step_onto_a_run_with_no_events_yet_chains_from_its_genesis() -> None:
    data = {"goal": "g", "workspace": "/tmp/w", "status": "running"}
    step = fold_step(
        RunState(run_id=RUN), [NewEvent(type=EventType.RUN_CREATED, data=data)], now=NOW
    )
    assert step.base_seq == 0
    assert step.base_hash == genesis(RUN)
    assert [e.seq for e in step.events] == [1]
    check_chain(RUN, step.events, step.texts, step.state.last_hash)


def test_a_run_whose_id_json_escapes_still_chains_as_verify_rehashes_it() -> None:
    """The writer's fast hash assumes fields written as is; a run id with a quote or a
    backslash takes the canonical, escaped header, so the log still checks out."""
    run_id = 'run_"odd\\id'
    data = {"goal": "g", "workspace": "/tmp/w", "status": "running"}
    first = first_event(run_id, data, dump_json(data), now=NOW)
    note = NewEvent(type=EventType.NOTE_ADDED, data={"text": "a note"})
    step = fold_step(RunState(run_id=run_id).apply(first), [note], now=NOW)
    events, texts = [first, *step.events], [dump_json(data), *step.texts]
    check_chain(run_id, events, texts, step.state.last_hash)
