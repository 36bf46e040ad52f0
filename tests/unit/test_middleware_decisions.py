"""Middleware decisions as data: what a hook may print, what each point accepts, and
how decisions meet (``keel.core.middleware.combine``), and the hooks.toml parser."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from keel.core.errors import ConfigError
from keel.core.hooks_config import parse_hooks_config
from keel.core.middleware import (
    ALLOWED,
    CONTINUE,
    Append,
    Ask,
    Deny,
    Modify,
    Point,
    ShortCircuit,
    check_decision,
    combine,
    decision_from_json,
)


@pytest.mark.parametrize(
    ("printed", "expected"),
    [
        (None, CONTINUE),
        ({}, CONTINUE),
        ({"decision": "continue"}, CONTINUE),
        ({"decision": "deny", "reason": "no"}, Deny("no")),
        ({"decision": "ask", "reason": "check"}, Ask("check")),
        ({"decision": "append", "note": "n"}, Append("n")),
        ({"decision": "modify", "patch": {"output": "x"}}, Modify({"output": "x"})),
        ({"decision": "short_circuit", "value": 3, "reason": "r"}, ShortCircuit(3, "r")),
    ],
)
def test_what_a_hook_prints_becomes_a_typed_decision(printed: Any, expected: Any) -> None:
    assert decision_from_json(printed) == expected


@pytest.mark.parametrize(
    ("printed", "message"),
    [
        ([], "a decision is a JSON object"),
        ({"decision": "maybe"}, "unknown decision 'maybe'"),
        ({"decision": "deny"}, "a deny decision needs a reason"),
        ({"decision": "ask", "reason": ""}, "an ask decision needs a reason"),
        ({"decision": "modify"}, "needs a patch object"),
        ({"decision": "modify", "patch": []}, "needs a patch object"),
        ({"decision": "short_circuit"}, "needs a value"),
        ({"decision": "append", "note": 5}, "non-empty note"),
        ({"decision": "deny", "reason": 7}, "reason is a string"),
    ],
)
def test_a_malformed_decision_is_a_precise_error(printed: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        decision_from_json(printed)


def test_each_point_accepts_only_its_own_decisions_and_patch_fields() -> None:
    check_decision(Point.BEFORE_TOOL, Ask("a person"))
    with pytest.raises(ConfigError, match="ask is not a decision at after_tool"):
        check_decision(Point.AFTER_TOOL, Ask("too late"))
    with pytest.raises(ConfigError, match="short_circuit is not a decision at before_complete"):
        check_decision(Point.BEFORE_COMPLETE, ShortCircuit("done"))
    with pytest.raises(ConfigError, match="a patch at before_tool changes arguments"):
        check_decision(Point.BEFORE_TOOL, Modify({"output": "x"}))
    with pytest.raises(ConfigError, match="a patch at after_tool"):
        check_decision(Point.AFTER_TOOL, Modify({}))
    with pytest.raises(ConfigError, match="not str"):
        check_decision(Point.BEFORE_MODEL, "deny")
    assert all(kinds == {"continue"} for p, kinds in ALLOWED.items() if p is Point.ON_EVENT)


def record(name: str, kind: str, **more: Any) -> dict[str, Any]:
    return {"middleware": name, "point": "before_tool", "decision": kind, **more}


def test_deny_beats_ask_beats_short_circuit_beats_modify_whatever_the_order() -> None:
    modify = record("m", "modify", patch={"arguments": {"a": 1}})
    short = record("s", "short_circuit", value="v")
    ask = record("a", "ask", reason="check")
    deny = record("d", "deny", reason="no")
    assert combine([modify, short, ask, deny]).kind == "deny"
    assert combine([deny, ask]).by == "d"
    assert combine([modify, ask, short]).kind == "ask"
    assert combine([modify, short]).kind == "short_circuit"
    assert combine([modify]).kind == "modify"
    assert combine([]).kind == "continue"


def test_modifications_compose_in_order_arguments_key_by_key() -> None:
    combined = combine(
        [
            record("one", "modify", patch={"arguments": {"path": "b", "mode": 1}}),
            record("two", "modify", patch={"arguments": {"mode": 2}}),
            record("three", "append", note="see docs"),
            record("four", "error", error="boom", failed="open"),
        ]
    )
    assert combined.patch == {"arguments": {"path": "b", "mode": 2}}
    assert combined.notes == ("three: see docs",)
    assert combined.kind == "modify"


def test_other_fields_are_replaced_by_the_later_patch() -> None:
    combined = combine(
        [
            record("one", "modify", patch={"output": "first"}),
            record("two", "modify", patch={"output": "second"}),
        ]
    )
    assert combined.patch == {"output": "second"}


KINDS = st.sampled_from(["modify", "short_circuit", "ask", "deny", "append", "error"])


@given(st.lists(KINDS, max_size=8))
def test_the_strongest_decision_wins_and_the_first_of_its_kind_speaks(kinds: list[str]) -> None:
    records = [
        record(f"m{i}", k, reason=f"r{i}", patch={"output": f"o{i}"}, value=i, note=f"n{i}")
        for i, k in enumerate(kinds)
    ]
    combined = combine(records)
    for strongest in ("deny", "ask", "short_circuit"):
        if strongest in kinds:
            first = kinds.index(strongest)
            assert (combined.kind, combined.by) == (strongest, f"m{first}")
            break
    else:
        assert combined.kind == ("modify" if "modify" in kinds else "continue")
    assert len(combined.notes) == kinds.count("append")


# --- hooks.toml ---------------------------------------------------------------------------


def test_a_full_hooks_file_parses() -> None:
    config = parse_hooks_config(
        """
        [middleware]
        use = ["audit", "audit"]
        [write_size]
        max_bytes = 500
        [[hooks]]
        name = "guard"
        point = "before_tool"
        command = [".keel/hooks/guard.py", "--strict"]
        tools = ["run_command"]
        timeout_seconds = 2.5
        on_error = "open"
        order = -1
        env = ["TOKEN"]
        """,
        "hooks.toml",
    )
    assert config.use == ("audit",)
    assert config.write_max_bytes == 500
    (hook,) = config.hooks
    assert (hook.name, hook.point, hook.command) == (
        "guard",
        Point.BEFORE_TOOL,
        (".keel/hooks/guard.py", "--strict"),
    )
    assert (hook.tools, hook.timeout_s, hook.on_error, hook.order, hook.env) == (
        ("run_command",),
        2.5,
        "open",
        -1,
        ("TOKEN",),
    )


HOOK = '[[hooks]]\nname = "h"\npoint = "before_tool"\ncommand = ["x"]\n'


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (HOOK + "tools = 'all'\n", r"hooks\[0\] \(h\)\.tools: a list"),
        (HOOK.replace("before_tool", "before_model") + "tools = ['a']\n", "only for before_tool"),
        (HOOK + "timeout_seconds = 0\n", "timeout_seconds: above 0"),
        (HOOK + "timeout_seconds = 'soon'\n", "timeout_seconds: a number"),
        (HOOK + "on_error = 'maybe'\n", "on_error"),
        (HOOK + "order = 1.5\n", "order: a whole number"),
        (HOOK + "env = ['BAD-NAME']\n", "env: a list of environment variable names"),
        (HOOK + "colour = 'red'\n", "unknown key 'colour'"),
        (HOOK + HOOK, "two hooks are named 'h'"),
        (HOOK.replace('"h"', '"../h"'), "name: letters"),
        (HOOK.replace('["x"]', '["a\\u0000b"]'), "command: a non-empty argv"),
        ("[middleware]\nuse = 'audit'\n", "use: a list of entry point names"),
        ("[middleware]\nextra = 1\n", "a table with use"),
        ("[write_size]\nmax_bytes = true\n", "max_bytes: a whole number"),
        ("hooks = 3\n", "an array of"),
    ],
)
def test_a_broken_hooks_file_names_the_file_the_entry_and_the_key(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as raised:
        parse_hooks_config(text, "/ws/.keel/hooks.toml")
    assert str(raised.value).startswith("/ws/.keel/hooks.toml: ")
