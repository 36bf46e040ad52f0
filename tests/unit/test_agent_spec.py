"""Parsing one agent spec's text: every field, every refusal naming file and line, narrowing."""

from __future__ import annotations

import hashlib
import re
from dataclasses import replace

import pytest

from keel.core.agent_spec import (
    MAX_SPEC_BYTES,
    MODES,
    AgentSpec,
    FailurePolicy,
    OnFailure,
    narrowed,
    parse_agent_spec,
)
from keel.core.budget import Budget
from keel.core.errors import ConfigError
from keel.policy.modes import ACTIONS, EFFECTS, Mode, mode_default

TOOLS = ("read_file", "list_dir", "glob", "grep", "write_file", "run_command")
SOURCE = ".keel/agents/helper.md"


def parse(text: str, *, name: str = "helper", agents: tuple[str, ...] | None = None) -> AgentSpec:
    return parse_agent_spec(
        text.encode(), name=name, source=SOURCE, known_tools=TOOLS, known_agents=agents
    )


def refusal(text: str, **kwargs: object) -> str:
    with pytest.raises(ConfigError) as info:
        parse(text, **kwargs)  # type: ignore[arg-type]
    return str(info.value)


FULL = """\
---
description: Finds things
model: deepseek:deepseek-chat
tools: [read_file, grep]
mode: plan
workspace: shared-readonly
budget:
  steps: 10
  tool_calls: 40
  tokens: 100000
  cost: 0.5
  wall_seconds: 120
verify:
  - pytest -q
  - ruff check .
output:
  type: object
  required: [answer]
  properties:
    answer: {type: string}
on_failure: {policy: retry, attempts: 2, agent: explorer, then: escalate}
version: 3
---
Look around.

Then answer.
"""


def test_full_spec_parses_every_field() -> None:
    spec = parse(FULL, agents=("explorer", "helper"))
    assert spec.name == "helper"
    assert spec.description == "Finds things"
    assert spec.instructions == "Look around.\n\nThen answer."
    assert spec.model == "deepseek:deepseek-chat"
    assert spec.tools == ("read_file", "grep")
    assert spec.mode == "plan"
    assert spec.workspace == "shared-readonly"
    assert spec.budget == Budget(
        max_steps=10, max_tool_calls=40, max_tokens=100000, max_cost=0.5, max_wall_seconds=120
    )
    assert spec.verify == ("pytest -q", "ruff check .")
    assert spec.output == {
        "type": "object",
        "required": ["answer"],
        "properties": {"answer": {"type": "string"}},
    }
    assert spec.on_failure == OnFailure(
        policy=FailurePolicy.RETRY,
        attempts=2,
        agent="explorer",
        then=FailurePolicy.ESCALATE,
    )
    assert spec.version == 3
    assert spec.source == SOURCE
    assert re.fullmatch(r"[0-9a-f]{64}", spec.digest)


def test_minimal_spec_takes_the_defaults() -> None:
    spec = parse("---\ndescription: d\n---\nDo it.\n")
    assert (spec.model, spec.tools, spec.mode, spec.budget, spec.output) == (None,) * 5
    assert spec.workspace == "isolated"
    assert spec.verify == ()
    assert spec.on_failure == OnFailure(policy=FailurePolicy.FAIL_FAST)
    assert spec.version == 1


def test_partial_budget_leaves_other_dimensions_unlimited() -> None:
    spec = parse("---\ndescription: d\nbudget: {tokens: 5000}\n---\nb\n")
    assert spec.budget == Budget(max_steps=None, max_tool_calls=None, max_tokens=5000)


def test_empty_tool_allowlist_means_no_tools() -> None:
    assert parse("---\ndescription: d\ntools: []\n---\nb\n").tools == ()


def test_crlf_line_endings_and_a_bom_are_accepted() -> None:
    text = "\ufeff---\r\ndescription: d\r\nmode: ask\r\n---\r\nbody\r\n"
    spec = parse(text)
    assert (spec.description, spec.mode, spec.instructions) == ("d", "ask", "body")


@pytest.mark.parametrize(
    ("word", "policy"),
    [
        ("FAIL_FAST", FailurePolicy.FAIL_FAST),
        ("best_effort", FailurePolicy.BEST_EFFORT),
        ("Escalate", FailurePolicy.ESCALATE),
        ("RETRY", FailurePolicy.RETRY),
    ],
)
def test_on_failure_plain_word_in_any_case(word: str, policy: FailurePolicy) -> None:
    spec = parse(f"---\ndescription: d\non_failure: {word}\n---\nb\n")
    assert spec.on_failure == OnFailure(policy=policy)


def test_retry_mapping_defaults_to_one_attempt_then_fail_fast() -> None:
    spec = parse("---\ndescription: d\non_failure:\n  policy: retry\n---\nb\n")
    assert spec.on_failure == OnFailure(policy=FailurePolicy.RETRY, attempts=1)


def test_digest_is_sha256_of_exact_bytes_and_changes_with_one_byte() -> None:
    one = parse("---\ndescription: d\n---\nbody a\n")
    two = parse("---\ndescription: d\n---\nbody b\n")
    assert one.digest == hashlib.sha256(b"---\ndescription: d\n---\nbody a\n").hexdigest()
    assert one.digest != two.digest


# --- refusals: the full message names the file and the line -----------------------------------

ALLOWED = (
    "allowed: description, model, tools, mode, workspace, budget, verify, output, "
    "on_failure, version, outcome"
)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "description: d\n---\nb\n",
            f"{SOURCE}:1: no front matter: an agent spec begins with a line '---', then YAML "
            "keys (description: ...), then a line '---', then the instructions",
        ),
        (
            "---\ndescription: d\nbody\n",
            f"{SOURCE}:1: the front matter opened on line 1 is never closed by a line '---'",
        ),
        (
            "---\ndescription: d\n---\n  \n\n",
            f"{SOURCE}:4: the body is empty: write the agent's instructions after the "
            "closing '---'",
        ),
        (
            "---\nmode: plan\n---\nb\n",
            f"{SOURCE}:1: the front matter has no 'description' (one line saying what this "
            "agent is for)",
        ),
        (
            "---\n---\nb\n",
            f"{SOURCE}:1: the front matter has no 'description' (one line saying what this "
            "agent is for)",
        ),
        (
            "---\ndescription: d\n  tools: [a\n---\nb\n",
            f"{SOURCE}:3: invalid YAML: mapping values are not allowed here",
        ),
        (
            "---\ndescription: d\nmodel: x\ncolour: blue\n---\nb\n",
            f"{SOURCE}:4: unknown key 'colour' in the front matter; {ALLOWED}",
        ),
        (
            "---\ndescription: d\ndescription: e\n---\nb\n",
            f"{SOURCE}:3: key 'description' appears twice in the front matter (first on line 2)",
        ),
        (
            "---\n- description\n---\nb\n",
            f"{SOURCE}:2: the front matter must be a mapping of keys (description, model, "
            "tools, mode, workspace, budget, verify, output, on_failure, version, outcome), "
            "got a list",
        ),
        (
            "---\ndescription: [a, b]\n---\nb\n",
            f"{SOURCE}:2: description must be a non-empty string, got a list",
        ),
        (
            "---\ndescription: d\n\nmode: yolo\n---\nb\n",
            f"{SOURCE}:4: mode 'yolo' is not a mode; one of plan|ask|edit|auto",
        ),
        (
            "---\ndescription: d\nworkspace: private\n---\nb\n",
            f"{SOURCE}:3: workspace 'private' is not one of isolated|shared-readonly|shared",
        ),
        (
            "---\ndescription: d\nmodel: gpt-4o\n---\nb\n",
            f"{SOURCE}:3: model 'gpt-4o' is not a model spec: expected PROVIDER:MODEL "
            "(e.g. deepseek:deepseek-chat) or scripted:PATH",
        ),
        (
            "---\ndescription: d\ntools:\n  - read_file\n  - delete_everything\n---\nb\n",
            f"{SOURCE}:5: unknown tool 'delete_everything'; known tools: glob, grep, "
            "list_dir, read_file, run_command, write_file",
        ),
        (
            "---\ndescription: d\ntools: read_file\n---\nb\n",
            f"{SOURCE}:3: tools must be a list of tool names, got a single value",
        ),
        (
            "---\ndescription: d\ntools: [grep, grep]\n---\nb\n",
            f"{SOURCE}:3: tool 'grep' is listed twice",
        ),
        (
            "---\ndescription: d\nbudget:\n  steps: 5\n  tokens: 0\n---\nb\n",
            f"{SOURCE}:5: budget.tokens must be from 1 to 1000000000000, got 0",
        ),
        (
            "---\ndescription: d\nbudget:\n  cost: -1\n---\nb\n",
            f"{SOURCE}:4: budget.cost must be a finite number above 0, got -1",
        ),
        (
            "---\ndescription: d\nbudget:\n  wall_seconds: .nan\n---\nb\n",
            f"{SOURCE}:4: budget.wall_seconds must be a finite number above 0 and at most "
            "1000000000, got nan",
        ),
        (
            "---\ndescription: d\nbudget:\n  cost: cheap\n---\nb\n",
            f"{SOURCE}:4: budget.cost must be a number, got 'cheap'",
        ),
        (
            "---\ndescription: d\ndescription_: d\ntools: [3]\n---\nb\n",
            f"{SOURCE}:3: unknown key 'description_' in the front matter; {ALLOWED}",
        ),
        (
            "---\ndescription: d\ntools: [3]\n---\nb\n",
            f"{SOURCE}:3: a tool name must be a string, got a whole number",
        ),
        (
            "---\ndescription: d\nbudget:\n  steps: 2.5\n---\nb\n",
            f"{SOURCE}:4: budget.steps must be a whole number, got a number",
        ),
        (
            "---\ndescription: d\nbudget:\n  steps: true\n---\nb\n",
            f"{SOURCE}:4: budget.steps must be a whole number, got true/false",
        ),
        (
            "---\ndescription: d\nbudget:\n  turns: 5\n---\nb\n",
            f"{SOURCE}:4: unknown key 'turns' in budget; allowed: steps, tool_calls, tokens, "
            "cost, wall_seconds",
        ),
        (
            "---\ndescription: d\nbudget: {}\n---\nb\n",
            f"{SOURCE}:3: budget is empty; give any of steps, tool_calls, tokens, cost, "
            "wall_seconds",
        ),
        (
            "---\ndescription: d\nverify: pytest\n---\nb\n",
            f"{SOURCE}:3: verify must be a list of commands, got a single value",
        ),
        (
            "---\ndescription: d\nverify:\n  - pytest\n  - ''\n---\nb\n",
            f"{SOURCE}:5: a verify command must be a non-empty string, got ''",
        ),
        (
            "---\ndescription: d\noutput:\n  type: object\n  properties:\n"
            "    answer:\n      type: 12\n---\nb\n",
            f"{SOURCE}:7: output is not a valid JSON schema at properties/answer/type: "
            "12 is not valid under any of the given schemas",
        ),
        (
            "---\ndescription: d\noutput: [1]\n---\nb\n",
            f"{SOURCE}:3: output must be a JSON schema (a mapping), got a list",
        ),
        (
            "---\ndescription: d\non_failure: give_up\n---\nb\n",
            f"{SOURCE}:3: on_failure 'give_up' is not a failure policy; one of "
            "fail_fast|best_effort|retry|escalate",
        ),
        (
            "---\ndescription: d\non_failure:\n  policy: retry\n  attempts: 6\n---\nb\n",
            f"{SOURCE}:5: on_failure.attempts must be a whole number from 1 to 5, got 6",
        ),
        (
            "---\ndescription: d\non_failure:\n  policy: retry\n  then: retry\n---\nb\n",
            f"{SOURCE}:5: on_failure.then cannot be retry: give fail_fast, best_effort or escalate",
        ),
        (
            "---\ndescription: d\non_failure:\n  policy: escalate\n  attempts: 2\n---\nb\n",
            f"{SOURCE}:5: on_failure.attempts only applies to policy retry, not escalate",
        ),
        (
            "---\ndescription: d\non_failure:\n  attempts: 2\n---\nb\n",
            f"{SOURCE}:3: on_failure has no 'policy'",
        ),
        (
            "---\ndescription: d\non_failure:\n  policy: retry\n  agent: Bad Name\n---\nb\n",
            f"{SOURCE}:5: on_failure.agent must be an agent name (1 to 63 characters of a-z, "
            "0-9, '_' and '-', beginning with a letter or digit), got 'Bad Name'",
        ),
        (
            "---\ndescription: d\nversion: 0\n---\nb\n",
            f"{SOURCE}:3: version must be a whole number of at least 1, got 0",
        ),
        (
            "---\ndescription: d\nbudget: &b {steps: 1}\nversion: *b\n---\nb\n",
            f"{SOURCE}:4: YAML aliases (*name) are not allowed in an agent spec",
        ),
        (
            "---\ndescription: !!python/object/apply:os.system [echo hi]\n---\nb\n",
            f"{SOURCE}:2: invalid YAML: could not determine a constructor for the tag "
            "'tag:yaml.org,2002:python/object/apply:os.system'",
        ),
    ],
)
def test_refusal_names_file_and_line(text: str, message: str) -> None:
    assert refusal(text) == message


def test_unknown_retry_agent_lists_the_available_ones() -> None:
    text = "---\ndescription: d\non_failure: {policy: retry, agent: ghost}\n---\nb\n"
    assert refusal(text, agents=("explorer", "reviewer")) == (
        f"{SOURCE}:3: on_failure.agent names unknown agent 'ghost'; available: explorer, reviewer"
    )


def test_invalid_schema_under_a_nested_list_points_at_the_item() -> None:
    text = "---\ndescription: d\noutput:\n  anyOf:\n    - type: string\n    - type: nope\n---\nb\n"
    assert refusal(text).startswith(f"{SOURCE}:6: output is not a valid JSON schema at anyOf/1")


def test_draft_07_schema_is_checked_against_its_own_metaschema() -> None:
    text = (
        "---\ndescription: d\noutput:\n  $schema: 'http://json-schema.org/draft-07/schema#'\n"
        "  type: object\n  required: answer\n---\nb\n"
    )
    assert refusal(text) == (
        f"{SOURCE}:6: output is not a valid JSON schema at required: 'answer' is not of type "
        "'array'"
    )


@pytest.mark.parametrize("name", ["", "Helper", "-x", "a.b", "a b", "x" * 64, "../etc"])
def test_bad_names_are_refused(name: str) -> None:
    assert refusal("---\ndescription: d\n---\nb\n", name=name) == (
        f"{SOURCE}: agent name {name!r} is not allowed: a name is 1 to 63 characters of a-z, "
        "0-9, '_' and '-', beginning with a letter or digit"
    )


def test_oversized_text_is_refused_before_parsing() -> None:
    text = "---\ndescription: d\n---\n" + "x" * MAX_SPEC_BYTES
    size = len(text.encode())
    assert refusal(text) == (
        f"{SOURCE}: {size} bytes, over the limit of {MAX_SPEC_BYTES} bytes for an agent spec"
    )


def test_deep_nesting_is_refused_before_building_the_tree() -> None:
    text = "---\ndescription: d\noutput:\n  x: " + "[" * 20_000 + "]" * 20_000 + "\n---\nb\n"
    assert refusal(text) == f"{SOURCE}:4: nested deeper than 64 levels"


def test_nesting_up_to_the_limit_is_fine() -> None:
    text = "---\ndescription: d\nverify: " + "[" * 63 + "]" * 63 + "\n---\nb\n"
    assert refusal(text) == f"{SOURCE}:3: a verify command must be a non-empty string, got a list"


def test_non_utf8_bytes_are_refused_at_their_line() -> None:
    data = b"---\ndescription: d\n---\nbody \xff\n"
    with pytest.raises(ConfigError) as info:
        parse_agent_spec(data, name="helper", source=SOURCE, known_tools=TOOLS)
    assert str(info.value) == f"{SOURCE}:4: not UTF-8 text (at byte offset 28)"


# --- narrowing a child under its parent ---------------------------------------------------------


def spec_with(**overrides: object) -> AgentSpec:
    return replace(parse("---\ndescription: d\n---\nb\n"), **overrides)  # type: ignore[arg-type]


def test_narrowed_keeps_only_allowed_tools_in_the_parents_order() -> None:
    spec = spec_with(tools=("grep", "write_file", "read_file"))
    tools, _ = narrowed(spec, parent_tools=["read_file", "glob", "grep"], parent_mode="edit")
    assert tools == ("read_file", "grep")


def test_narrowed_without_allowlist_takes_every_parent_tool_once() -> None:
    tools, mode = narrowed(spec_with(), parent_tools=["a", "b", "a"], parent_mode="ask")
    assert (tools, mode) == (("a", "b"), "ask")


@pytest.mark.parametrize(
    ("spec_mode", "parent_mode", "expected"),
    [
        ("plan", "auto", "plan"),
        ("auto", "plan", "plan"),
        ("edit", "ask", "ask"),
        ("ask", "edit", "ask"),
        ("auto", "auto", "auto"),
        (None, "edit", "edit"),
    ],
)
def test_narrowed_mode_is_never_more_permissive_than_the_parent(
    spec_mode: str | None, parent_mode: str, expected: str
) -> None:
    _, mode = narrowed(spec_with(mode=spec_mode), parent_tools=[], parent_mode=parent_mode)
    assert mode == expected


def test_narrowed_refuses_an_unknown_parent_mode() -> None:
    with pytest.raises(ConfigError, match=r"unknown mode 'root'; choose one of plan\|ask\|edit"):
        narrowed(spec_with(), parent_tools=[], parent_mode="root")


def test_mode_order_matches_the_policy_defaults() -> None:
    """Core cannot import policy, so its order is checked here: along MODES, no effect's
    default decision ever gets stricter, and every policy mode is listed."""
    assert set(MODES) == {m.value for m in Mode}
    for effect in EFFECTS:
        strictness = [ACTIONS.index(mode_default("x", effect, Mode(m)).action) for m in MODES]
        assert strictness == sorted(strictness, reverse=True), effect
    assert len({tuple(mode_default("x", e, Mode(m)).action for e in EFFECTS) for m in MODES}) == 4


def test_a_spec_declares_the_outcome_of_its_completed_runs() -> None:
    spec = parse("---\ndescription: reviews\noutcome: change_ready_for_approval\n---\nReview.\n")
    assert spec.outcome == "change_ready_for_approval"
    assert parse("---\ndescription: reviews\n---\nReview.\n").outcome is None
    with pytest.raises(ConfigError, match=r":3: outcome must be a lowercase name"):
        parse("---\ndescription: reviews\noutcome: Ready For Review\n---\nReview.\n")
