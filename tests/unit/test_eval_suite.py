"""The suite file: defaults, configurations and paths; every malformed key a precise error."""

from __future__ import annotations

from pathlib import Path

import pytest

from keel.core.budget import Budget
from keel.core.errors import ConfigError
from keel.core.eval_suite import (
    DEFAULT_CONFIG,
    EvalConfig,
    Expectation,
    attempt_settings,
    git_relative_to,
    parse_suite,
)

BASE = Path("/suites/coding")
GOOD = """
name = "coding"
repetitions = 3
[defaults]
mode = "auto"
budget = { steps = 20, tool_calls = 40 }
expect = { status = "completed" }
model = "scripted:scripts/{case}.json"
[[cases]]
name = "fix-pin"
goal = "Fix the pin."
workspace = "fixtures/inventory"
verify = ["unit_tests=python3 -m unittest"]
budget = { steps = 5 }
expect = { outcome = "change_ready_for_approval" }
[[cases]]
name = "remote"
goal = "Do it elsewhere."
git = "https://example.invalid/repo.git@v2"
verify_human = ["security"]
verify_agent = ["review=reviewer"]
repetitions = 1
[configs.baseline]
model = "replay:cassettes/{case}.json"
[configs.candidate]
instructions = "Be brief."
middleware = ["audit"]
agent = "reviewer"
"""


def error(text: str) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_suite(text, "suite.toml", BASE)
    return str(caught.value)


def case(extra: str = "", *, head: str = "") -> str:
    one = '[[cases]]\nname = "c"\ngoal = "g"\nworkspace = "w"\nmodel = "scripted:m.json"'
    return f"{head}\n{one}\n{extra}"


def test_a_suite_applies_defaults_key_by_key_and_joins_paths_to_its_folder() -> None:
    suite = parse_suite(GOOD, "suite.toml", BASE)
    assert suite.name == "coding" and suite.repetitions == 3
    pin, remote = suite.cases
    assert pin.workspace == BASE / "fixtures/inventory"
    assert pin.budget == Budget(
        max_steps=5, max_tool_calls=40
    )  # the case's steps, the default's calls
    assert pin.expect == Expectation(status="completed", outcome="change_ready_for_approval")
    assert pin.mode == "auto" and pin.model == f"scripted:{BASE}/scripts/{{case}}.json"
    assert pin.verify == ("unit_tests=python3 -m unittest",)
    assert remote.git == "https://example.invalid/repo.git@v2" and remote.workspace is None
    assert remote.repetitions == 1 and remote.verify_human == ("security",)
    assert remote.verify_agent == ("review=reviewer",)
    assert set(suite.configs) == {"baseline", "candidate"}


def test_a_configuration_wins_over_the_case_and_names_the_case_in_its_model() -> None:
    suite = parse_suite(GOOD, "suite.toml", BASE)
    pin = suite.cases[0]
    baseline, candidate = suite.chosen_configs(["baseline", "candidate"])
    assert attempt_settings(pin, baseline, "suite.toml").model == (
        f"replay:{BASE}/cassettes/fix-pin.json"
    )
    brief = attempt_settings(pin, candidate, "suite.toml")
    assert brief.model == f"scripted:{BASE}/scripts/fix-pin.json"
    assert brief.goal == "Be brief.\n\nFix the pin." and brief.agent == "reviewer"
    assert candidate.middleware == ("audit",)
    (default,) = suite.chosen_configs(None)
    assert default == EvalConfig(name=DEFAULT_CONFIG)
    assert attempt_settings(pin, default, "suite.toml").goal == "Fix the pin."


def test_the_suite_name_defaults_to_the_file_name() -> None:
    assert parse_suite(case(), "evals/smoke.toml", BASE).name == "smoke"


def test_local_git_sources_are_relative_to_the_suite_and_urls_stay() -> None:
    assert git_relative_to("repos/app@main", BASE) == f"{BASE}/repos/app@main"
    assert git_relative_to("repos/app", BASE) == f"{BASE}/repos/app"
    assert git_relative_to("/abs/app@v1", BASE) == "/abs/app@v1"
    assert git_relative_to("git@host:org/app.git@v2", BASE) == "git@host:org/app.git@v2"
    assert git_relative_to("https://h/app.git", BASE) == "https://h/app.git"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("colour = 1\n" + case(), "suite.toml: unknown key 'colour'; a suite has cases, configs, "),
        (case("gaol = 'x'"), "suite.toml: cases[0]: unknown key 'gaol'; a case has agent, "),
        (
            '[[cases]]\nname = "c"\nworkspace = "w"\n',
            "suite.toml: cases[0].goal: missing: say what the run should achieve",
        ),
        (
            case("budget = { steps = 0 }"),
            "suite.toml: cases[0].budget.steps must be a whole number from 1 to ",
        ),
        (
            case("budget = { cost = -1 }"),
            "suite.toml: cases[0].budget.cost must be a finite number above 0 (USD), got -1",
        ),
        (case("budget = { step = 3 }"), "suite.toml: cases[0].budget: unknown key 'step'; "),
        (case("budget = 3"), "suite.toml: cases[0].budget: a table such as"),
        (
            case(head="[defaults]\nbudget = { wall_seconds = 0 }"),
            "suite.toml: defaults.budget.wall_seconds must be a number of seconds above 0",
        ),
        (case("git = 'x@y'"), "suite.toml: cases[0].workspace: give workspace = DIR"),
        (
            '[[cases]]\nname = "c"\ngoal = "g"\n',
            "suite.toml: cases[0].workspace: give workspace = DIR",
        ),
        (case("expect = { status = 'done' }"), "suite.toml: cases[0].expect.status: one of "),
        (case("expect = { outcom = 'x' }"), "suite.toml: cases[0].expect: unknown key 'outcom'"),
        (
            case("outcome = 'Not OK'"),
            "suite.toml: cases[0].outcome: an outcome is a lowercase name",
        ),
        (
            case("verify = ['a=true', 'a=false']"),
            "suite.toml: cases[0].verify: two verifiers are named 'a'",
        ),
        (
            case("verify = ['a=true']\nverify_human = ['a']"),
            "suite.toml: cases[0].verify_human: 'a' names both a command verifier and a sign-off",
        ),
        (
            case("verify_human = ['a']\nverify_agent = ['a=reviewer']"),
            "suite.toml: cases[0].verify_agent: 'a' names both a reviewer and another verifier",
        ),
        (
            case("verify_agent = ['reviewer']"),
            "suite.toml: cases[0].verify_agent: a reviewer is NAME=AGENT",
        ),
        (case("verify = 'pytest'"), "suite.toml: cases[0].verify: a list of non-empty texts"),
        (case("repetitions = 0"), "suite.toml: cases[0].repetitions: a whole number from 1 to"),
        (case(head="repetitions = true"), "suite.toml: repetitions: a whole number from 1 to"),
        (case("name = 'c'"), "suite.toml: not valid TOML: "),  # the key given twice
        (case() + case(), "suite.toml: cases: two cases are named 'c'"),
        ("name = 'x'\n", "suite.toml: cases: give at least one [[cases]] table"),
        (case(head="[defaults]\ngoal = 'g'"), "suite.toml: defaults: name and goal belong to"),
        (case(head="[configs.b]\nmodle = 'x'"), "suite.toml: configs.b: unknown key 'modle'"),
        (case(head="[configs.B]\nmodel = 'x'"), "suite.toml: configs.B: a configuration's name"),
        (
            case(head="[configs.b]\nmiddleware = 'audit'"),
            "suite.toml: configs.b.middleware: a list of non-empty texts",
        ),
        (case(head="name = 'a b'"), "suite.toml: name: letters, digits"),
    ],
)
def test_every_malformed_key_is_named_with_the_file(text: str, message: str) -> None:
    found = error(text)
    assert found.startswith(message), found
    assert "\n" not in found


def test_compare_names_two_configurations_of_the_file() -> None:
    suite = parse_suite(case(head="[configs.a]\n[configs.b]"), "suite.toml", BASE)
    assert [c.name for c in suite.chosen_configs(["b", "a"])] == ["b", "a"]
    with pytest.raises(ConfigError, match=r"^suite.toml: --compare: no configuration 'c'; "):
        suite.chosen_configs(["a", "c"])
    with pytest.raises(ConfigError, match="--compare takes two different configurations"):
        suite.chosen_configs(["a", "a"])


def test_a_case_without_any_model_is_refused_when_planned() -> None:
    suite = parse_suite('[[cases]]\nname = "c"\ngoal = "g"\nworkspace = "w"\n', "s.toml", BASE)
    with pytest.raises(ConfigError, match=r"^s.toml: cases\[0\].model: missing"):
        attempt_settings(suite.cases[0], EvalConfig(name="default"), "s.toml")


def test_an_expectation_says_how_an_ending_missed_it() -> None:
    expect = Expectation(outcome="change_ready_for_approval")
    assert expect.shortfall("completed", "change_ready_for_approval", "verified") is None
    assert expect.shortfall("failed", None, "budget_exhausted:steps") == (
        "ended failed (budget_exhausted:steps), expected completed"
    )
    assert expect.shortfall("completed", "task_completed", "verified") == (
        "outcome task_completed, expected change_ready_for_approval"
    )
    waiting = Expectation(status="waiting", reason="signoff:security")
    assert waiting.shortfall("waiting", None, "signoff:security") is None
    assert waiting.shortfall("waiting", None, "approval") == (
        "stop reason approval, expected signoff:security"
    )
