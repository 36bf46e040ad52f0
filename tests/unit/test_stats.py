"""The pure half of ``keel stats``: nearest-rank percentiles, ``--since`` parsing, reason
codes, the figures rows an event makes, and the assembly of a store's rows."""

from __future__ import annotations

import json
import random
import time
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from keel.core.errors import RunNotFound, UsageError
from keel.core.events import Event, EventType
from keel.core.records import RunOptions
from keel.core.stats import (
    Latency,
    ModelFigures,
    ReasonCount,
    RunStats,
    TokenCounts,
    ToolFigures,
    VerifierFigures,
    nearest_rank,
    parse_since,
    percentile_rank,
    percentiles,
    reason_code,
)
from keel.core.status import RunStatus
from keel.store.stats import NAME_MAX, assemble, figure_columns, figure_rows, options_of

T0 = datetime(2026, 3, 1, tzinfo=UTC)
NONE = RunOptions()  # a run without a model spec


def event(seq: int, type_: EventType, **data: Any) -> Event:
    return Event(run_id="run_1", seq=seq, event_id=f"e{seq}", type=type_, recorded_at=T0, data=data)


# --- percentiles ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "pct", "rank"),
    [(1, 50, 1), (1, 99, 1), (2, 50, 1), (2, 95, 2), (20, 95, 19), (100, 99, 99), (101, 50, 51)],
)
def test_the_percentile_rank_is_the_ceiling_of_pct_of_n(n: int, pct: int, rank: int) -> None:
    assert percentile_rank(n, pct) == rank


def test_nearest_rank_is_the_smallest_value_covering_pct_of_them() -> None:
    rng = random.Random(16)
    for _ in range(200):
        values = sorted(rng.uniform(0, 10) for _ in range(rng.randint(1, 60)))
        for pct in (1, 50, 95, 99, 100):
            covering = [v for v in values if sum(w <= v for w in values) * 100 >= pct * len(values)]
            assert nearest_rank(values, pct) == min(covering)


def test_percentiles_take_any_order_and_refuse_nothing_to_rank() -> None:
    assert percentiles([3.0, 1.0, 2.0]) == (2.0, 3.0, 3.0)
    with pytest.raises(ValueError, match="at least one"):
        percentiles([])
    with pytest.raises(ValueError, match=r"not in 1\.\.100"):
        percentile_rank(5, 0)


def test_latency_of_values_and_of_none() -> None:
    assert Latency.of([]) is None
    latency = Latency.of([0.5, 0.1, 0.3])
    assert latency is not None
    assert (latency.timed, latency.p50_s, latency.max_s) == (3, 0.3, 0.5)
    assert latency.to_dict()["mean_s"] == pytest.approx(0.3)


# --- --since ---------------------------------------------------------------------------


def test_since_takes_a_date_or_a_datetime_in_utc() -> None:
    assert parse_since("2026-01-31") == datetime(2026, 1, 31, tzinfo=UTC)
    assert parse_since(" 2026-01-31T09:30 ") == datetime(2026, 1, 31, 9, 30, tzinfo=UTC)
    plus_two = parse_since("2026-01-31T09:30:00+02:00")
    assert plus_two == datetime(2026, 1, 31, 7, 30, tzinfo=UTC) and plus_two.tzinfo is UTC
    assert parse_since("2026-01-31T09:30:00Z").utcoffset() == timedelta(0)
    assert parse_since("2026-01-31T09:30:00-05:00") == datetime(
        2026, 1, 31, 9, 30, tzinfo=timezone(timedelta(hours=-5))
    )


@pytest.mark.parametrize("text", ["yesterday", "2026-13-01", "2026-02-30", "", "31/01/2026", "7d"])
def test_a_since_that_is_not_a_date_is_refused_naming_it_and_the_forms(text: str) -> None:
    with pytest.raises(UsageError) as refused:
        parse_since(text)
    message = str(refused.value)
    assert f"--since {text!r}" in message
    assert "2026-01-31" in message and "2026-01-31T09:30:00+00:00" in message


def test_a_reason_code_is_the_text_before_its_first_colon() -> None:
    assert reason_code("budget_exhausted:steps") == "budget_exhausted"
    assert reason_code("model_error: 503 upstream: down") == "model_error"
    assert reason_code("verified") == "verified"
    assert reason_code(" spaced : x") == "spaced"


# --- the rows an event makes --------------------------------------------------------------


def test_each_kind_of_event_makes_its_row() -> None:
    usage = {"input_tokens": 100, "output_tokens": 20, "cached_input_tokens": 40}
    events = [
        event(1, EventType.RUN_CREATED, options={"model": "openai:m"}),
        event(2, EventType.MODEL_REQUESTED, step=1),
        event(3, EventType.MODEL_RESPONDED, model="m", usage=usage, cost=0.01, elapsed_s=1.5),
        event(4, EventType.TOOL_STARTED, tool="grep"),
        event(5, EventType.TOOL_FINISHED, tool="grep", elapsed_s=0.2, output="x"),
        event(6, EventType.TOOL_FAILED, tool="write_file", message="denied"),
        event(7, EventType.CONTEXT_COMPACTED, summary={"usage": usage, "cost": 0.002}),
        event(8, EventType.CONTEXT_COMPACTED, dropped=3),
        event(
            9,
            EventType.VERIFICATION_FAILED,
            records=[
                {"command": "pytest -q", "passed": False},
                {"command": "pytest -q", "name": "unit", "passed": True},
                "not a record",
                {"passed": "yes"},
            ],
        ),
        event(10, EventType.SIGNOFF_RECORDED, verifier="review", passed=True),
    ]
    assert figure_rows(events, RunOptions(model="openai:m")) == [
        ("run_1", 1, 0, "run", "openai:m", True, None, None, None, None, None, None),
        ("run_1", 3, 0, "model", "openai:m", True, 1.5, 100, 40, 20, None, 0.01),
        ("run_1", 5, 0, "tool", "grep", True, 0.2, None, None, None, None, None),
        ("run_1", 6, 0, "tool", "write_file", False, None, None, None, None, None, None),
        ("run_1", 7, 0, "compaction", "-", True, None, 100, 40, 20, None, 0.002),
        ("run_1", 9, 0, "verifier", "pytest -q", False, None, None, None, None, None, None),
        ("run_1", 9, 1, "verifier", "unit", True, None, None, None, None, None, None),
        ("run_1", 9, 3, "verifier", "-", False, None, None, None, None, None, None),
        ("run_1", 10, 0, "verifier", "review", True, None, None, None, None, None, None),
    ]


def test_a_run_without_a_spec_names_its_turns_by_their_model() -> None:
    rows = figure_rows([event(2, EventType.MODEL_RESPONDED, model="local-llm")], NONE)
    assert rows[0][3:5] == ("model", "local-llm")
    assert figure_rows([event(2, EventType.MODEL_RESPONDED)], NONE)[0][4] == "-"


@pytest.mark.parametrize(
    ("value", "count", "seconds"),
    [
        (12, 12, 12.0),
        (12.9, 12, 12.9),
        (-5, 0, -5.0),
        ("12", None, None),
        (True, None, None),
        (None, None, None),
        (10**40, None, 1e40),
        (10**400, None, None),
        ([1], None, None),
    ],
)
def test_a_number_counts_only_when_it_is_one(value: Any, count: int | None, seconds: Any) -> None:
    usage = {"input_tokens": value}
    row = figure_rows(
        [event(2, EventType.MODEL_RESPONDED, usage=usage, elapsed_s=value, cost=value)], NONE
    )[0]
    assert row[7] == count
    assert row[6] == seconds
    assert row[11] == (seconds if seconds is not None and seconds > 0 else None)


def test_a_name_is_kept_storable() -> None:
    rows = figure_rows([event(5, EventType.TOOL_FINISHED, tool="a\x00b" + "x" * 500)], NONE)
    name = rows[0][4]
    assert "\x00" not in name and name.startswith("a\ufffdb") and len(name) == NAME_MAX
    assert figure_rows([event(5, EventType.TOOL_FINISHED, tool=7)], NONE)[0][4] == "-"


def test_a_run_created_holds_its_options() -> None:
    assert options_of({"options": {"model": "openai:m"}}).model == "openai:m"
    assert options_of({"options": {"model": None}}).model is None
    assert options_of({"options": "odd"}) == RunOptions()
    assert options_of({"options": {"budget": "odd"}}) == RunOptions()


def test_a_record_is_filed_under_the_name_the_run_gave_its_command() -> None:
    named = RunOptions(verify=("pytest -q", "ruff check ."), verifier_names=("unit_tests", "lint"))
    records = [{"command": "ruff check .", "passed": True}, {"command": "other", "passed": True}]
    rows = figure_rows([event(9, EventType.VERIFICATION_PASSED, records=records)], named)
    assert [r[4] for r in rows] == ["lint", "other"]


def test_figure_columns_are_the_rows_turned_on_their_side() -> None:
    rows = figure_rows(
        [
            event(5, EventType.TOOL_FINISHED, tool="grep", elapsed_s=0.2),
            event(6, EventType.TOOL_FAILED, tool="ls"),
        ],
        NONE,
    )
    columns = figure_columns(rows)
    assert columns["f_seqs"] == [5, 6] and columns["f_names"] == ["grep", "ls"]
    assert columns["f_oks"] == [True, False] and columns["f_elapsed"] == [0.2, None]
    assert figure_columns([])["f_kinds"] == []


# --- assembling a store's rows --------------------------------------------------------


def test_assembled_figures_add_up_and_sort_by_name() -> None:
    runs = [("completed", "verified", 3), ("failed", "budget_exhausted", 1), ("running", None, 2)]
    figures = [
        ("tool", "grep", 4, 1, 3, 0.6, 0.3, 0, 0, 0, 0, 0.0, 0.2, 0.3, 0.3),
        ("model", "b:m", 2, 0, 2, 3.0, 2.0, 500, 100, 50, 10, 0.02, 1.0, 2.0, 2.0),
        ("model", "a:m", 1, 0, 0, 0.0, None, 100, 0, 10, 0, 0.01, None, None, None),
        ("compaction", "-", 1, 0, 0, 0.0, None, 80, 0, 20, 0, 0.001, None, None, None),
        ("verifier", "pytest -q", 5, 2, 0, 0.0, None, 0, 0, 0, 0, 0.0, None, None, None),
    ]
    stats = assemble(runs, figures)
    assert stats.runs == 6 and stats.by_status[RunStatus.RUNNING] == 2
    assert [(r.status, r.reason) for r in stats.reasons] == [
        (RunStatus.COMPLETED, "verified"),
        (RunStatus.FAILED, "budget_exhausted"),
    ]
    assert stats.steps == 3  # model turns; a compaction's summary call is no step
    assert stats.tokens == TokenCounts(input=680, cached_input=100, output=80, reasoning=10)
    assert stats.cost == pytest.approx(0.031)
    assert [m.model for m in stats.models] == ["a:m", "b:m"] and stats.models[0].latency is None
    assert stats.tools[0].latency is not None and stats.tools[0].latency.p95_s == 0.3
    assert (stats.verifiers[0].checks, stats.verifiers[0].passed) == (5, 3)
    assert stats.verifiers[0].pass_rate == pytest.approx(0.6)
    assert stats.tool_calls == 4


def test_one_unknown_run_is_run_not_found() -> None:
    with pytest.raises(RunNotFound):
        assemble([], [], run_id="run_missing")
    assert assemble([], []).runs == 0


def test_stats_as_json_are_strict_and_name_every_status() -> None:
    stats = assemble([("completed", "verified", 1)], [])
    text = json.dumps(stats.to_dict(), allow_nan=False)
    assert set(json.loads(text)["by_status"]) == {s.value for s in RunStatus}
    assert RunStats().to_dict()["tokens"] == {
        "input": 0,
        "cached_input": 0,
        "output": 0,
        "reasoning": 0,
        "total": 0,
    }


def test_the_refusals_of_a_percentile_say_what_is_wrong() -> None:
    with pytest.raises(ValueError, match=r"^no values: a percentile needs at least one$"):
        percentile_rank(0, 50)
    with pytest.raises(ValueError, match=r"^percentile 101 is not in 1\.\.100$"):
        percentile_rank(5, 101)
    assert percentile_rank(5, 100) == 5


def test_a_reason_code_is_trimmed_of_spaces_only() -> None:
    assert reason_code(" waiting\t: x") == "waiting\t"
    assert reason_code("MAX: over") == "MAX"


def test_a_since_that_is_not_a_date_shows_both_forms_as_they_are() -> None:
    with pytest.raises(UsageError) as refused:
        parse_since("soon")
    assert str(refused.value).endswith("; use e.g. 2026-01-31 or 2026-01-31T09:30:00+00:00")


def test_a_since_without_an_offset_is_utc_whatever_the_local_time_zone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TZ", "Asia/Tokyo")
    time.tzset()
    try:
        assert parse_since("2026-01-31T09:30") == datetime(2026, 1, 31, 9, 30, tzinfo=UTC)
    finally:
        monkeypatch.undo()
        time.tzset()


def test_latency_figures_as_json() -> None:
    seconds = [float(i) for i in range(1, 101)] + [0.1234567]
    latency = Latency.of(seconds)
    assert latency is not None
    assert latency.to_dict() == {
        "timed": 101,
        "total_s": round(sum(seconds), 6),
        "mean_s": round(sum(seconds) / 101, 6),
        "p50_s": 50.0,
        "p95_s": 95.0,
        "p99_s": 99.0,
        "max_s": 100.0,
    }
    tiny = Latency.of([0.1234567, 0.1234567])
    assert tiny is not None and tiny.to_dict()["total_s"] == 0.246913
    assert tiny.to_dict()["mean_s"] == 0.123457


def test_stats_as_json_hold_every_row() -> None:
    latency = Latency.of([0.5])
    stats = RunStats(
        runs=3,
        by_status={RunStatus.COMPLETED: 2, RunStatus.FAILED: 1},
        reasons=(ReasonCount(status=RunStatus.FAILED, reason="budget_exhausted", runs=1),),
        steps=7,
        tokens=TokenCounts(input=10, cached_input=4, output=5, reasoning=2),
        cost=0.12345678901234,
        models=(ModelFigures(model="m", calls=7, latency=latency),),
        tools=(
            ToolFigures(tool="read_file", calls=4, failed=1, latency=None),
            ToolFigures(tool="run_command", calls=2, failed=0, latency=latency),
        ),
        verifiers=(VerifierFigures(verifier="unit", checks=3, passed=2),),
    )
    half = {
        "timed": 1,
        "total_s": 0.5,
        "mean_s": 0.5,
        "p50_s": 0.5,
        "p95_s": 0.5,
        "p99_s": 0.5,
        "max_s": 0.5,
    }
    assert stats.to_dict() == {
        "runs": 3,
        "by_status": {s.value: {"completed": 2, "failed": 1}.get(s.value, 0) for s in RunStatus},
        "reasons": [{"status": "failed", "reason": "budget_exhausted", "runs": 1}],
        "steps": 7,
        "tool_calls": 6,
        "tokens": {"input": 10, "cached_input": 4, "output": 5, "reasoning": 2, "total": 15},
        "cost": 0.123456789,
        "models": [{"model": "m", "calls": 7, "latency": half}],
        "tools": [
            {"tool": "read_file", "calls": 4, "failed": 1, "latency": None},
            {"tool": "run_command", "calls": 2, "failed": 0, "latency": half},
        ],
        "verifiers": [
            {"verifier": "unit", "checks": 3, "passed": 2, "failed": 1, "pass_rate": 0.6667}
        ],
    }
    assert ModelFigures(model="m", calls=0, latency=None).to_dict()["latency"] is None
    assert VerifierFigures(verifier="v", checks=0, passed=0).to_dict()["pass_rate"] == 0.0
