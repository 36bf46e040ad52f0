"""The allowed / asked / refused matrix of every built-in tool in every mode (no rules)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from keel.core.errors import ConfigError, UsageError
from keel.policy import DEFAULT_MODE, Mode, Policy, parse_mode

WORKSPACE = Path("/srv/work/project")

# What each mode decides for each built-in tool (SPEC.md tool table), with no user rules.
# web_fetch stands for any tool with the "external" effect.
MATRIX = [
    # tool                effect      plan     ask      edit     auto
    ("read_file",          "read",     "allow", "allow", "allow", "allow"),
    ("list_dir",           "read",     "allow", "allow", "allow", "allow"),
    ("glob",               "read",     "allow", "allow", "allow", "allow"),
    ("grep",               "read",     "allow", "allow", "allow", "allow"),
    ("write_file",         "write",    "deny",  "ask",   "allow", "allow"),
    ("edit_file",          "write",    "deny",  "ask",   "allow", "allow"),
    ("run_command",        "execute",  "deny",  "ask",   "ask",   "allow"),
    ("todo_write",         "state",    "allow", "allow", "allow", "allow"),
    ("request_completion", "state",    "allow", "allow", "allow", "allow"),
    ("ask_user",           "state",    "allow", "allow", "allow", "allow"),
    ("plan_write",         "state",    "allow", "allow", "allow", "allow"),
    ("plan_exit",          "state",    "ask",   "deny",  "deny",  "deny"),
    ("create_task",        "state",    "allow", "allow", "allow", "allow"),
    ("web_fetch",          "external", "deny",  "ask",   "ask",   "ask"),
]  # fmt: skip

SAMPLE_ARGUMENTS: dict[str, dict[str, Any]] = {
    "read_file": {"path": "src/app.py"},
    "list_dir": {"path": "."},
    "glob": {"pattern": "**/*.py"},
    "grep": {"pattern": "TODO"},
    "write_file": {"path": "src/app.py", "content": "x = 1\n"},
    "edit_file": {"path": "src/app.py", "old_text": "1", "new_text": "2"},
    "run_command": {"argv": ["pytest", "-q"]},
    "todo_write": {"todos": [{"content": "a", "status": "pending"}]},
    "request_completion": {"summary": "done"},
    "ask_user": {"question": "which branch?"},
    "plan_write": {"content": "- step one"},
    "plan_exit": {"summary": "ready"},
    "create_task": {"subject": "write docs"},
    "web_fetch": {"url": "https://example.com"},
}

MODES = (Mode.PLAN, Mode.ASK, Mode.EDIT, Mode.AUTO)
CASES = [
    pytest.param(tool, effect, SAMPLE_ARGUMENTS[tool], mode, row[i], id=f"{tool}-{mode.value}")
    for (tool, effect, *row) in MATRIX
    for i, mode in enumerate(MODES)
]


@pytest.mark.parametrize(("tool", "effect", "arguments", "mode", "expected"), CASES)
def test_mode_decides_each_builtin_tool(
    tool: str, effect: str, arguments: dict[str, Any], mode: Mode, expected: str
) -> None:
    decision = Policy().decide(tool, effect, arguments, mode=mode, workspace=WORKSPACE)

    assert decision.action == expected
    assert decision.rule == f"mode:{mode.value}"
    assert decision.permanent is False  # no mode refusal is for good
    assert decision.reason


@pytest.mark.parametrize(
    ("tool", "effect", "arguments"),
    [
        ("write_file", "write", {"path": "a.txt", "content": ""}),
        ("edit_file", "write", {"path": "a.txt", "old_text": "a", "new_text": "b"}),
        ("run_command", "execute", {"argv": ["make"]}),
    ],
)
def test_plan_mode_refusal_tells_the_model_how_to_leave_plan_mode(
    tool: str, effect: str, arguments: dict[str, Any]
) -> None:
    decision = Policy().decide(tool, effect, arguments, mode=Mode.PLAN, workspace=WORKSPACE)

    assert decision.action == "deny"
    assert "plan mode" in decision.reason
    assert tool in decision.reason
    assert "plan_write" in decision.reason
    assert "plan_exit" in decision.reason


def test_plan_exit_outside_plan_mode_says_there_is_no_plan_mode_to_leave() -> None:
    decision = Policy().decide(
        "plan_exit", "state", {"summary": "s"}, mode=Mode.EDIT, workspace=WORKSPACE
    )

    assert decision.action == "deny"
    assert "only works in plan mode" in decision.reason
    assert "edit mode" in decision.reason


def test_default_mode_is_edit() -> None:
    assert DEFAULT_MODE is Mode.EDIT


def test_parse_mode_names_the_choices_for_an_unknown_mode() -> None:
    assert parse_mode("auto") is Mode.AUTO
    with pytest.raises(ConfigError, match=r"plan\|ask\|edit\|auto"):
        parse_mode("yolo")


def test_unknown_effect_is_refused_as_a_programming_error() -> None:
    with pytest.raises(UsageError, match="unknown effect 'delete'"):
        Policy().decide("rm_tool", "delete", {}, mode=Mode.AUTO, workspace=WORKSPACE)
