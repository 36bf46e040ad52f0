"""The tamper-evident log, on every backend: hashes chained event to event, gapless
numbering enforced by the database, and every reader naming the first bad event of a
log changed past Keel (``keel.testing.stores.OutOfBand``: raw sqlite3 or psycopg)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from keel.core.chain import chain_time, event_hash, genesis
from keel.core.errors import LogDamaged, RunNotFound
from keel.core.events import EventType, NewEvent
from keel.core.state import RunState
from keel.core.status import RunStatus
from keel.store.base import Store
from keel.store.step import dump_json, fold_step
from keel.testing.stores import (
    OutOfBand,
    append,
    legal_step,
    make_run,
    model_step,
    move,
    reopened,
    tool_step,
)


def grown_run(store: Store, steps: int = 4) -> RunState:
    """A run of 1 + 4 * steps events, with a status change on the way (a new snapshot)."""
    state = make_run(store)
    for i in range(steps):
        state, _ = append(store, state, [*model_step(), *tool_step(f"c{i}")])
        if i == 1:
            state, _ = append(store, state, [move(state, RunStatus.PAUSED, "lunch")])
            state, _ = append(store, state, [move(state, RunStatus.RUNNING)])
    return state


def damage_of(store: Store, run_id: str) -> LogDamaged:
    check = store.verify_log(run_id)
    assert check.damage is not None, f"{run_id} verified intact"
    return check.damage


# --- the chain -----------------------------------------------------------------------


def test_each_event_hash_chains_to_the_previous_event(store: Store) -> None:
    state = grown_run(store)
    events = store.read_events(state.run_id)
    prev = genesis(state.run_id)
    for e in events:
        text = dump_json(e.data)
        at = chain_time(e.recorded_at)
        assert e.hash == event_hash(prev, e.run_id, e.seq, e.event_id, e.type.value, at, text)
        prev = e.hash
    assert len({e.hash for e in events}) == len(events)
    assert store.load_run(state.run_id).last_hash == events[-1].hash == state.last_hash


def test_genesis_differs_per_run_so_equal_logs_have_different_chains(store: Store) -> None:
    one, two = make_run(store, goal="same"), make_run(store, goal="same")
    assert one.last_hash != two.last_hash
    assert genesis(one.run_id) != genesis(two.run_id)


def test_verify_log_of_an_intact_run_counts_every_event_and_gives_its_head(
    store: Store,
) -> None:
    state = grown_run(store, steps=15)  # past a SQLite snapshot rewrite interval
    check = store.verify_log(state.run_id)
    assert check.intact and check.damage is None
    assert check.events == state.last_seq
    assert check.head_hash == store.read_events(state.run_id)[-1].hash
    with pytest.raises(RunNotFound):
        store.verify_log("run_000000000000")
    assert store.run_ids() == [state.run_id]


def test_a_step_folded_by_its_writer_chains_on_from_the_stored_head(store: Store) -> None:
    run = make_run(store)
    first = fold_step(run, model_step(content="one"), now=datetime.now(UTC))
    both = first.then(fold_step(first.state, model_step(content="two"), now=datetime.now(UTC)))
    state, stored = store.append_folded(run.run_id, both)
    assert [e.hash for e in store.read_events(run.run_id, after=1)] == [e.hash for e in stored]
    assert store.verify_log(run.run_id).intact
    assert state.last_hash == stored[-1].hash


def test_readers_check_pages_against_each_other(store: Store) -> None:
    state = grown_run(store, steps=6)
    pages = [store.read_events(state.run_id, after=a, limit=5) for a in range(0, 30, 5)]
    assert [e.seq for page in pages for e in page] == list(range(1, state.last_seq + 1))
    assert store.read_events(state.run_id, after=state.last_seq) == []
    assert store.read_events(state.run_id, after=state.last_seq + 5) == []


# --- the database refuses what Keel would never write ---------------------------------


def test_database_refuses_an_event_out_of_sequence_or_without_a_hash(store: Store) -> None:
    state = grown_run(store, steps=1)
    last = state.last_seq
    with OutOfBand(store) as db:
        for seq in (last + 2, last, 1, 0):
            with pytest.raises(Exception, match=r"(?i)gapless|unique|duplicate|primary"):
                db.insert_event(state.run_id, seq)
        with pytest.raises(Exception, match=r"(?i)hash|null"):
            db.insert_event(state.run_id, last + 1, hash=None)
        with pytest.raises(Exception, match="append-only"):
            db.change_event(state.run_id, 2, '{"text":"rewritten"}')
        with pytest.raises(Exception, match="append-only"):
            db.delete_event(state.run_id, last)
    assert store.verify_log(state.run_id).intact
    assert store.load_run(state.run_id) == state


# --- damage, and who names it ----------------------------------------------------------


def test_an_event_inserted_out_of_band_is_named_by_every_reader(store: Store) -> None:
    other = grown_run(store, steps=2)
    state = grown_run(store, steps=2)
    seq = state.last_seq + 1
    with OutOfBand(store) as db:
        db.insert_event(state.run_id, seq)  # the next seq, with a hash: the database allows it

    damage = damage_of(store, state.run_id)
    assert damage.seq == seq and "not appended by Keel" in damage.detail
    assert str(damage).startswith(f"event log of {state.run_id} damaged at seq {seq}: ")
    with reopened(store) as cold:
        for read in (cold.load_run, cold.read_events):
            with pytest.raises(LogDamaged) as err:
                read(state.run_id)
            assert err.value.seq == seq and err.value.run_id == state.run_id
        with pytest.raises(LogDamaged):
            cold.read_events(state.run_id, after=state.last_seq - 2, limit=10)
        with pytest.raises(LogDamaged):
            cold.append_events(state.run_id, model_step(), expected_seq=state.last_seq)
        listed = cold.survey_runs()
        assert isinstance(listed[0], LogDamaged) and listed[0].seq == seq
        assert listed[1] == other
        with pytest.raises(LogDamaged):
            cold.list_runs()
        assert cold.load_run(other.run_id) == other
        assert cold.verify_log(other.run_id).intact
    # A process that cached the run before is refused at its next append, told why.
    with pytest.raises(LogDamaged) as err:
        append(store, state, model_step())
    assert str(err.value) == (
        f"event log of {state.run_id} damaged at seq {seq}: "
        "an event Keel did not append is already stored there"
    )
    assert store.verify_log(state.run_id).damage is not None


def test_an_event_changed_with_the_triggers_dropped_is_named(store: Store) -> None:
    state = grown_run(store, steps=3)
    with OutOfBand(store) as db:
        db.drop_event_triggers()
        db.change_event(state.run_id, 4, '{"text":"nothing to see"}')

    damage = damage_of(store, state.run_id)
    assert damage.seq == 4 and "does not match its hash" in damage.detail
    with reopened(store) as cold:
        with pytest.raises(LogDamaged) as err:
            cold.read_events(state.run_id)
        assert err.value.seq == 4
        # A read checks what it returns: the events after the changed one chain on
        # from their stored hashes (keel verify is what re-hashes the whole log).
        assert [e.seq for e in cold.read_events(state.run_id, after=4)] == list(
            range(5, state.last_seq + 1)
        )


def test_the_last_event_changed_is_named_by_every_reader(store: Store) -> None:
    state = grown_run(store, steps=2)
    with OutOfBand(store) as db:
        db.drop_event_triggers()
        db.change_event(state.run_id, state.last_seq, '{"call_id":"c1","result":"forged"}')
    assert damage_of(store, state.run_id).seq == state.last_seq
    with reopened(store) as cold:
        for read in (cold.load_run, cold.read_events):
            with pytest.raises(LogDamaged) as err:
                read(state.run_id)
            assert err.value.seq == state.last_seq


def test_an_event_recomputed_by_hand_breaks_the_link_to_the_next(store: Store) -> None:
    state = grown_run(store, steps=2)
    target = store.read_events(state.run_id)[2]  # seq 3
    forged = '{"text":"forged"}'
    prev = store.read_events(state.run_id)[1].hash
    digest = event_hash(
        prev,
        state.run_id,
        3,
        target.event_id,
        target.type.value,
        chain_time(target.recorded_at),
        forged,
    )
    with OutOfBand(store) as db:
        db.drop_event_triggers()
        db.execute(
            "UPDATE events SET data = ?, hash = ? WHERE run_id = ? AND seq = 3",
            (forged, digest, state.run_id),
        )
    damage = damage_of(store, state.run_id)
    assert damage.seq == 4 and "does not match its hash" in damage.detail


def test_an_event_deleted_with_the_triggers_dropped_is_named(store: Store) -> None:
    state = grown_run(store, steps=3)
    with OutOfBand(store) as db:
        db.drop_event_triggers()
        db.delete_event(state.run_id, 5)

    damage = damage_of(store, state.run_id)
    assert damage.seq == 5 and "missing" in damage.detail
    with reopened(store) as cold:
        with pytest.raises(LogDamaged) as err:
            cold.read_events(state.run_id)
        assert err.value.seq == 5
        with pytest.raises(LogDamaged) as err:
            cold.read_events(state.run_id, after=5)
        assert err.value.seq == 5


def test_the_last_event_deleted_is_named_by_every_reader(store: Store) -> None:
    other = make_run(store)
    state = grown_run(store, steps=2)
    with OutOfBand(store) as db:
        db.drop_event_triggers()
        db.delete_event(state.run_id, state.last_seq)
    assert damage_of(store, state.run_id).seq == state.last_seq
    with reopened(store) as cold:
        for read in (cold.load_run, cold.read_events):
            with pytest.raises(LogDamaged) as err:
                read(state.run_id)
            assert err.value.seq == state.last_seq
        assert [type(r) for r in cold.survey_runs()] == [LogDamaged, RunState]
        assert cold.load_run(other.run_id) == other


def test_a_changed_run_head_is_named(store: Store) -> None:
    state = grown_run(store, steps=1)
    with OutOfBand(store) as db:
        db.execute("UPDATE runs SET last_hash = ? WHERE id = ?", ("f" * 64, state.run_id))
    damage = damage_of(store, state.run_id)
    assert damage.seq == state.last_seq and "chain head" in damage.detail
    with reopened(store) as cold, pytest.raises(LogDamaged):
        cold.load_run(state.run_id)
    # A writer whose cached head is no longer the run's is refused; nothing is written.
    with pytest.raises(LogDamaged) as err:
        append(store, state, model_step())
    assert str(err.value) == (
        f"event log of {state.run_id} damaged at seq {state.last_seq}: "
        "the run's recorded chain head is not the event this writer chained onto"
    )
    assert store.verify_log(state.run_id).events == state.last_seq


def test_a_waiting_run_with_a_damaged_log_cannot_be_decided(store: Store) -> None:
    state = make_run(store)
    state, _ = append(store, state, legal_step(state, 7))  # approval request -> waiting
    assert state.status is RunStatus.WAITING
    with OutOfBand(store) as db:
        db.insert_event(state.run_id, state.last_seq + 1)
    with reopened(store) as cold, pytest.raises(LogDamaged):
        granted = NewEvent(type=EventType.APPROVAL_GRANTED, data={"call_id": "x", "by": "me"})
        cold.append_events(state.run_id, [granted], expected_seq=state.last_seq)
