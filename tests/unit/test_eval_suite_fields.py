"""The suite file beyond its happy path: every case key reaches the case, the defaults
give way to the case, and each refusal says exactly what a key must be."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from keel.core.budget import Budget
from keel.core.errors import ConfigError
from keel.core.eval_suite import (
    EvalConfig,
    EvalSuite,
    Expectation,
    attempt_settings,
    git_relative_to,
    model_relative_to,
    parse_suite,
)

BASE = Path("/suites")


def suite(text: str, source: str = "s.toml") -> EvalSuite:
    return parse_suite(text, source, BASE)


def refused(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        suite(text)


CASE_KEYS = (
    "agent, budget, expect, git, goal, instructions, mode, model, name, outcome, policy, "
    "repetitions, tools, verify, verify_agent, verify_human, workspace"
)
CASE = '[[cases]]\nname = "c"\ngoal = "g"\nworkspace = "w"\n'


def test_every_key_of_a_case_reaches_it() -> None:
    [case] = suite(
        CASE + 'model = "m"\ninstructions = "Be brief."\nagent = "coder"\noutcome = "done_ok"\n'
        'mode = "auto"\ntools = ["read_file"]\npolicy = "p.toml"\n'
    ).cases
    assert (case.model, case.instructions, case.agent) == ("m", "Be brief.", "coder")
    assert (case.outcome, case.mode, case.tools) == ("done_ok", "auto", ("read_file",))
    assert case.policy == BASE / "p.toml"


def test_a_case_without_a_mode_is_an_edit_run_and_repetitions_default_to_one() -> None:
    parsed = suite(CASE)
    assert parsed.cases[0].mode == "edit" and parsed.repetitions == 1
    assert (parsed.cases[0].outcome, parsed.cases[0].tools, parsed.cases[0].policy) == (None,) * 3


def test_defaults_reach_every_case_and_a_case_overrides_them() -> None:
    parsed = suite(
        '[defaults]\ninstructions = "i"\nagent = "a"\noutcome = "o"\nexpect = { reason = "r" }\n'
        + CASE
        + '[[cases]]\nname = "d"\ngoal = "g"\ngit = "https://h/x.git"\nagent = "b"\n'
        + 'expect = { status = "failed" }\n'
    )
    first, second = parsed.cases
    assert (first.instructions, first.agent, first.outcome) == ("i", "a", "o")
    assert first.expect == Expectation(reason="r")
    assert second.agent == "b" and second.expect == Expectation(status="failed", reason="r")


@pytest.mark.parametrize(
    ("default", "own", "workspace", "git"),
    [
        ('workspace = "dw"', 'git = "https://h/x.git"', None, "https://h/x.git"),
        ('git = "https://h/x.git"', 'workspace = "w"', BASE / "w", None),
    ],
)
def test_a_cases_own_source_replaces_the_default_one(
    default: str, own: str, workspace: Path | None, git: str | None
) -> None:
    [case] = suite(f'[defaults]\n{default}\n[[cases]]\nname = "c"\ngoal = "g"\n{own}\n').cases
    assert (case.workspace, case.git) == (workspace, git)


@pytest.mark.parametrize(
    ("default", "workspace", "git"),
    [('workspace = "dw"', BASE / "dw", None), ('git = "https://h/x.git"', None, "https://h/x.git")],
)
def test_a_default_source_reaches_a_case_that_names_none(
    default: str, workspace: Path | None, git: str | None
) -> None:
    [case] = suite(f'[defaults]\n{default}\n[[cases]]\nname = "c"\ngoal = "g"\n').cases
    assert (case.workspace, case.git) == (workspace, git)


def test_a_cases_budget_and_expectation_stand_alone_without_defaults() -> None:
    [case] = suite(CASE + 'budget = { steps = 3 }\nexpect = { status = "failed" }\n').cases
    assert case.budget == Budget(max_steps=3)
    assert case.expect == Expectation(status="failed")


def test_a_case_with_both_sources_is_refused() -> None:
    refused(
        CASE + 'git = "https://h/x.git"\n',
        "s.toml: cases[0].workspace: give workspace = DIR (copied for every attempt) or git = "
        "URL@REF, one of them",
    )


@pytest.mark.parametrize(
    "key", ["goal", "instructions", "agent", "outcome", "mode", "git", "model"]
)
def test_a_text_key_must_be_non_empty_text(key: str) -> None:
    body = {"goal": "g", "workspace": "w"}
    body[key] = " "
    lines = "\n".join(f'{k} = "{v}"' for k, v in body.items())
    refused(f'[[cases]]\nname = "c"\n{lines}\n', f"s.toml: cases[0].{key}: a non-empty text")
    body[key] = 3  # type: ignore[assignment]
    lines = "\n".join(f"{k} = {v!r}" if k == key else f'{k} = "{v}"' for k, v in body.items())
    refused(f'[[cases]]\nname = "c"\n{lines}\n', f"s.toml: cases[0].{key}: a non-empty text")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "[[cases]]\nname = 3\ngoal = 'g'\n",
            "s.toml: cases[0].name: letters, digits, '_', '.' or '-' (at most 64), starting with a "
            "letter or digit, got 3",
        ),
        ("[[cases]]\nname = 'c'\ngoal = 3\n", "s.toml: cases[0].goal: a non-empty text"),
        ("cases = 3\n", "s.toml: cases: give at least one [[cases]] table"),
        ("cases = [1]\n", "s.toml: cases: each case is a [[cases]] table"),
        ("defaults = 3\n" + CASE, "s.toml: defaults: a table of case keys"),
        ("[defaults]\nname = 'x'\n" + CASE, "s.toml: defaults: name and goal belong to each case"),
        (
            "[defaults]\ncolour = 1\n" + CASE,
            "s.toml: defaults: unknown key 'colour'; a case has " + CASE_KEYS,
        ),
        (
            CASE + "workspace2 = 1\n",
            "s.toml: cases[0]: unknown key 'workspace2'; a case has " + CASE_KEYS,
        ),
        (
            '[[cases]]\nname = "c"\ngoal = "g"\nworkspace = " "\n',
            "s.toml: cases[0].workspace: a path (relative to the suite file)",
        ),
        (CASE + "policy = 3\n", "s.toml: cases[0].policy: a path (relative to the suite file)"),
        (CASE + "tools = ['']\n", "s.toml: cases[0].tools: a list of non-empty texts"),
        (
            CASE + "budget = { step = 1 }\n",
            "s.toml: cases[0].budget: unknown key 'step'; a budget has steps, tool_calls, tokens, "
            "cost, wall_seconds",
        ),
        (
            CASE + "expect = 3\n",
            's.toml: cases[0].expect: a table such as { status = "completed" }',
        ),
        (
            CASE + "expect = { why = 'x' }\n",
            "s.toml: cases[0].expect: unknown key 'why'; expect has outcome, reason, status",
        ),
        (
            CASE + "expect = { status = 'gone' }\n",
            "s.toml: cases[0].expect.status: one of completed, failed, blocked, cancelled, "
            "waiting, paused, got 'gone'",
        ),
        (CASE + "expect = { outcome = '' }\n", "s.toml: cases[0].expect.outcome: a non-empty text"),
        (CASE + "expect = { reason = 3 }\n", "s.toml: cases[0].expect.reason: a non-empty text"),
        (
            CASE + "expect = { outcome = 'Bad!' }\n",
            "s.toml: cases[0].expect.outcome: an outcome is a lowercase name such as "
            "change_ready_for_approval, got 'Bad!'",
        ),
        (
            "repetitions = 1001\n" + CASE,
            "s.toml: repetitions: a whole number from 1 to 1000, got 1001",
        ),
        ("configs = 3\n" + CASE, "s.toml: configs: tables [configs.NAME]"),
        (
            "[configs.b]\nmodle = 'x'\n" + CASE,
            "s.toml: configs.b: unknown key 'modle'; a configuration has agent, instructions, "
            "middleware, model",
        ),
        (
            "[configs.default]\n" + CASE,
            "s.toml: configs.default: a configuration's name is lowercase letters, digits, '_' "
            "or '-' (at most 32), not 'default'",
        ),
    ],
)
def test_each_refusal_says_exactly_what_the_key_must_be(text: str, message: str) -> None:
    refused(text, message)


@pytest.mark.parametrize("key", ["model", "instructions", "agent"])
def test_a_configurations_text_must_be_non_empty(key: str) -> None:
    refused(f'[configs.b]\n{key} = " "\n' + CASE, f"s.toml: configs.b.{key}: a non-empty text")


def test_repetitions_up_to_a_thousand() -> None:
    assert suite("repetitions = 1000\n" + CASE).repetitions == 1000


def test_an_unknown_configuration_to_compare_lists_the_ones_there_are() -> None:
    parsed = suite("[configs.a]\n[configs.b]\n" + CASE)
    with pytest.raises(ConfigError) as err:
        parsed.chosen_configs(["a", "c"])
    assert str(err.value) == (
        "s.toml: --compare: no configuration 'c'; the suite has [configs.a], [configs.b]"
    )
    with pytest.raises(ConfigError) as err:
        suite(CASE).chosen_configs(["a", "b"])
    assert str(err.value) == "s.toml: --compare: no configuration 'a'; the suite has none"


def test_a_missing_model_says_where_it_may_be_given() -> None:
    [case] = suite(CASE).cases
    with pytest.raises(ConfigError) as err:
        attempt_settings(case, EvalConfig(name="default"), "s.toml")
    assert str(err.value) == (
        "s.toml: cases[0].model: missing: give model = SPEC in the case, in [defaults] or in "
        "the configuration"
    )


def test_shortfalls_without_a_reason_or_outcome_say_so() -> None:
    assert (
        Expectation().shortfall("failed", None, None)
        == "ended failed (no reason), expected completed"
    )
    assert (
        Expectation(outcome="x").shortfall("completed", None, "verified")
        == "outcome none, expected x"
    )
    assert (
        Expectation(reason="r").shortfall("completed", None, None) == "stop reason none, expected r"
    )


def test_an_expectation_and_a_configuration_as_json() -> None:
    assert Expectation().to_dict() == {"status": "completed"}
    assert Expectation(status="failed", outcome="o", reason="r").to_dict() == {
        "status": "failed",
        "outcome": "o",
        "reason": "r",
    }
    assert EvalConfig(
        name="b", model="m", instructions="i", agent="a", middleware=("x",)
    ).to_dict() == {
        "model": "m",
        "instructions": "i",
        "agent": "a",
        "middleware": ["x"],
    }


def test_a_file_model_is_joined_to_the_suites_folder_unless_absolute() -> None:
    assert model_relative_to("scripted:/abs/m.json", BASE) == "scripted:/abs/m.json"
    assert model_relative_to("replay:c.json", BASE) == f"replay:{BASE}/c.json"
    assert model_relative_to("openai:gpt", BASE) == "openai:gpt"


@pytest.mark.parametrize(
    ("source", "joined"),
    [
        ("app@feature@v2", f"{BASE}/app@feature@v2"),  # the ref is after the last @
        ("app@", f"{BASE}/app@"),
        ("app@/x", f"{BASE}/app@/x"),
        ("@main", f"{BASE}/@main"),
        ("h:app", f"{BASE}/h:app"),  # a one-letter prefix is a local path, two letters a host
        ("ab:c@v1", "ab:c@v1"),
        ("dir/x:y", f"{BASE}/dir/x:y"),
        ("user@host:org/app.git", "user@host:org/app.git"),
        ("file://x/app@v1", "file://x/app@v1"),
        # the path is joined without the ref, so a slash before the ref is dropped
        ("repos/app/@main", f"{BASE}/repos/app@main"),
        ("mirrors/app@2024/@v2", f"{BASE}/mirrors/app@2024@v2"),
        ("repos/app/@/x", f"{BASE}/repos/app/@/x"),  # "/x" is no ref: the path is kept
        ("git@host:org/app:v1.git", "git@host:org/app:v1.git"),  # the host is before the 1st :
        ("x://mirror/app.git", "x://mirror/app.git"),  # any scheme://, even one letter long
    ],
)
def test_which_git_sources_are_local_paths(source: str, joined: str) -> None:
    assert git_relative_to(source, BASE) == joined
