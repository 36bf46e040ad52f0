"""Several real processes on one SQLite file: races, SIGKILL mid-step, fresh-process reloads."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from keel.core.events import EventType
from keel.core.state import RunState
from keel.store.sqlite.store import SQLiteStore
from keel.testing.stores import append, legal_step, make_run

TIMEOUT = 60


def python(script: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(script), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen[str]) -> str:
    out, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 0, err
    return out


# --- two writers, one expected sequence -----------------------------------------------

RACER = """
    import sys, time, json
    from keel.core.errors import ConcurrentUpdate
    from keel.store.sqlite.store import SQLiteStore
    from keel.testing.stores import model_step
    path, start, run_ids = sys.argv[1], float(sys.argv[2]), sys.argv[3].split(",")
    store = SQLiteStore(path)
    results = []
    for i, run_id in enumerate(run_ids):
        time.sleep(max(0.0, start + i * 0.05 - time.time()))
        try:
            store.append_events(run_id, model_step(), expected_seq=1)
            results.append("won")
        except ConcurrentUpdate:
            results.append("conflict")
    print(json.dumps(results))
"""


def test_two_processes_with_the_same_expected_seq_exactly_one_wins(tmp_path: Path) -> None:
    db = tmp_path / "keel.db"
    with SQLiteStore(db) as store:
        run_ids = [make_run(store).run_id for _ in range(8)]
    start = str(time.time() + 1.5)  # both are warm and waiting when the first race starts
    procs = [python(RACER, str(db), start, ",".join(run_ids)) for _ in range(2)]
    a, b = (json.loads(finish(p)) for p in procs)
    for i in range(len(run_ids)):
        assert sorted([a[i], b[i]]) == ["conflict", "won"], (a, b)
    with SQLiteStore(db) as store:
        for run_id in run_ids:
            assert [e.seq for e in store.read_events(run_id)] == [1, 2, 3]
            assert store.load_run(run_id).last_seq == 3


CONTENDER = """
    import sys
    from keel.core.errors import ConcurrentUpdate
    from keel.store.sqlite.store import SQLiteStore
    from keel.testing.stores import tool_step
    path, run_id, name, rounds = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    store = SQLiteStore(path)
    won = lost = 0
    for i in range(rounds):
        state = store.load_run(run_id)
        try:
            store.append_events(run_id, tool_step(f"{name}-{i}"), expected_seq=state.last_seq)
            won += 1
        except ConcurrentUpdate:
            lost += 1
    print(won, lost)
"""


def test_contending_processes_leave_a_log_without_gap_or_duplicate(tmp_path: Path) -> None:
    db = tmp_path / "keel.db"
    with SQLiteStore(db) as store:
        run_id = make_run(store).run_id
    procs = [python(CONTENDER, str(db), run_id, f"p{i}", "150") for i in range(3)]
    wins = sum(int(finish(p).split()[0]) for p in procs)
    with SQLiteStore(db) as store:
        events = store.read_events(run_id)
        assert [e.seq for e in events] == list(range(1, 2 * wins + 2))
        call_ids = [e.data["call_id"] for e in events if e.type is EventType.TOOL_STARTED]
        assert len(call_ids) == len(set(call_ids)) == wins
        assert store.load_run(run_id) == RunState.from_events(events)


# --- SIGKILL in the middle of a step ---------------------------------------------------

WRITER = """
    import sys
    from keel.core.events import EventType, NewEvent
    from keel.store.sqlite.store import SQLiteStore
    path, run_id = sys.argv[1], sys.argv[2]
    store = SQLiteStore(path)
    state = store.load_run(run_id)
    blob = "x" * 20000  # big events: the kill often lands while a step is being written
    print("ready", flush=True)
    step = state.last_seq
    while True:
        events = [
            NewEvent(type=EventType.NOTE_ADDED, data={"text": f"{step}:{part}", "pad": blob})
            for part in range(5)
        ]
        state, _ = store.append_events(run_id, events, expected_seq=state.last_seq)
        step += 1
"""


def test_a_sigkilled_writer_leaves_whole_steps_only(tmp_path: Path) -> None:
    db = tmp_path / "keel.db"
    with SQLiteStore(db) as store:
        run_id = make_run(store).run_id
    rng = random.Random(os.getpid())
    for _ in range(8):
        proc = python(WRITER, str(db), run_id)
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.02, 0.3))
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=TIMEOUT)
        assert proc.returncode == -signal.SIGKILL
        with SQLiteStore(db) as store:
            events = store.read_events(run_id)
            assert [e.seq for e in events] == list(range(1, len(events) + 1))
            assert (len(events) - 1) % 5 == 0
            parts = [e.data["text"].split(":")[1] for e in events[1:]]
            assert parts == ["0", "1", "2", "3", "4"] * ((len(events) - 1) // 5)
            assert store.load_run(run_id) == RunState.from_events(events)
    with SQLiteStore(db) as store:
        assert store.load_run(run_id).last_seq > 1  # the writers did make progress


# --- the snapshot is the fold, seen from a fresh process --------------------------------

CHECKER = """
    import json, sys
    from keel.core.state import RunState
    from keel.store.sqlite.store import SQLiteStore
    store = SQLiteStore(sys.argv[1])
    expected = json.loads(sys.argv[2])
    for run_id, snapshot in expected.items():
        loaded = store.load_run(run_id)
        folded = RunState.from_events(store.read_events(run_id))
        assert loaded == folded, run_id
        assert loaded.to_dict() == snapshot, run_id
    print(len(expected))
"""


@settings(
    max_examples=4,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    runs=st.lists(
        st.lists(st.integers(min_value=0, max_value=10_000), min_size=1, max_size=20),
        min_size=1,
        max_size=6,
    )
)
def test_a_fresh_process_rebuilds_the_same_state_from_the_file(
    tmp_path_factory: pytest.TempPathFactory, runs: list[list[int]]
) -> None:
    db = tmp_path_factory.mktemp("fresh") / "keel.db"
    expected = {}
    with SQLiteStore(db) as store:
        for choices in runs:
            state = make_run(store)
            for choice in choices:
                step = legal_step(state, choice)
                if not step:
                    break
                state, _ = append(store, state, step)
            expected[state.run_id] = state.to_dict()
    out = finish(python(CHECKER, str(db), json.dumps(expected)))
    assert out.strip() == str(len(runs))
