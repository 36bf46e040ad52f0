"""Middleware decisions as data: what a hook's JSON reads as, what may be answered where,
the record the loop keeps, and what several records add up to (keel.core.middleware)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from keel.core.errors import ConfigError
from keel.core.middleware import (
    CONTINUE,
    Append,
    Ask,
    Combined,
    Deny,
    Modify,
    Point,
    ShortCircuit,
    check_decision,
    combine,
    decision_from_json,
    decision_record,
)


@pytest.mark.parametrize(
    ("value", "decision"),
    [
        ({"reason": "nothing to say"}, CONTINUE),
        (
            {"decision": "modify", "patch": {"output": "x"}, "reason": "trimmed"},
            Modify(patch={"output": "x"}, reason="trimmed"),
        ),
        ({"decision": "short_circuit", "value": None}, ShortCircuit(value=None)),
        ({"decision": "append", "note": "see also"}, Append(note="see also")),
    ],
)
def test_a_hooks_json_reads_as_its_decision(value: dict[str, Any], decision: object) -> None:
    assert decision_from_json(value) == decision


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ([1], "a decision is a JSON object, not list"),
        ({"decision": "deny", "reason": 3}, "a decision's reason is a string"),
        ({"decision": "modify", "patch": [1]}, "a modify decision needs a patch object"),
        ({"decision": "short_circuit"}, "a short_circuit decision needs a value"),
        ({"decision": "append", "note": ""}, "an append decision needs a non-empty note"),
        ({"decision": "ask"}, "an ask decision needs a reason"),
        ({"decision": "deny"}, "a deny decision needs a reason"),
    ],
)
def test_a_malformed_decision_is_refused_saying_what_is_wrong(value: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        decision_from_json(value)


def test_a_decision_not_allowed_at_a_point_names_the_ones_that_are() -> None:
    with pytest.raises(ConfigError) as err:
        check_decision(Point.AFTER_TOOL, Ask(reason="r"))
    assert str(err.value) == "ask is not a decision at after_tool (append, continue, deny, modify)"


def test_a_patch_of_fields_the_point_does_not_hold_names_the_ones_it_does() -> None:
    with pytest.raises(ConfigError) as err:
        check_decision(Point.BEFORE_MODEL, Modify(patch={"output": "x"}))
    assert str(err.value) == "a patch at before_model changes messages, tools; got ['output']"


@pytest.mark.parametrize(
    ("decision", "extra"),
    [
        (CONTINUE, {}),
        (Modify(patch={"output": "y"}, reason="r"), {"patch": {"output": "y"}, "reason": "r"}),
        (
            ShortCircuit(value={"content": "hi"}, reason="r"),
            {"value": {"content": "hi"}, "reason": "r"},
        ),
        (Append(note="n"), {"note": "n"}),
        (Deny(reason="no"), {"reason": "no"}),
        (Ask(reason="why"), {"reason": "why"}),
    ],
)
def test_each_decision_is_recorded_with_what_it_carries(
    decision: Any, extra: dict[str, Any]
) -> None:
    assert decision_record("guard", Point.BEFORE_TOOL, decision) == {
        "middleware": "guard",
        "point": "before_tool",
        "decision": decision.kind,
        **extra,
    }
    failed = decision_record("guard", Point.BEFORE_TOOL, decision, error="boom")
    assert failed["error"] == "boom"


def test_patches_compose_in_order_and_only_arguments_merge_key_by_key() -> None:
    combined = combine(
        [
            {
                "middleware": "a",
                "decision": "modify",
                "patch": {"arguments": {"x": 1}, "output": {"p": 1}},
            },
            {
                "middleware": "b",
                "decision": "modify",
                "patch": {"arguments": {"y": 2}, "output": {"q": 2}},
            },
        ]
    )
    assert combined == Combined(
        kind="modify", by="a", patch={"arguments": {"x": 1, "y": 2}, "output": {"q": 2}}
    )


@pytest.mark.parametrize(
    "records",
    [[], [{"middleware": "a", "decision": "continue"}], [{"middleware": "a", "decision": "error"}]],
)
def test_nothing_but_continues_adds_up_to_continue(records: list[dict[str, Any]]) -> None:
    assert combine(records) == Combined()


def test_notes_are_kept_beside_the_strongest_decision() -> None:
    combined = combine(
        [
            {"middleware": "a", "decision": "append", "note": "one"},
            {
                "middleware": "b",
                "decision": "short_circuit",
                "value": {"content": "x"},
                "reason": "cached",
            },
            {"middleware": "c", "decision": "deny", "reason": "not now"},
            {"middleware": "d", "decision": "deny", "reason": "later deny"},
            {"middleware": "e", "decision": "append", "note": "two"},
        ]
    )
    assert combined == Combined(kind="deny", by="c", reason="not now", notes=("a: one", "e: two"))
    cut = combine([{"middleware": "b", "decision": "short_circuit", "value": 5, "reason": "r"}])
    assert cut == Combined(kind="short_circuit", by="b", reason="r", value=5)
    bare = combine([{"decision": "ask"}])
    assert bare == Combined(kind="ask")
