"""``Harness.create`` checks budgets and times before anything is stored (real SQLite file);
``record``, ``on_delta`` and the models a harness shares between its runs."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from keel.core.budget import Budget
from keel.core.errors import ConfigError
from keel.core.events import EventType
from keel.models.base import StreamDelta
from keel.models.scripted import ScriptedModel
from keel.runtime.harness import Harness
from keel.testing.provider import FakeProvider

DONE = {"content": "done"}


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"approval_timeout": -5}, "approval_timeout must be a number of seconds above 0"),
        ({"approval_timeout": 0}, "approval_timeout must be a number of seconds above 0"),
        ({"approval_timeout": math.inf}, "approval_timeout must be a number of seconds"),
        ({"grant_ttl": 0}, "grant_ttl must be a number of seconds above 0"),
        ({"grant_ttl": math.nan}, "grant_ttl must be a number of seconds above 0"),
        ({"budget": Budget(max_steps=0)}, "max_steps must be a whole number from 1 to"),
        ({"budget": Budget(max_tool_calls=-1)}, "max_tool_calls must be a whole number"),
        ({"budget": Budget(max_tokens=0)}, "max_tokens must be a whole number from 1 to"),
        ({"budget": Budget(max_cost=math.nan)}, "max_cost must be a finite number above 0"),
        ({"budget": Budget(max_cost=0.0)}, "max_cost must be a finite number above 0"),
        ({"budget": Budget(max_wall_seconds=-1)}, "max_wall_seconds must be a number of seconds"),
    ],
)
def test_an_argument_out_of_range_is_a_config_error_and_nothing_is_stored(
    tmp_path: Path, arguments: dict[str, Any], message: str
) -> None:
    with Harness(store=f"sqlite:///{tmp_path}/keel.db", model=ScriptedModel([DONE])) as h:
        with pytest.raises(ConfigError, match=message):
            h.create("fix it", cwd=tmp_path, **arguments)
        with pytest.raises(ConfigError, match=message):
            h.run("fix it", cwd=tmp_path, queued=True, **arguments)

        assert h.store.list_runs() == []


def test_limits_in_range_are_stored_as_given(tmp_path: Path) -> None:
    budget = Budget(max_steps=3, max_tool_calls=9, max_tokens=1000, max_cost=0.5)
    with Harness(store=f"sqlite:///{tmp_path}/keel.db", model=ScriptedModel([DONE])) as h:
        state = h.create("fix it", cwd=tmp_path, budget=budget, approval_timeout=60, grant_ttl=0.25)

    assert state.options.budget == budget
    assert (state.options.approval_timeout_s, state.options.grant_ttl_s) == (60, 0.25)


def test_a_queued_run_cannot_record_the_process_that_talks_to_the_model_records(
    tmp_path: Path,
) -> None:
    cassette = tmp_path / "run.jsonl"
    with Harness(store=f"sqlite:///{tmp_path}/keel.db", model=ScriptedModel([DONE])) as h:
        with pytest.raises(ConfigError, match="--record cannot be used with --detach"):
            h.create("fix it", cwd=tmp_path, queued=True, record=cassette)
        with pytest.raises(ConfigError, match="is a directory"):
            h.run("fix it", cwd=tmp_path, record=tmp_path)
        assert h.store.list_runs() == []

        outcome = h.run("fix it", cwd=tmp_path, record=cassette)

    assert outcome.status.value == "completed"
    header, exchange = (json.loads(line) for line in cassette.read_text().splitlines())
    assert header["model"] == "scripted:inline" and exchange["turn"]["content"] == "done"


@pytest.fixture
def provider() -> Iterator[FakeProvider]:
    with FakeProvider() as server:
        yield server


def test_on_delta_sees_the_streamed_text_as_it_arrives_and_no_piece_is_stored(
    tmp_path: Path, provider: FakeProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("OPENAI_BASE_URL", provider.base_url)
    monkeypatch.chdir(tmp_path)
    answer = "All done: the file was read and nothing needed changing."
    provider.reply(answer)
    pieces: list[StreamDelta] = []

    with Harness(store=f"sqlite:///{tmp_path}/keel.db", model="openai:gpt-4o-mini") as h:
        outcome = h.run("fix it", cwd=tmp_path, on_delta=pieces.append)
        events = list(h.events(outcome.id))

    assert provider.requests[0]["stream"] is True
    assert len(pieces) > 1  # it arrived in pieces, not at the end
    assert "".join(p.text for p in pieces if p.kind == "content") == answer
    assert {p.attempt for p in pieces} == {1}
    [responded] = [e for e in events if e.type is EventType.MODEL_RESPONDED]
    assert responded.data["content"] == answer
    first_piece = pieces[0].text
    assert first_piece != answer
    assert all(answer in json.dumps(e.data) for e in events if first_piece in json.dumps(e.data))


def test_runs_of_one_harness_share_the_models_connection(
    tmp_path: Path, provider: FakeProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A provider model is made once per process and spec, its HTTP client shared: the
    second run's request travels on the first run's kept-alive connection."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("OPENAI_BASE_URL", provider.base_url)
    monkeypatch.chdir(tmp_path)
    provider.reply("first done").reply("second done")

    with Harness(store=f"sqlite:///{tmp_path}/keel.db", model="openai:gpt-4o-mini") as h:
        first = h.run("one", cwd=tmp_path)
        second = h.run("two", cwd=tmp_path)

    assert (first.status.value, second.status.value) == ("completed", "completed")
    assert provider.connections == 1
    assert len(set(provider.peer_ports)) == 1
