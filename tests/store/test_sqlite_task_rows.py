"""The SQLite task graph's rows and its clock: what the file holds, and when a lease ends.

The database clock is SQLite's ``julianday('now')``. Here it is replaced, on the store's
own connection, by a clock the test sets: SQLite lets a connection override a built-in
function, and the store's SQL is unchanged. Like SQLite's, the clock stands still within
one statement; ``step`` moves it on before each statement, as real time would.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from keel.core.errors import LeaseLost, StoreCorrupt, TaskNotClaimable
from keel.core.tasks import Task, TaskStatus
from keel.store.sqlite.store import SQLiteStore

UNIX_EPOCH_JULIAN_DAY = 2440587.5
DAY = 86400.0
HALF_DAY = DAY / 2  # every time below is a whole number of 1/1024 days: exact in a float


class Clock:
    """``julianday('now')`` for one connection, in days since 1970 (exact binary fractions)."""

    def __init__(self, conn: sqlite3.Connection, days: float) -> None:
        self.days = days
        self.step = 0.0
        self.readings: list[float] = []
        conn.create_function("julianday", 1, self._julianday)
        conn.set_trace_callback(self._statement)

    def _statement(self, sql: str) -> None:
        self.days += self.step

    def _julianday(self, arg: str) -> float:
        assert arg == "now", f"the task SQL only reads the clock, not {arg!r}"
        self.readings.append(self.days * DAY)
        return UNIX_EPOCH_JULIAN_DAY + self.days

    def at(self, days: float) -> datetime:
        return datetime.fromtimestamp(days * DAY, UTC)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SQLiteStore]:
    store = SQLiteStore(tmp_path / "keel.db")
    try:
        yield store
    finally:
        store.close()


@pytest.fixture
def clock(store: SQLiteStore) -> Clock:
    return Clock(store._db.connection(), days=12.0)


def rows(store: SQLiteStore, sql: str, *params: object) -> list[tuple[object, ...]]:
    return store._db.connection().execute(sql, params).fetchall()


# --- what the file holds -----------------------------------------------------------------


def test_options_and_event_data_are_stored_as_compact_json_keeping_non_ascii_text(
    store: SQLiteStore,
) -> None:
    task = store.create_task(
        "build", description="für alle", actor="p", options={"model": "m", "note": "café ✓"}
    )
    assert rows(store, "SELECT options FROM tasks WHERE id = ?", task.id) == [
        ('{"model":"m","note":"café ✓"}',)
    ]
    claimed = store.claim_task(owner="w", lease_seconds=60, task_id=task.id)
    assert claimed is not None and claimed.lease_token is not None
    store.release_task(task.id, owner="w", token=claimed.lease_token, reason="später, bitte")
    stored = rows(
        store, "SELECT seq, data FROM task_events WHERE task_id = ? ORDER BY seq", task.id
    )
    assert stored[0] == (
        1,
        '{"subject":"build","description":"für alle","blocked_by":[],'
        '"options":{"model":"m","note":"café ✓"},"idempotency_key":null}',
    )
    assert stored[2] == (3, '{"reason":"später, bitte"}')
    assert store.get_task(task.id).options == {"model": "m", "note": "café ✓"}


def test_a_write_whose_row_did_not_take_the_update_is_refused_and_records_nothing(
    store: SQLiteStore,
) -> None:
    task = store.create_task("a", actor="p")
    # The row is not the version the write read: the update changes no row.
    rows(store, "CREATE TRIGGER row_moved BEFORE UPDATE ON tasks BEGIN SELECT RAISE(IGNORE); END")
    with pytest.raises(StoreCorrupt) as err:
        store.claim_task(owner="w", lease_seconds=60, task_id=task.id)
    assert str(err.value) == (
        f"{task.id} is not a readable Keel database: task row moved under a write (seq 2)"
    )
    assert err.value.location == task.id
    assert [e.type for e in store.task_events(task.id)] == ["task_created"]
    assert store.get_task(task.id) == task


# --- one clock reading per write ---------------------------------------------------------


def written_at(clock: Clock, write: Callable[[], object]) -> tuple[object, float]:
    """Run ``write``; return its result and the first clock reading it made."""
    clock.readings.clear()
    result = write()
    assert clock.readings, "a write reads the database clock"
    return result, clock.readings[0]


def test_every_write_is_recorded_at_the_time_its_first_statement_read(
    store: SQLiteStore, clock: Clock
) -> None:
    clock.step = 1 / 1024  # 84.375 s between statements
    created, first = written_at(clock, lambda: store.create_task("a", actor="p"))
    assert isinstance(created, Task)
    assert created.created_at == created.updated_at == datetime.fromtimestamp(first, UTC)

    held, first = written_at(
        clock, lambda: store.claim_task(owner="w", lease_seconds=HALF_DAY, task_id=created.id)
    )
    assert isinstance(held, Task) and held.lease_token is not None
    assert held.updated_at == datetime.fromtimestamp(first, UTC)
    assert held.lease_expires_at == datetime.fromtimestamp(first + HALF_DAY, UTC)

    clock.days += 1  # the lease lapsed; the next claim without a task named reclaims it
    taken, first = written_at(clock, lambda: store.claim_task(owner="v", lease_seconds=HALF_DAY))
    assert isinstance(taken, Task) and taken.owner == "v"
    events = store.task_events(created.id)
    assert [e.type for e in events[-2:]] == ["task_reclaimed", "task_claimed"]
    assert {e.recorded_at for e in events[-2:]} == {datetime.fromtimestamp(first, UTC)}
    assert taken.updated_at == datetime.fromtimestamp(first, UTC)

    _, first = written_at(
        clock, lambda: store.complete_task(created.id, owner="v", token=taken.lease_token)
    )
    assert store.task_events(created.id)[-1].recorded_at == datetime.fromtimestamp(first, UTC)


# --- a lease ends at its expiry instant, for everyone ------------------------------------


def leased_until_half_past(store: SQLiteStore, clock: Clock) -> Task:
    """A task alice holds from day 12.0 until day 12.5 exactly."""
    task = store.create_task("a", actor="p")
    held = store.claim_task(owner="alice", lease_seconds=HALF_DAY, task_id=task.id)
    assert held is not None and held.lease_expires_at == clock.at(12.5)
    return held


def test_just_before_its_expiry_a_lease_is_still_held(store: SQLiteStore, clock: Clock) -> None:
    held = leased_until_half_past(store, clock)
    clock.days = 12.5 - 1 / 1024
    with pytest.raises(
        TaskNotClaimable,
        match=f"^{re.escape(f'task {held.id} cannot be claimed: alice holds it until')}",
    ):
        store.claim_task(owner="bob", lease_seconds=60, task_id=held.id)
    assert store.claim_task(owner="bob", lease_seconds=60) is None


def test_at_its_expiry_instant_the_holder_can_no_longer_write(
    store: SQLiteStore, clock: Clock
) -> None:
    held = leased_until_half_past(store, clock)
    assert held.lease_token is not None
    clock.days = 12.5
    with pytest.raises(LeaseLost) as err:
        store.heartbeat_task(held.id, owner="alice", token=held.lease_token, lease_seconds=60)
    assert str(err.value) == (
        f"lease on {held.id} is no longer held by this process; nothing was written "
        f"(the lease expired at {clock.at(12.5).isoformat()}; claim the task again to go on)"
    )
    assert store.get_task(held.id).version == held.version


def test_at_its_expiry_instant_another_claimer_takes_the_named_task(
    store: SQLiteStore, clock: Clock
) -> None:
    held = leased_until_half_past(store, clock)
    clock.days = 12.5
    taken = store.claim_task(owner="bob", lease_seconds=60, task_id=held.id)
    assert taken is not None and (taken.owner, taken.attempt) == ("bob", 2)
    reclaimed = store.task_events(held.id)[-2]
    assert (reclaimed.type, reclaimed.data["previous_owner"]) == ("task_reclaimed", "alice")


def test_at_its_expiry_instant_the_next_claim_takes_the_task(
    store: SQLiteStore, clock: Clock
) -> None:
    held = leased_until_half_past(store, clock)
    clock.days = 12.5
    taken = store.claim_task(owner="bob", lease_seconds=60)
    assert taken is not None and (taken.id, taken.owner) == (held.id, "bob")


def test_at_its_expiry_instant_anyone_may_cancel_the_task(store: SQLiteStore, clock: Clock) -> None:
    held = leased_until_half_past(store, clock)
    clock.days = 12.5
    cancelled = store.cancel_task(held.id, actor="bob", reason="nobody is on it")
    assert cancelled.status is TaskStatus.CANCELLED
    assert store.task_events(held.id)[-1].data == {
        "reason": "nobody is on it",
        "previous_status": "in_progress",
        "previous_owner": "alice",
    }
