"""`keel runs`, `keel show`, `keel events` end to end, against a real store file."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from keel.core.events import EventType, NewEvent
from keel.core.state import RunState
from keel.core.status import RunStatus
from keel.store.sqlite.store import SQLiteStore
from keel.testing.stores import append, legal_step, make_run, model_step, move, tool_step

KEEL = str(Path(sys.executable).parent / "keel")
TIMEOUT = 60


def keel(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [KEEL, *args],
        check=False,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
    )


@pytest.fixture
def store_path(tmp_path: Path) -> Path:
    return tmp_path / ".keel" / "keel.db"


@pytest.fixture
def store(store_path: Path) -> Iterator[SQLiteStore]:
    with SQLiteStore(store_path) as s:
        yield s


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, result
    assert "Traceback" not in result.stderr
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, result.stderr
    return lines[0]


# --- keel runs -------------------------------------------------------------------------


def test_runs_lists_runs_newest_first_with_status_filter(
    tmp_path: Path, store: SQLiteStore
) -> None:
    older = make_run(store, goal="older goal")
    newer = make_run(store, goal="newer goal", queued=True)
    out = keel("runs", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.index(newer.run_id) < out.stdout.index(older.run_id)
    assert "older goal" in out.stdout and "queued" in out.stdout
    queued = keel("runs", "--status", "queued", "--json", cwd=tmp_path)
    assert [r["run_id"] for r in json.loads(queued.stdout)] == [newer.run_id]
    bad = keel("runs", "--status", "sleeping", cwd=tmp_path)
    assert bad.returncode == 2 and "sleeping" in bad.stderr


def test_store_is_chosen_by_flag_or_environment(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere.db"
    with SQLiteStore(elsewhere) as other:
        run = make_run(other)
    by_flag = keel("runs", "--json", "--store", f"sqlite:///{elsewhere}", cwd=tmp_path)
    by_env = keel("runs", "--json", cwd=tmp_path, env={"KEEL_STORE": f"sqlite:///{elsewhere}"})
    for result in (by_flag, by_env):
        assert result.returncode == 0, result.stderr
        assert [r["run_id"] for r in json.loads(result.stdout)] == [run.run_id]


# --- keel show -------------------------------------------------------------------------


def test_show_waiting_for_approval_names_the_call_and_the_commands(
    tmp_path: Path, store: SQLiteStore
) -> None:
    state = make_run(store, goal="clean the build")
    state, _ = append(store, state, model_step(input_tokens=900, output_tokens=100, cost=0.02))
    state, _ = append(store, state, tool_step("c1", changed_files={"src/app.py": "ab" * 32}))
    state, _ = append(store, state, legal_step(state, 6 + 12))  # a passed verification
    state, _ = append(store, state, legal_step(state, 7))  # approval of run_command -> waiting
    out = keel("show", state.run_id, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    for expected in (
        "waiting",
        "clean the build",
        "1 / 12",  # steps used / limit
        "1000 / ∞",  # tokens
        "src/app.py",
        "pytest -q",
        "art_",
        "run_command",
        '"argv": ["rm", "f0"]',
        f"keel approve {state.run_id}",
        f"keel approve {state.run_id} --deny --reason TEXT",
    ):
        assert expected in text, expected


def test_show_waiting_for_an_answer_names_the_question(tmp_path: Path, store: SQLiteStore) -> None:
    state = make_run(store)
    state, _ = append(store, state, legal_step(state, 8))  # a question -> waiting
    out = keel("show", state.run_id, cwd=tmp_path)
    assert "which file? (0)" in out.stdout
    assert f"keel answer {state.run_id} TEXT" in out.stdout


def test_show_json_is_the_stored_state(tmp_path: Path, store: SQLiteStore) -> None:
    state = make_run(store)
    state, _ = append(store, state, [move(state, RunStatus.FAILED, "budget exhausted: steps")])
    out = keel("show", state.run_id, "--json", cwd=tmp_path)
    assert RunState.from_dict(json.loads(out.stdout)) == store.load_run(state.run_id)
    human = keel("show", state.run_id, cwd=tmp_path)
    assert "failed" in human.stdout and "budget exhausted: steps" in human.stdout


# --- keel events -----------------------------------------------------------------------


def test_events_prints_a_timeline_and_json_lines(tmp_path: Path, store: SQLiteStore) -> None:
    state = make_run(store, goal="timeline goal")
    state, _ = append(store, state, [*model_step(), *tool_step("c7")])
    state, _ = append(store, state, [move(state, RunStatus.PAUSED, "coffee")])
    timeline = keel("events", state.run_id, cwd=tmp_path)
    assert timeline.returncode == 0, timeline.stderr
    lines = timeline.stdout.splitlines()
    assert len(lines) == 6
    assert "run_created" in lines[0] and "timeline goal" in lines[0]
    assert "running → paused: coffee" in lines[5]
    as_json = keel("events", state.run_id, "--json", "--after", "2", cwd=tmp_path)
    records = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert [r["seq"] for r in records] == [3, 4, 5, 6]
    assert records[-1]["type"] == "status_changed"
    assert records == [e.to_dict() for e in store.read_events(state.run_id, after=2)]


def test_events_name_a_turn_cut_at_the_length_limit_and_the_providers_own_reason(
    tmp_path: Path, store: SQLiteStore
) -> None:
    state = make_run(store)
    cut = NewEvent(
        type=EventType.MODEL_RESPONDED,
        data={"content": "half of it", "tool_calls": [], "finish_reason": "length"},
    )
    odd = NewEvent(
        type=EventType.MODEL_RESPONDED,
        data={
            "content": "done",
            "tool_calls": [],
            "finish_reason": "stop",
            "provider_finish_reason": "eos",
        },
    )
    state, _ = append(store, state, [cut, odd])

    lines = expect_lines(keel("events", state.run_id, cwd=tmp_path))

    assert "finish length" in lines[1] and "half of it" in lines[1]
    assert "provider said eos" in lines[2] and "finish" not in lines[2]


def test_show_of_turns_reporting_only_input_and_output_shows_zero_cached_and_reasoning(
    tmp_path: Path, store: SQLiteStore
) -> None:
    state = make_run(store)
    state, _ = append(store, state, model_step(input_tokens=900, output_tokens=100))

    text = " ".join(keel("show", state.run_id, cwd=tmp_path).stdout.split())

    assert "tokens 1000 / ∞" in text
    assert "input 900 (cached 0, cache hits 0.0%)" in text
    assert "output 100 (reasoning 0)" in text


def expect_lines(result: subprocess.CompletedProcess[str]) -> list[str]:
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def test_events_follow_prints_new_events_until_the_run_ends(
    tmp_path: Path, store: SQLiteStore
) -> None:
    state = make_run(store)
    follower = subprocess.Popen(
        [KEEL, "events", state.run_id, "--follow", "--json"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert follower.stdout is not None
    assert json.loads(follower.stdout.readline())["seq"] == 1
    state, _ = append(store, state, model_step())
    time.sleep(0.3)
    state, _ = append(store, state, [NewEvent(type=EventType.NOTE_ADDED, data={"text": "hi"})])
    state, _ = append(store, state, [move(state, RunStatus.CANCELLED, "enough")])
    out, err = follower.communicate(timeout=TIMEOUT)
    assert follower.returncode == 0, err
    assert [json.loads(line)["seq"] for line in out.splitlines()] == [2, 3, 4, 5]


# --- errors: one line, exit 2 -----------------------------------------------------------


def test_unknown_run_id_exits_2_naming_the_id_and_store(tmp_path: Path, store: SQLiteStore) -> None:
    make_run(store)
    for command in ("show", "events"):
        line = one_line_error(keel(command, "run_doesnotexist", cwd=tmp_path))
        assert "run_doesnotexist" in line and str(tmp_path) in line


def test_missing_store_exits_2_and_creates_nothing(tmp_path: Path) -> None:
    for args in (("runs",), ("show", "run_x"), ("events", "run_x")):
        line = one_line_error(keel(*args, cwd=tmp_path))
        assert "no Keel store exists" in line and str(tmp_path / ".keel" / "keel.db") in line
    assert not (tmp_path / ".keel" / "keel.db").exists()


def test_corrupt_store_exits_2_naming_the_file(tmp_path: Path, store_path: Path) -> None:
    store_path.parent.mkdir(parents=True)
    store_path.write_bytes(b"not a database at all" * 50)
    line = one_line_error(keel("runs", cwd=tmp_path))
    assert str(store_path) in line and "not a readable Keel database" in line
    assert store_path.read_bytes() == b"not a database at all" * 50


def test_newer_schema_exits_2_naming_the_file_and_versions(
    tmp_path: Path, store_path: Path
) -> None:
    SQLiteStore(store_path).close()
    conn = sqlite3.connect(store_path)
    conn.execute("INSERT INTO schema_migrations VALUES (4242, 'future', '2099-01-01')")
    conn.commit()
    conn.close()
    for args in (("runs",), ("show", "run_x"), ("events", "run_x")):
        line = one_line_error(keel(*args, cwd=tmp_path))
        assert str(store_path) in line and "4242" in line and "upgrade keel" in line
