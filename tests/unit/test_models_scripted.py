"""ScriptedModel: plays turn `step` of a fixed script, records requests, reports leftovers."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from keel.core.errors import ConfigError, ModelError
from keel.models.base import Message, ModelRequest, ModelTurn, TokenUsage, ToolCall
from keel.models.scripted import ScriptedModel

SCRIPT: list[dict[str, Any]] = [
    {"tool_calls": [{"name": "read_file", "arguments": {"path": "package.json"}}]},
    {"content": "done", "usage": {"input_tokens": 120, "output_tokens": 8}},
]


def at(step: int, text: str = "go") -> ModelRequest:
    return ModelRequest(messages=(Message(role="user", content=text),), tools=(), step=step)


def test_plays_the_turn_for_the_requested_step() -> None:
    model = ScriptedModel(SCRIPT)

    first = model.complete(at(0))
    second = model.complete(at(1))

    assert first.tool_calls == (
        ToolCall(id="call_0_0", name="read_file", arguments='{"path": "package.json"}'),
    )
    assert first.content is None
    assert second.content == "done"
    assert second.tool_calls == ()
    assert (second.usage.input_tokens, second.usage.output_tokens) == (120, 8)
    assert first.usage.input_tokens == first.usage.output_tokens == 0


def test_a_resumed_run_continues_at_its_step_without_hidden_position() -> None:
    fresh = ScriptedModel(SCRIPT)  # a new process after a crash at step 1
    assert fresh.complete(at(1)).content == "done"
    assert fresh.complete(at(1)).content == "done"  # the same step replays the same turn


def test_records_every_request_it_received() -> None:
    model = ScriptedModel(SCRIPT)
    model.complete(at(0, "first"))
    model.complete(at(1, "second"))
    assert [r.messages[0].content for r in model.requests] == ["first", "second"]
    assert [r.step for r in model.requests] == [0, 1]


def test_raw_string_arguments_pass_through_verbatim() -> None:
    model = ScriptedModel([{"tool_calls": [{"name": "write_file", "arguments": '{"path": "a'}]}])
    [call] = model.complete(at(0)).tool_calls
    assert call.arguments == '{"path": "a'


def test_non_object_arguments_are_serialised_for_schema_tests() -> None:
    model = ScriptedModel([{"tool_calls": [{"name": "list_dir", "arguments": [1, 2]}]}])
    assert model.complete(at(0)).tool_calls[0].arguments == "[1, 2]"


def test_tool_call_ids_are_deterministic_and_may_be_given() -> None:
    script = [
        {"content": "thinking"},
        {"tool_calls": [{"name": "a", "arguments": {}}, {"name": "b", "id": "mine"}]},
    ]
    calls = ScriptedModel(script).complete(at(1)).tool_calls
    again = ScriptedModel(script).complete(at(1)).tool_calls
    assert [c.id for c in calls] == ["call_1_0", "mine"]
    assert calls == again
    assert calls[1].arguments == "{}"


def test_reasoning_and_cost_are_reported() -> None:
    turn = ScriptedModel([{"content": "x", "reasoning": "because", "cost": 0.25}]).complete(at(0))
    assert (turn.reasoning, turn.cost) == ("because", 0.25)
    assert turn.model == "scripted:inline"


def test_how_a_turn_ended_and_its_usage_by_kind_are_reported() -> None:
    model = ScriptedModel(
        [
            {
                "content": "half an ans",
                "finish_reason": "length",
                "usage": {
                    "input_tokens": 900,
                    "cached_input_tokens": 512,
                    "output_tokens": 4096,
                    "reasoning_tokens": 1000,
                },
            },
            {"content": None, "finish_reason": "refusal", "refusal": "I can't help with that."},
            {"content": "ok", "provider_finish_reason": "eos"},
        ]
    )
    cut, refused, odd = (model.complete(at(step)) for step in range(3))
    assert cut.finish_reason == "length"
    assert cut.usage == TokenUsage(
        input_tokens=900, output_tokens=4096, cached_input_tokens=512, reasoning_tokens=1000
    )
    assert (refused.finish_reason, refused.refusal) == ("refusal", "I can't help with that.")
    assert (odd.finish_reason, odd.provider_finish_reason) == ("stop", "eos")


def test_past_the_end_raises_a_model_error_naming_the_turn() -> None:
    model = ScriptedModel(SCRIPT)
    with pytest.raises(ModelError, match=r"scripted model has no turn 2 \(script has 2\)") as err:
        model.complete(at(2))
    assert err.value.transient is False


def test_assert_consumed_complains_about_unplayed_turns() -> None:
    model = ScriptedModel([*SCRIPT, {"content": "extra"}])
    model.complete(at(0))
    with pytest.raises(AssertionError, match=r"2 unplayed turn\(s\) of 3: 1, 2"):
        model.assert_consumed()
    model.complete(at(1))
    model.complete(at(2))
    model.assert_consumed()


def test_assert_consumed_accepts_a_resumed_instance_that_reached_the_end() -> None:
    model = ScriptedModel(SCRIPT)
    model.complete(at(1))  # steps before the resume were played by another process
    model.assert_consumed()


@pytest.mark.parametrize(
    ("script", "message"),
    [
        ([{"content": 3}], "turn 0: content must be a string"),
        ([{}, {"tool_call": []}], "turn 1: unknown key(s) tool_call"),
        ([{"tool_calls": [{"arguments": {}}]}], "turn 0, tool call 0: name must be"),
        (["done"], "turn 0 must be an object, got a string"),
        ([{"usage": {"input_tokens": -1}}], "usage token counts"),
        ([{"cost": "free"}], "cost must be a finite number of USD, 0 or more, got 'free'"),
        ([{"cost": -0.5}], "turn 0: cost must be a finite number of USD, 0 or more, got -0.5"),
        ([{}, {"cost": math.nan}], "turn 1: cost must be a finite number of USD, 0 or more"),
        ([{"cost": math.inf}], "cost must be a finite number of USD, 0 or more, got inf"),
        ([{"cost": 10**400}], "cost must be a finite number of USD"),
        ([{"usage": {"output_tokens": 10**13}}], "usage token counts must be whole numbers"),
        ([{"usage": {"prompt_tokens": 1}}], "usage must be an object with some of input_tokens"),
        (
            [{"usage": {"input_tokens": 10, "cached_input_tokens": 11}}],
            "cached_input_tokens is part of input_tokens",
        ),
        (
            [{"usage": {"output_tokens": 1, "reasoning_tokens": 2}}],
            "reasoning_tokens is part of output_tokens",
        ),
        ([{"finish_reason": "eos"}], "turn 0: finish_reason must be one of stop, tool_calls"),
        ([{"refusal": ["no"]}], "turn 0: refusal must be a string"),
    ],
)
def test_a_broken_script_is_refused_naming_the_turn(script: list[Any], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        ScriptedModel(script)
    assert message in str(err.value)


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_a_script_file_spelling_a_non_finite_cost_is_refused_naming_file_and_turn(
    tmp_path: Path, literal: str
) -> None:
    script = tmp_path / "turns.json"
    script.write_text(f'[{{"content": "x", "cost": {literal}}}]')

    with pytest.raises(ConfigError, match=r"turns.json: turn 0: cost must be a finite number"):
        ScriptedModel.from_file(script)


def test_script_round_trips_through_json() -> None:
    model = ScriptedModel(json.loads(json.dumps(SCRIPT)), spec="scripted:demo.json")
    assert model.spec == "scripted:demo.json"
    assert len(model) == 2


@pytest.mark.parametrize("cost", [math.nan, math.inf, -1.0, 10**400])
def test_any_model_turn_with_a_cost_that_is_not_finite_is_a_model_error(cost: float) -> None:
    """A Model of the Python API cannot slip a bogus cost past the budget either."""
    with pytest.raises(ModelError, match="cost must be a finite number of USD, 0 or more"):
        ModelTurn(
            content="x",
            tool_calls=(),
            usage=TokenUsage(input_tokens=0, output_tokens=0),
            cost=cost,
            model="custom",
        )
