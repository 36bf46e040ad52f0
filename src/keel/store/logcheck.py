"""Reading a run's stored log with its hash chain checked, the same way on every backend.

A backend fetches rows ``(seq, event_id, type, recorded_at, data, hash)`` in sequence
order, with ``recorded_at`` as ``keel.core.chain.chain_time`` text and ``data`` as the
stored JSON text, plus the run's head (``last_seq``, ``last_hash``); these functions
check them (``keel.core.chain.ChainCheck``) and build events or state from them.

What a reader checks every time it reads from the database (a process trusts the
states it wrote or read itself, cached by ``(run_id, last_seq)``):

- ``load_run`` (and ``list_runs``, ``survey_runs``, an append on a cold cache): the
  snapshot's own event and every event after it are re-hashed, chained from the stored
  hash of the event before the snapshot's. Their numbering must run on without a gap
  to the run's last sequence, nothing may lie beyond it, the last hash must be the
  head the run records and the snapshot's hash its event's. That is the snapshot's
  event plus the ones after it (on SQLite about as much event text as the snapshot
  holds, and at least ``SNAPSHOT_EVERY`` events: ``SnapshotMark``; none on
  PostgreSQL, which rewrites the snapshot at every append).
- ``read_events``: every event returned, chained from the stored hash of the event
  before the first; when the read reaches the run's head, the head too.

``verify_log`` (``keel verify``) re-hashes the whole log from the genesis hash. So an
event changed or removed *before* the snapshot by someone who dropped the triggers is
found by ``keel verify`` and by any read that returns it (``keel events``), not by
``keel show``; an event inserted or removed at the end, or changed at or after the
snapshot's, is found by every reader.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime
from typing import Any

from keel.core.chain import ChainCheck, event_hash, genesis
from keel.core.errors import LogDamaged
from keel.core.events import Event, EventType
from keel.core.state import RunState
from keel.store.base import LogCheck

Row = Sequence[Any]  # (seq, event_id, type, recorded_at text, data text, hash)
EVENT_TYPES = {t.value: t for t in EventType}  # a dict lookup is ~5x cheaper than EventType(v)


def to_event(run_id: str, row: Row) -> Event:
    """An ``Event`` from a stored row; LogDamaged naming it if it cannot be read."""
    seq, event_id, kind, recorded_at, data, stored = row
    try:
        return Event(
            run_id=run_id,
            seq=seq,
            event_id=event_id,
            type=EVENT_TYPES[kind],
            recorded_at=datetime.fromisoformat(recorded_at),
            data=json.loads(data),
            hash=stored,
        )
    except (KeyError, ValueError, TypeError) as exc:
        raise LogDamaged(run_id, seq, f"unreadable ({type(exc).__name__}: {exc})") from None


def beyond(head_seq: int) -> str:
    return f"not appended by Keel (the run's last event is seq {head_seq})"


def checked_events(
    run_id: str,
    rows: Iterable[Row],
    *,
    after: int,
    limit: int | None,
    head_seq: int,
    head_hash: str | None,
) -> list[Event]:
    """The events with ``seq > after`` among ``rows``, their chain checked.

    For ``after > 0`` the rows start with event ``after`` itself, whose stored hash
    the next one chains to; ``limit`` is how many events were asked for after it.
    """
    it = iter(rows)
    if after <= 0:
        check = ChainCheck(run_id, head_seq=head_seq)
    else:
        anchor = next(it, None)
        if anchor is None or anchor[0] != after:
            if after <= head_seq:
                raise LogDamaged(run_id, after, "missing (a reader found no event there)")
            if anchor is not None:
                raise LogDamaged(run_id, anchor[0], beyond(head_seq))
            return []  # asked for events after the run's last one: there are none
        check = ChainCheck(run_id, head_seq=head_seq, after=after, prev=anchor[5])
    events = []
    for row in it:
        check.row(*row)
        events.append(to_event(run_id, row))
    if limit is None or len(events) < limit:
        check.end(head_hash)
    return events


def tail_start(snapshot_seq: int) -> int:
    """The first row a load reads: the event before the snapshot's (its hash anchors)."""
    return max(snapshot_seq - 1, 1)


def checked_state(
    run_id: str,
    snapshot: RunState,
    rows: Iterable[Row],
    *,
    head_seq: int,
    head_hash: str | None,
) -> RunState:
    """``snapshot`` with the events after it folded in, from ``rows`` starting at
    ``tail_start(snapshot.last_seq)``: the snapshot's event, every later one and the
    run's head checked."""
    snapshot_seq = snapshot.last_seq
    expect = (snapshot_seq, snapshot.last_hash)
    it = iter(rows)
    if snapshot_seq <= 1:
        check = ChainCheck(run_id, head_seq=head_seq, expect=expect)
    else:
        anchor = next(it, None)
        if anchor is None or anchor[0] != snapshot_seq - 1:
            raise LogDamaged(run_id, snapshot_seq - 1, "missing (a reader found no event there)")
        check = ChainCheck(
            run_id, head_seq=head_seq, after=snapshot_seq - 1, prev=anchor[5], expect=expect
        )
    state = snapshot
    for row in it:
        check.row(*row)
        if row[0] > snapshot_seq:
            state = state.apply(to_event(run_id, row))
    if check.seq < snapshot_seq:
        raise LogDamaged(run_id, check.seq + 1, "missing (the run's snapshot counts it)")
    check.end(head_hash)
    return state


def checked_log(
    run_id: str,
    rows: Iterable[Row],
    *,
    head_seq: int,
    head_hash: str | None,
    snapshot: Any,
) -> LogCheck:
    """The whole log of ``run_id`` (``rows`` from seq 1) checked: numbering, every hash
    from the genesis one, the run's recorded head and the hash its ``snapshot`` (parsed
    JSON; None if unreadable) records."""
    try:
        expect: tuple[int, str | None] | None = (
            int(snapshot["last_seq"]),
            snapshot.get("last_hash"),
        )
    except (ValueError, KeyError, TypeError, AttributeError):
        expect = None
    check = ChainCheck(run_id, head_seq=head_seq, expect=expect)
    row_check = check.row
    try:
        if expect is None:
            raise LogDamaged(run_id, 1, "the run's snapshot is unreadable")
        for row in rows:
            row_check(*row)
        check.end(head_hash)
        if check.seq < expect[0]:
            raise LogDamaged(
                run_id, expect[0], f"the run's snapshot counts it, the log ends at seq {check.seq}"
            )
    except LogDamaged as damage:
        return LogCheck(run_id=run_id, events=check.seq, head_hash=check.hash, damage=damage)
    return LogCheck(run_id=run_id, events=check.seq, head_hash=check.hash)


def chain_found(run_id: str, rows: Iterable[Sequence[Any]]) -> Iterator[tuple[int, str]]:
    """``(seq, hash)`` of stored rows ``(seq, event_id, type, recorded_at, data)`` chained
    as they are found, from the genesis hash (migration 0003 chains old logs with it)."""
    prev = genesis(run_id)
    for seq, event_id, kind, recorded_at, data in rows:
        prev = event_hash(prev, run_id, seq, event_id, kind, recorded_at, data)
        yield seq, prev


def undamaged(entries: Iterable[RunState | LogDamaged]) -> list[RunState]:
    """``entries`` of a survey as runs; the first damaged log raises its ``LogDamaged``."""
    listed = []
    for entry in entries:
        if isinstance(entry, LogDamaged):
            raise entry
        listed.append(entry)
    return listed


def with_chain_head(snapshot_text: str, hashes: dict[int, str]) -> dict[str, Any]:
    """A snapshot (JSON text) given the hash of the event it was folded to."""
    snapshot: dict[str, Any] = json.loads(snapshot_text)
    snapshot["last_hash"] = hashes.get(int(snapshot.get("last_seq", 0)), "")
    return snapshot


__all__ = [
    "EVENT_TYPES",
    "beyond",
    "chain_found",
    "checked_events",
    "checked_log",
    "checked_state",
    "tail_start",
    "to_event",
    "undamaged",
    "with_chain_head",
]
