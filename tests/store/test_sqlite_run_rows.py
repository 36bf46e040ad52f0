"""A SQLite append, row by row: what a run's row holds after it, what it refuses before
writing anything, and where a process killed inside it leaves the log.

The kills are real: a child process opens the same file and appends one step with
``KEEL_FAULT`` naming a fault point (``keel.faults``); it is SIGKILLed there, and this
process reads what the file kept. The child imports the very ``keel`` this test imports.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sqlite3
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

import keel
from keel.core.errors import LogDamaged, StoreError
from keel.store.sqlite.store import SQLiteStore
from keel.store.step import fold_step
from keel.testing.stores import append, make_run, model_step, tool_step


def run_row(db: Path, run_id: str, column: str) -> object:
    with sqlite3.connect(db) as conn:
        (value,) = conn.execute(f"SELECT {column} FROM runs WHERE id = ?", (run_id,)).fetchone()
    return value


def test_a_run_row_records_its_last_append_in_utc_in_any_time_zone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "keel.db"
    store = SQLiteStore(db)
    try:
        run = make_run(store)
        monkeypatch.setenv("TZ", "Asia/Kathmandu")  # UTC+05:45
        time.tzset()
        try:
            append(store, run, model_step())
        finally:
            monkeypatch.undo()
            time.tzset()
        updated = datetime.fromisoformat(str(run_row(db, run.run_id, "updated_at")))
        assert updated.utcoffset() == timedelta(0)
        assert abs(datetime.now(UTC) - updated) < timedelta(minutes=5)
    finally:
        store.close()


def test_a_folded_step_without_one_text_per_event_is_refused_and_nothing_is_written(
    tmp_path: Path,
) -> None:
    store = SQLiteStore(tmp_path / "keel.db")
    try:
        run = make_run(store)
        step = fold_step(run, tool_step("c1"), now=datetime.now(UTC))
        for texts in (step.texts[:1], [*step.texts, step.texts[0]]):
            with pytest.raises(ValueError, match="zip"):
                store.append_folded(run.run_id, dataclasses.replace(step, texts=texts))
            assert store.load_run(run.run_id) == run
            check = store.verify_log(run.run_id)
            assert check.intact and check.events == 1
    finally:
        store.close()


def test_an_append_refused_for_no_reason_it_can_name_says_retry_not_damaged(
    tmp_path: Path,
) -> None:
    """The head is the writer's, its chain hash too, and no lease is involved, yet the
    head move changes no row (here a trigger swallows it): the store says to retry and
    does not call the log damaged."""
    store = SQLiteStore(tmp_path / "keel.db")
    try:
        run = make_run(store)
        conn = store._db.connection()
        conn.execute("CREATE TRIGGER hold BEFORE UPDATE ON runs BEGIN SELECT RAISE(IGNORE); END")
        with pytest.raises(StoreError) as err:
            append(store, run, model_step())
        assert not isinstance(err.value, LogDamaged)
        assert str(err.value) == f"append to {run.run_id} refused and no reason found; retry"
        conn.execute("DROP TRIGGER hold")
        assert store.verify_log(run.run_id).events == 1
        state, _ = append(store, run, model_step())
        assert state.last_seq == 3
    finally:
        store.close()


# --- killed inside an append -----------------------------------------------------------

CHILD = """
import sys
from keel.store.sqlite.store import SQLiteStore
from keel.testing.stores import append, tool_step

store = SQLiteStore(sys.argv[1])
append(store, store.load_run(sys.argv[2]), tool_step("c2"))
store.close()
print("appended")
"""


def append_in_a_child(db: Path, run_id: str, fault: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "KEEL_FAULT"}
    env["KEEL_FAULT"] = fault
    # The child imports the keel this process imports (not whatever is installed).
    here = str(Path(keel.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([here, *filter(None, [env.get("PYTHONPATH")])])
    return subprocess.run(
        [sys.executable, "-c", CHILD, str(db), run_id],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    ("point", "kept"),
    [
        ("append_head_advanced", False),  # the head moved, no event written yet
        ("append_mid_events", False),  # the step's first event written, not the second
        ("append_rows_written", False),  # all written, not committed
        ("append_committed", True),  # committed
    ],
)
def test_a_step_killed_at_each_point_of_its_append_is_stored_whole_or_not_at_all(
    tmp_path: Path, point: str, kept: bool
) -> None:
    db = tmp_path / "keel.db"
    store = SQLiteStore(db)
    try:
        run, _ = append(store, make_run(store), tool_step("c1"))
        assert run.last_seq == 3
    finally:
        store.close()

    killed = append_in_a_child(db, run.run_id, f"{point}:1")
    assert killed.returncode == -signal.SIGKILL, (killed.stdout, killed.stderr)
    assert "appended" not in killed.stdout

    store = SQLiteStore(db)
    try:
        events = store.read_events(run.run_id)
        assert [e.seq for e in events] == list(range(1, (5 if kept else 3) + 1))
        stored = store.load_run(run.run_id)
        assert stored.last_seq == len(events)
        if not kept:
            assert stored.to_dict() == run.to_dict()
        check = store.verify_log(run.run_id)
        assert check.intact and check.events == len(events)
        assert run_row(db, run.run_id, "last_seq") == len(events)
    finally:
        store.close()


def test_a_writer_that_holds_the_runs_state_appends_in_one_transaction(tmp_path: Path) -> None:
    """The step is folded on the state this process stored last: nothing is read before
    the write transaction (a writer that never saw the run reads the head first)."""
    db = tmp_path / "keel.db"
    warm, cold = SQLiteStore(db), SQLiteStore(db)
    try:
        run = make_run(warm)
        for store, first in ((warm, "BEGIN IMMEDIATE"), (cold, "BEGIN")):
            statements: list[str] = []
            conn = store._db.connection()
            conn.set_trace_callback(statements.append)
            try:
                run, _ = append(store, run, model_step())
            finally:
                conn.set_trace_callback(None)
            assert statements[0] == first, statements
            assert statements.count("BEGIN IMMEDIATE") == 1
    finally:
        warm.close()
        cold.close()


def test_a_wait_whose_deadline_is_reached_polls_no_more(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a clock that has not ticked since the wait began (a coarse clock), a zero
    timeout still means one look at the run: the deadline is reached, not yet to come."""
    store = SQLiteStore(tmp_path / "keel.db")
    try:
        run = make_run(store)
        readings = iter([100.0, 100.0])  # the wait's start, then its first look at the clock
        monkeypatch.setattr(time, "monotonic", lambda: next(readings, 101.0))
        statements: list[str] = []
        conn = store._db.connection()
        conn.set_trace_callback(statements.append)
        try:
            woke = store.wait_for_events(run.run_id, after=run.last_seq, timeout=0)
        finally:
            conn.set_trace_callback(None)
            monkeypatch.undo()
        assert woke is False
        assert statements.count("BEGIN") == 1, statements
    finally:
        store.close()
