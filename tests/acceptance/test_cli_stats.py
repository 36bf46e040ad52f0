"""`keel stats` and the figures of `keel show`, end to end against a real store file:
the table and --json carry what ``Store.run_stats`` aggregates, filters narrow them,
and a bad --since is one line, exit 2, with nothing created or changed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from keel.core.events import EventType, NewEvent
from keel.core.records import RunOptions
from keel.core.state import RunState
from keel.core.status import RunStatus
from keel.store.sqlite.store import SQLiteStore
from keel.testing.stores import append, make_run, move

KEEL = str(Path(sys.executable).parent / "keel")
TIMEOUT = 60


def keel(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KEEL_")}
    return subprocess.run(
        [KEEL, *args],
        check=False,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env={**env, "COLUMNS": "200"},
    )


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, result
    assert "Traceback" not in result.stderr
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SQLiteStore]:
    with SQLiteStore(tmp_path / ".keel" / "keel.db") as s:
        yield s


def step(tool: str, seconds: float, model_seconds: float) -> list[NewEvent]:
    usage = {"input_tokens": 1200, "output_tokens": 80, "cached_input_tokens": 600}
    return [
        NewEvent(
            type=EventType.MODEL_RESPONDED,
            data={"model": "m", "usage": usage, "cost": 0.002, "elapsed_s": model_seconds},
        ),
        NewEvent(
            type=EventType.TOOL_FINISHED,
            data={"call_id": f"c{seconds}", "tool": tool, "elapsed_s": seconds},
        ),
    ]


def checked(state: RunState, passed: bool) -> list[NewEvent]:
    record = {
        "command": "pytest -q",
        "passed": passed,
        "exit_code": 0 if passed else 1,
        "mutation_revision": 0,
    }
    kind = EventType.VERIFICATION_PASSED if passed else EventType.VERIFICATION_FAILED
    return [NewEvent(type=kind, data={"records": [{**record, "duration_s": 1.0}]})]


def seeded(store: SQLiteStore) -> tuple[RunState, RunState]:
    done = make_run(store, options=RunOptions(model="openai:gpt-4o-mini"))
    done, _ = append(store, done, [*step("read_file", 0.004, 1.5), *step("grep", 0.25, 2.5)])
    done, _ = append(store, done, [move(done, RunStatus.VERIFYING, "final answer given")])
    done, _ = append(
        store, done, [*checked(done, True), move(done, RunStatus.COMPLETED, "verified")]
    )
    failed = make_run(store, options=RunOptions(model="deepseek:deepseek-chat"))
    failed, _ = append(store, failed, step("run_command", 75.0, 0.4))
    failed, _ = append(store, failed, [move(failed, RunStatus.FAILED, "budget_exhausted:steps")])
    return done, failed


def as_json(result: subprocess.CompletedProcess[str]) -> Any:
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_stats_print_runs_tokens_cost_latency_and_verifiers(
    tmp_path: Path, store: SQLiteStore
) -> None:
    seeded(store)
    out = keel("stats", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    for expected in (
        "runs 2",
        "steps 3",
        "tool calls 3",
        "cost $0.0060",
        "input 3,600 (cached 1,800, 50.0%)",
        "completed",
        "budget_exhausted",
        "openai:gpt-4o-mini",
        "deepseek:deepseek-chat",
        "2.50s",  # the slower of two turns is its p95 and p99
        "4.0ms",  # read_file
        "1m15s",  # run_command
        "pytest -q",
        "100.0%",
    ):
        assert expected in text, expected
    figures = as_json(keel("stats", "--json", cwd=tmp_path))
    assert figures == {
        "filters": {"since": None, "model": None},
        **store.run_stats().to_dict(),
    }
    assert figures["by_status"]["completed"] == 1 and figures["steps"] == 3


def test_stats_filtered_by_model_and_since(tmp_path: Path, store: SQLiteStore) -> None:
    seeded(store)
    gpt = as_json(keel("stats", "--model", "openai:gpt-4o-mini", "--json", cwd=tmp_path))
    assert gpt["runs"] == 1 and [m["model"] for m in gpt["models"]] == ["openai:gpt-4o-mini"]
    assert gpt["filters"] == {"since": None, "model": "openai:gpt-4o-mini"}
    today = datetime.now(UTC).date().isoformat()
    assert as_json(keel("stats", "--since", today, "--json", cwd=tmp_path))["runs"] == 2
    tomorrow = (datetime.now(UTC) + timedelta(days=1)).date().isoformat()
    later = as_json(keel("stats", "--since", tomorrow, "--json", cwd=tmp_path))
    assert later["runs"] == 0 and later["filters"]["since"] == f"{tomorrow}T00:00:00+00:00"
    none = keel("stats", "--since", tomorrow, "--model", "x:y", cwd=tmp_path)
    assert none.returncode == 0 and f"no runs created since {tomorrow} of model x:y" in none.stdout


def test_a_bad_since_is_one_precise_line_and_changes_nothing(
    tmp_path: Path, store: SQLiteStore
) -> None:
    seeded(store)
    before = store.run_stats()
    line = one_line_error(keel("stats", "--since", "last tuesday", cwd=tmp_path))
    assert "--since 'last tuesday' is not an ISO date or datetime" in line
    assert "2026-01-31" in line
    assert store.run_stats() == before
    empty = tmp_path / "empty"
    empty.mkdir()
    one_line_error(keel("stats", "--since", "2026-02-30", cwd=empty))
    assert not (empty / ".keel").exists()  # refused before any store was opened


def test_stats_without_a_store_say_so(tmp_path: Path) -> None:
    line = one_line_error(keel("stats", cwd=tmp_path))
    assert "no Keel store exists" in line
    assert not (tmp_path / ".keel").exists()


def test_show_gives_the_same_figures_for_one_run(tmp_path: Path, store: SQLiteStore) -> None:
    done, _ = seeded(store)
    out = keel("show", done.run_id, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    for expected in (
        "figures",
        "steps 2",
        "model openai:gpt-4o-mini  calls 2  p50 1.50s  p95 2.50s",
        "tool  grep  calls 1  p50 250ms",
        "verifier pytest -q  passed 1 of 1",
    ):
        assert expected in out.stdout, expected
    shown = as_json(keel("show", done.run_id, "--json", cwd=tmp_path))
    figures = store.run_stats(run_id=done.run_id).to_dict()
    assert shown["figures"] == {
        k: v for k, v in figures.items() if k not in ("runs", "by_status", "reasons")
    }
    assert RunState.from_dict(shown) == store.load_run(done.run_id)  # the state is unchanged


def test_show_of_an_unknown_run_is_still_one_line(tmp_path: Path, store: SQLiteStore) -> None:
    seeded(store)
    line = one_line_error(keel("show", "run_000000000000", cwd=tmp_path))
    assert "run_000000000000" in line and "store sqlite:///" in line
