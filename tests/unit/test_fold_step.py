"""What a writer folds before a store writes it (keel.store.step.fold_step), without a
store: the text each event is stored as."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from keel.core.events import EventType, NewEvent
from keel.core.state import RunState
from keel.store.step import dump_json, first_event, fold_step

NOW = datetime(2026, 12, 1, 2, 11, 54, 123, tzinfo=UTC)
RUN = "run_0123456789ab"


def created() -> RunState:
    data = {"goal": "réparer le café ☕", "workspace": "/tmp/w", "status": "running"}
    return RunState(run_id=RUN).apply(first_event(RUN, data, dump_json(data), now=NOW))


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
