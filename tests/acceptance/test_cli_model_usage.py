"""What the model cost and used, end to end through the ``keel`` command: tokens by kind
and the cache-hit ratio in ``keel show``; a cost budget refused (exit 2, nothing stored)
when Keel has no price for the model; ``--record`` writing a cassette; and the live
view showing a streaming answer as it arrives."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from rich.console import Console

from keel.cli.live import LiveView
from keel.core.events import Event, EventType
from keel.core.state import RunState
from keel.core.status import RunStatus
from keel.models.base import StreamDelta
from keel.store.url import open_store
from keel.testing.cli import DONE, KeelWorkspace, call, expect, flat, one_line_error, turn
from keel.testing.provider import FakeProvider

UNPRICED = "openai:house-model"


@pytest.fixture
def ws(tmp_path: Path) -> KeelWorkspace:
    return KeelWorkspace(tmp_path)


@pytest.fixture
def provider() -> Iterator[FakeProvider]:
    with FakeProvider() as server:
        yield server


def runs_stored(ws: KeelWorkspace) -> int:
    if not (ws.root / ".keel" / "keel.db").exists():
        return 0
    store = open_store(ws.url)
    try:
        return len(store.list_runs())
    finally:
        store.close()


def price(ws: KeelWorkspace, spec: str) -> None:
    (ws.root / ".keel").mkdir(exist_ok=True)
    (ws.root / ".keel" / "config.toml").write_text(
        f'[prices."{spec}"]\ninput_per_mtok = 1.0\noutput_per_mtok = 2.0\n'
    )


# --- tokens by kind -----------------------------------------------------------------------


def test_show_gives_tokens_by_kind_and_the_cache_hit_ratio_in_text_and_json(
    ws: KeelWorkspace,
) -> None:
    first = {"input_tokens": 1000, "output_tokens": 300, "reasoning_tokens": 200}
    second = {"input_tokens": 3000, "cached_input_tokens": 2000, "output_tokens": 100}
    read = call("read_file", path="a.txt")
    (ws.root / "a.txt").write_text("hi\n")
    model = ws.script({**turn(read), "usage": first}, {**DONE, "usage": second})
    run_id, result = ws.start("read it", "--model", model)
    expect(result, 0)

    shown = flat(expect(ws.keel("show", run_id), 0))
    as_json = json.loads(expect(ws.keel("show", run_id, "--json"), 0))

    assert "tokens 4400 / ∞" in shown  # the budget's tokens: input + output
    assert "input 4000 (cached 2000, cache hits 50.0%)" in shown
    assert "output 400 (reasoning 200)" in shown
    assert as_json["tokens"] == {
        "input": 4000,
        "cached_input": 2000,
        "output": 400,
        "reasoning": 200,
        "cache_hit_ratio": 0.5,
    }
    assert as_json["usage"]["cached_input_tokens"] == 2000
    assert RunState.from_dict(as_json) == ws.state(run_id)


def test_a_providers_cached_and_reasoning_tokens_reach_keel_show(
    ws: KeelWorkspace, provider: FakeProvider
) -> None:
    """DeepSeek reports cache hits as prompt_cache_hit_tokens and reasoning in
    completion_tokens_details (its API reference); the run sums them by kind."""
    provider.reply(
        "done",
        usage={
            "prompt_tokens": 1200,
            "completion_tokens": 300,
            "total_tokens": 1500,
            "prompt_cache_hit_tokens": 900,
            "prompt_cache_miss_tokens": 300,
            "completion_tokens_details": {"reasoning_tokens": 250},
        },
    )
    ws.env.update({"DEEPSEEK_API_KEY": "sk-test", "DEEPSEEK_BASE_URL": provider.base_url})
    run_id, result = ws.start("say done", "--model", "deepseek:deepseek-reasoner")
    expect(result, 0)

    as_json = json.loads(expect(ws.keel("show", run_id, "--json"), 0))

    assert as_json["tokens"] == {
        "input": 1200,
        "cached_input": 900,
        "output": 300,
        "reasoning": 250,
        "cache_hit_ratio": 0.75,
    }
    assert as_json["usage"]["tokens"] == 1500
    assert "cache hits 75.0%" in flat(expect(ws.keel("show", run_id), 0))


# --- a cost budget needs a price ----------------------------------------------------------


def test_max_cost_with_a_model_keel_has_no_price_for_exits_2_and_stores_no_run(
    ws: KeelWorkspace, provider: FakeProvider
) -> None:
    ws.env.update({"OPENAI_API_KEY": "sk-test", "OPENAI_BASE_URL": provider.base_url})

    refused = ws.keel("run", "fix it", "--model", UNPRICED, "--max-cost", "0.5")

    line = flat(one_line_error(refused))
    assert UNPRICED in line and f'[prices."{UNPRICED}"]' in line and ".keel/config.toml" in line
    assert runs_stored(ws) == 0
    assert json.loads(expect(ws.keel("runs", "--json"), 0)) == []
    assert provider.requests == []


def test_max_cost_runs_once_the_model_has_a_price_in_the_config(
    ws: KeelWorkspace, provider: FakeProvider
) -> None:
    price(ws, UNPRICED)
    provider.reply("done", usage=(1000, 500))
    ws.env.update({"OPENAI_API_KEY": "sk-test", "OPENAI_BASE_URL": provider.base_url})

    run_id, result = ws.start("fix it", "--model", UNPRICED, "--max-cost", "0.5")

    expect(result, 0)
    assert ws.state(run_id).usage.cost == pytest.approx((1000 * 1.0 + 500 * 2.0) / 1_000_000)


def test_resuming_a_cost_budgeted_run_whose_price_is_gone_exits_2_and_leaves_it_alone(
    ws: KeelWorkspace, provider: FakeProvider
) -> None:
    price(ws, UNPRICED)
    ws.env.update({"OPENAI_API_KEY": "sk-test", "OPENAI_BASE_URL": provider.base_url})
    run_id, result = ws.start("fix it", "--model", UNPRICED, "--max-cost", "0.5", "--detach")
    expect(result, 0)
    before = ws.events(run_id)
    (ws.root / ".keel" / "config.toml").write_text("")

    refused = ws.keel("resume", run_id)

    assert f'[prices."{UNPRICED}"]' in flat(one_line_error(refused))
    assert ws.events(run_id) == before
    assert ws.state(run_id).status is RunStatus.QUEUED
    assert provider.requests == []


# --- recording ----------------------------------------------------------------------------


def test_record_with_detach_is_refused_before_anything_is_stored(ws: KeelWorkspace) -> None:
    refused = ws.keel(
        "run", "fix it", "--model", ws.script(DONE), "--record", "x.jsonl", "--detach"
    )

    assert "--record cannot be used with --detach" in flat(one_line_error(refused))
    assert not (ws.root / ".keel").exists() and not (ws.root / "x.jsonl").exists()


def test_record_writes_every_model_exchange_to_the_cassette_without_the_key(
    ws: KeelWorkspace, provider: FakeProvider
) -> None:
    (ws.root / "a.txt").write_text("hi\n")
    provider.reply(tool_calls=[("read_file", {"path": "a.txt"})]).reply("done")
    ws.env.update({"OPENAI_API_KEY": "sk-secret-key-1234", "OPENAI_BASE_URL": provider.base_url})
    cassette = ws.root / "run.jsonl"

    run_id, result = ws.start(
        "read a.txt", "--model", "openai:gpt-4o-mini", "--record", str(cassette)
    )

    expect(result, 0)
    header, *exchanges = (json.loads(line) for line in cassette.read_text().splitlines())
    assert header["model"] == "openai:gpt-4o-mini"
    assert [e["step"] for e in exchanges] == [0, 1]
    assert exchanges[1]["turn"]["content"] == "done"
    assert "sk-secret-key-1234" not in cassette.read_text()
    assert ws.state(run_id).status is RunStatus.COMPLETED


# --- the live view ------------------------------------------------------------------------


def stored(kind: EventType, seq: int, **data: object) -> Event:
    return Event(
        run_id="run_000000000001",
        seq=seq,
        event_id=f"e{seq}",
        type=kind,
        recorded_at=datetime(2025, 1, 1, tzinfo=UTC),
        data=dict(data),
    )


def screen(view: LiveView) -> str:
    target = Console(width=100, record=True, file=io.StringIO())
    target.print(view.render())
    return target.export_text()


def test_the_live_view_shows_the_tail_of_the_streaming_text_and_drops_a_retried_attempt() -> None:
    view = LiveView(Console(width=100, file=io.StringIO()))
    assert "starting…" in screen(view)
    view.on_delta(StreamDelta(kind="content", text="Before anything was stored", attempt=1))
    assert "model: Before anything was stored" in screen(view)  # a fresh run's first turn
    view.state = RunState(run_id="run_000000000001")

    view.on_delta(StreamDelta(kind="content", text=" and then I will", attempt=1))
    assert "model: Before anything was stored and then I will" in screen(view)

    view.on_delta(StreamDelta(kind="content", text="Retried answer", attempt=2))
    assert "model: Retried answer" in screen(view) and "Before" not in screen(view)

    view.on_delta(StreamDelta(kind="content", text=" and " + "x" * 5000, attempt=2))
    [line] = [ln for ln in screen(view).splitlines() if "model: " in ln]  # one line
    assert "Retried" not in line and "…xxxx" in line  # only the tail is shown

    view.on_event(stored(EventType.MODEL_RESPONDED, 2, content="done"), view.state)
    assert "model: " not in screen(view)  # the turn is on record: the stream line goes

    view.on_delta(StreamDelta(kind="reasoning", text="thinking about it", attempt=1))
    assert "model (thinking): thinking about it" in screen(view)
