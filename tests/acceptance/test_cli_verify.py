"""`keel verify` and what the other commands do with a damaged event log, end to end.

Logs are damaged past Keel with raw sqlite3 / psycopg (``OutOfBand``): an event inserted
at the end, the last one changed or the last one deleted with the triggers dropped, or
one in the middle changed. ``keel verify`` names the event; ``keel runs`` lists the
other runs and marks the damaged one; ``show``, ``events`` and ``approve`` on it exit 2
with one line naming it and no traceback.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from keel.core.state import RunState
from keel.core.status import RunStatus
from keel.store.base import Store
from keel.store.url import open_store
from keel.testing.cli import KeelWorkspace, expect, flat, one_line_error
from keel.testing.stores import (
    OutOfBand,
    append,
    legal_step,
    make_run,
    model_step,
    postgres_unavailable,
    scratch_database,
    tool_step,
)

Damage = Callable[[OutOfBand, RunState], int]  # tampers, returns the seq to be named


def inserted(db: OutOfBand, run: RunState) -> int:
    db.insert_event(run.run_id, run.last_seq + 1)
    return run.last_seq + 1


def changed_last(db: OutOfBand, run: RunState) -> int:
    db.drop_event_triggers()
    db.change_event(run.run_id, run.last_seq, '{"from":"running","to":"completed"}')
    return run.last_seq


def deleted_last(db: OutOfBand, run: RunState) -> int:
    db.drop_event_triggers()
    db.delete_event(run.run_id, run.last_seq)
    return run.last_seq


@contextmanager
def workspace(tmp_path: Path, backend: str) -> Iterator[tuple[KeelWorkspace, Store]]:
    if backend == "sqlite":
        ws = KeelWorkspace(tmp_path)
        store = open_store(ws.url)
        try:
            yield ws, store
        finally:
            store.close()
        return
    if reason := postgres_unavailable():
        pytest.skip(f"PostgreSQL store not tested: {reason}")
    with scratch_database() as url:
        store = open_store(url)
        try:
            yield KeelWorkspace(tmp_path, store_url=url), store
        finally:
            store.close()


def runs_with_one_waiting(store: Store) -> tuple[RunState, RunState, RunState]:
    """An intact run before and after a run waiting for approval (the one to damage)."""
    before = make_run(store, goal="intact before")
    before, _ = append(store, before, [*model_step(), *tool_step("c1")])
    waiting = make_run(store, goal="waits for approval")
    waiting, _ = append(store, waiting, [*model_step(), *tool_step("c2")])
    waiting, _ = append(store, waiting, legal_step(waiting, 7))  # approval -> waiting
    assert waiting.status is RunStatus.WAITING
    after = make_run(store, goal="intact after")
    return before, waiting, after


def check_damage_is_named_everywhere(
    ws: KeelWorkspace, damaged: RunState, seq: int, intact: list[RunState]
) -> None:
    rid = damaged.run_id
    named = f"event log of {rid} damaged at seq {seq}"

    verify = ws.keel("verify", rid)
    expect(verify, 1)
    assert flat(verify.stdout).startswith(named + ": ")
    ok = expect(ws.keel("verify", intact[0].run_id), 0)
    assert f"event log of {intact[0].run_id} intact: {intact[0].last_seq} events, head " in flat(ok)

    every = ws.keel("verify", "--all")
    expect(every, 1)
    assert named in flat(every.stdout) and "3 runs: 2 intact, 1 damaged" in flat(every.stdout)

    listing = ws.keel("runs")
    out = flat(expect(listing, 0))
    for run in intact:
        assert run.run_id in out
    assert "intact before" in out and "intact after" in out
    assert f"{rid} damaged" in out and f"event log damaged at seq {seq}" in out
    assert "Traceback" not in listing.stderr and "keel verify --all" in listing.stderr
    as_json = json.loads(expect(ws.keel("runs", "--json"), 0))
    marked = {r["run_id"]: r.get("damaged") for r in as_json}
    assert marked[rid]["seq"] == seq
    assert all(marked[run.run_id] is None for run in intact)

    for argv in (("show", rid), ("events", rid), ("approve", rid)):
        line = one_line_error(ws.keel(*argv))
        assert named in flat(line), argv
    expect(ws.keel("show", intact[0].run_id), 0)


@pytest.mark.parametrize("damage", [inserted, changed_last, deleted_last])
def test_damage_is_named_by_verify_and_refused_by_readers_on_sqlite(
    tmp_path: Path, damage: Damage
) -> None:
    with workspace(tmp_path, "sqlite") as (ws, store):
        before, waiting, after = runs_with_one_waiting(store)
        with OutOfBand(store) as db:
            seq = damage(db, waiting)
        check_damage_is_named_everywhere(ws, waiting, seq, [after, before])


def test_damage_is_named_by_verify_and_refused_by_readers_on_postgres(tmp_path: Path) -> None:
    with workspace(tmp_path, "postgres") as (ws, store):
        before, waiting, after = runs_with_one_waiting(store)
        with OutOfBand(store) as db:
            seq = changed_last(db, waiting)
        check_damage_is_named_everywhere(ws, waiting, seq, [after, before])


def test_an_event_changed_in_the_middle_is_named_by_verify_and_events(tmp_path: Path) -> None:
    with workspace(tmp_path, "sqlite") as (ws, store):
        run = make_run(store)
        for i in range(30):  # well past a snapshot: `keel show` reads only what follows it
            run, _ = append(store, run, [*model_step(), *tool_step(f"c{i}")])
        with OutOfBand(store) as db:
            db.drop_event_triggers()
            db.change_event(run.run_id, 3, '{"call_id":"c0","result":"forged"}')
        named = f"event log of {run.run_id} damaged at seq 3: its content does not match its hash"
        assert flat(expect(ws.keel("verify", run.run_id), 1)).startswith(named)
        assert named in flat(one_line_error(ws.keel("events", run.run_id)))
        report = json.loads(expect(ws.keel("verify", run.run_id, "--json"), 1))
        assert (report["intact"], report["damaged_at"], report["events"]) == (False, 3, 2)
        assert report["head_hash"] is None


def test_verify_reports_intact_logs_with_their_head_hash(tmp_path: Path) -> None:
    with workspace(tmp_path, "sqlite") as (ws, store):
        runs = [make_run(store, goal=f"run {i}") for i in range(2)]
        runs[0], _ = append(store, runs[0], model_step())
        reports = json.loads(expect(ws.keel("verify", "--all", "--json"), 0))
        assert [(r["run_id"], r["intact"], r["events"]) for r in reports] == [
            (runs[0].run_id, True, 3),
            (runs[1].run_id, True, 1),
        ]
        assert reports[0]["head_hash"] == store.load_run(runs[0].run_id).last_hash
        assert "2 runs: 2 intact, 0 damaged" in flat(expect(ws.keel("verify", "--all"), 0))


def test_verify_usage_errors_exit_2_with_one_line(tmp_path: Path) -> None:
    with workspace(tmp_path, "sqlite") as (ws, store):
        run = make_run(store)
        assert "not both" in one_line_error(ws.keel("verify"))
        assert "not both" in one_line_error(ws.keel("verify", run.run_id, "--all"))
        assert "run_000000000000" in one_line_error(ws.keel("verify", "run_000000000000"))
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "no Keel store" in one_line_error(KeelWorkspace(empty).keel("verify", "--all"))
