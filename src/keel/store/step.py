"""What every backend does the same way when it stores a step (no SQL here).

``fold_step`` numbers a step's events, checks its status changes against the
transition table, normalises each event's data through JSON (so the state a
writer gets back equals what a reader of the log rebuilds), chains each event's
hash to the previous one's (``keel.core.chain``) and folds them: the writer hashes
only its new events, so a step stays O(new events).
No action starts on an ended run: onto a terminal state (completed, failed, blocked,
cancelled) ``fold_step`` refuses every event that begins something (``STARTS_ACTION``),
while the outcomes of what already began stay recordable.
``refuse_append`` turns a run's head row into the error that explains why an
append was not written. Ids for runs, events and artifacts are made here too.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from keel.core.chain import chain_time, event_hash, genesis, plain, plain_event_hash
from keel.core.errors import ConcurrentUpdate, InvalidTransition, LeaseLost, RunNotFound
from keel.core.events import Event, EventType, NewEvent
from keel.core.state import RunState
from keel.core.status import RunStatus, check_transition

ARTIFACT_ID_HEX = 32
_LOW_62 = (1 << 62) - 1


def dump_json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def new_run_id() -> str:
    return "run_" + uuid.uuid4().hex[:12]


def new_event_id() -> str:
    """A time-ordered UUID (version 7 layout) as 32 hex digits.

    Random UUIDs would scatter the unique index on ``event_id`` so that every
    append dirties a random page; time-ordered ones append to its last page.
    """
    rand = int.from_bytes(os.urandom(10), "big")
    value = (
        (time.time_ns() // 1_000_000) << 80
        | 0x7 << 76
        | ((rand >> 62) & 0xFFF) << 64
        | 0b10 << 62
        | (rand & _LOW_62)
    )
    return f"{value:032x}"


def artifact_id(content: bytes) -> str:
    """Content-addressed: equal bytes, equal id."""
    return "art_" + hashlib.sha256(content).hexdigest()[:ARTIFACT_ID_HEX]


# Events that begin something new: refused once the run has ended. The outcomes of what
# already began (tool_finished/failed, call_reconciled, process_started/settled,
# model_responded, subagent_finished, verification_passed/failed) and the record of
# who holds the run (lease_taken_over, task_linked) stay recordable on an ended run.
STARTS_ACTION = frozenset(
    {
        EventType.TOOL_STARTED,
        EventType.MODEL_REQUESTED,
        EventType.VERIFICATION_STARTED,
        EventType.SUBAGENT_SPAWNED,
        EventType.APPROVAL_REQUESTED,
        EventType.INPUT_REQUESTED,
        EventType.PLAN_WRITTEN,
        EventType.TODO_UPDATED,
        EventType.MODE_CHANGED,
        EventType.NOTE_ADDED,
        EventType.RUN_RESUMED,
        EventType.BUDGET_WARNING,
        EventType.NO_PROGRESS_DETECTED,
        EventType.RETRY_SCHEDULED,
    }
)


@dataclass(frozen=True, slots=True, kw_only=True)
class FoldedStep:
    """A step folded by its writer, ready to store: the store checks only that
    ``base_seq`` is still the run's last sequence (and the writer's lease)."""

    base_seq: int  # the run's last sequence the step was folded onto
    base_hash: str  # that event's chain hash, which the step's first event chains to
    base_status: RunStatus  # the run's status before the step
    state: RunState  # the run after the step
    events: list[Event]  # the step's events as they will be stored
    texts: list[str]  # each event's data as stored (JSON text)

    def then(self, more: FoldedStep) -> FoldedStep:
        """This step followed by ``more`` (folded onto this one's state), as one step."""
        if more.base_seq != self.state.last_seq:
            raise ValueError(f"step folded onto {more.base_seq}, not {self.state.last_seq}")
        return FoldedStep(
            base_seq=self.base_seq,
            base_hash=self.base_hash,
            base_status=self.base_status,
            state=more.state,
            events=[*self.events, *more.events],
            texts=[*self.texts, *more.texts],
        )


def fold_step(
    state: RunState,
    events: Sequence[NewEvent],
    *,
    now: datetime,
    encoded: Sequence[str | None] = (),
) -> FoldedStep:
    """Number, check, normalise, chain and fold one step's events onto ``state``.

    ``encoded`` may give an event's data already as ``dump_json`` text (a caller that
    encoded it to look at it), so it is not encoded twice; None or missing: encoded here.

    Raises InvalidTransition (nothing to write) if a ``status_changed`` event is
    not allowed by the transition table at that point of the step, or if an event
    that starts something (``STARTS_ACTION``) comes when the run has already ended.
    """
    loads = json.loads
    stored: list[Event] = []
    texts: list[str] = []
    base_seq, base_status = state.last_seq, state.status
    seq = state.last_seq
    run_id = state.run_id
    prev = base_hash = state.last_hash if seq else genesis(run_id)
    stamp = chain_time(now)
    # Ids, types and the time are made here (plain by construction); the run id is checked.
    link = plain_event_hash if plain(run_id) else event_hash
    given = len(encoded)
    for index, new in enumerate(events):
        seq += 1
        data = new.data
        if new.type in STARTS_ACTION and state.status.terminal:
            raise InvalidTransition(
                state.status,
                new.type.value,
                f"run {run_id} is {state.status.value}: no new action may start",
            )
        if new.type is EventType.STATUS_CHANGED:
            data = checked_status_change(state.status, data)
        known = encoded[index] if index < given and data is new.data else None
        text = known if known is not None else dump_json(data)
        event_id = new_event_id()
        prev = link(prev, run_id, seq, event_id, new.type.value, stamp, text)
        event = Event(
            run_id=run_id,
            seq=seq,
            event_id=event_id,
            type=new.type,
            recorded_at=now,
            data=loads(text),  # fold exactly what a reader of the log will see
            hash=prev,
        )
        state = state.apply(event)
        stored.append(event)
        texts.append(text)
    return FoldedStep(
        base_seq=base_seq,
        base_hash=base_hash,
        base_status=base_status,
        state=state,
        events=stored,
        texts=texts,
    )


def first_event(run_id: str, data: dict[str, Any], text: str, *, now: datetime) -> Event:
    """A new run's ``run_created`` event (seq 1), chained to the run's genesis hash;
    ``text`` is ``data`` as stored."""
    event_id = new_event_id()
    created = EventType.RUN_CREATED
    return Event(
        run_id=run_id,
        seq=1,
        event_id=event_id,
        type=created,
        recorded_at=now,
        data=data,
        hash=event_hash(genesis(run_id), run_id, 1, event_id, created.value, chain_time(now), text),
    )


def checked_status_change(current: RunStatus, data: dict[str, Any]) -> dict[str, Any]:
    """The event's data with its reason as stored; InvalidTransition if the move is illegal."""
    try:
        target = RunStatus(data["to"])
    except (KeyError, ValueError):
        raise InvalidTransition(current, str(data.get("to")), "not a run status") from None
    reason = check_transition(current, target, data.get("reason"))
    if data.get("reason") == reason and data.get("from") == current.value:
        return data
    return {**data, "from": current.value, "reason": reason}


def refuse_append(
    run_id: str,
    head: Sequence[Any] | None,
    *,
    expected_seq: int,
    lease_token: str | None,
) -> None:
    """Raise what refuses an append, given the run's head row.

    ``head`` is ``(last_seq, lease_token, lease_live, lease_owner)`` or None for
    an unknown run: RunNotFound, ConcurrentUpdate (stale sequence) or LeaseLost
    (the token is not the run's current, unexpired lease). Returns if nothing does.
    """
    if head is None:
        raise RunNotFound(run_id)
    last_seq, token, lease_live, lease_owner = head
    if last_seq != expected_seq:
        raise ConcurrentUpdate(run_id, expected_seq, last_seq)
    if lease_token is not None and (token != lease_token or not lease_live):
        if token not in (None, lease_token):
            detail = f"now held by {lease_owner}"
        elif token == lease_token:
            detail = "the lease expired"
        else:
            detail = "the lease was released"
        raise LeaseLost(run_id, detail)
