"""An agent spec's front matter at its edges: limits accepted exactly at their bounds,
and each refusal naming the line and what was given (keel.core.agent_spec)."""

from __future__ import annotations

import pytest

from keel.core.agent_spec import MAX_NESTING, MAX_SPEC_BYTES, AgentSpec, parse_agent_spec
from keel.core.budget import MAX_COUNT, MAX_SECONDS
from keel.core.errors import ConfigError

SOURCE = ".keel/agents/helper.md"
TOOLS = ("read_file", "grep")


def spec(front: str, body: str = "Do it.\n") -> bytes:
    return f"---\n{front}\n---\n{body}".encode()


def parse(front: str) -> AgentSpec:
    return parse_agent_spec(spec(front), name="helper", source=SOURCE, known_tools=TOOLS)


def refusal(front: str) -> str:
    with pytest.raises(ConfigError) as err:
        parse(front)
    return str(err.value).removeprefix(f"{SOURCE}:")


def test_a_spec_of_exactly_the_size_limit_is_read() -> None:
    data = spec("description: d", "x" * 10)
    data = data[:-10] + b"x" * (MAX_SPEC_BYTES - len(data) + 10)
    assert len(data) == MAX_SPEC_BYTES
    parse_agent_spec(data, name="helper", source=SOURCE, known_tools=TOOLS)
    with pytest.raises(ConfigError, match=r"over the limit"):
        parse_agent_spec(data + b"x", name="helper", source=SOURCE, known_tools=TOOLS)


def test_a_description_ending_in_an_x_and_lines_ending_in_crlf_are_read_as_written() -> None:
    assert parse("description: SANDBOX").description == "SANDBOX"
    data = b"---\r\ndescription: a box\r\n---\r\nDo it.\r\n"
    parsed = parse_agent_spec(data, name="helper", source=SOURCE, known_tools=TOOLS)
    assert parsed.description == "a box"


@pytest.mark.parametrize(
    ("front", "message"),
    [
        ("description: 2024-01-01", "2: description must be a non-empty string, got date"),
        (
            "description: " + "d" * 41 + "\nmodel: 3",
            "3: model must be a non-empty string, got a whole number",
        ),
        ("description: [" + "'x'" + "]", "2: description must be a non-empty string, got a list"),
        (
            "description: d\nmodel: 'deepseek:'",
            "3: model 'deepseek:' is not a model spec: expected PROVIDER:MODEL (e.g. "
            "deepseek:deepseek-chat) or scripted:PATH",
        ),
        (
            "description: d\nmodel: ':chat'",
            "3: model ':chat' is not a model spec: expected PROVIDER:MODEL (e.g. "
            "deepseek:deepseek-chat) or scripted:PATH",
        ),
        (
            "description: d\nversion: '2'",
            "3: version must be a whole number of at least 1, got '2'",
        ),
        ("description: d\nversion: 0", "3: version must be a whole number of at least 1, got 0"),
        (
            "description: d\ntools: read_file",
            "3: tools must be a list of tool names, got a single value",
        ),
        ("description: d\ntools: {a: 1}", "3: tools must be a list of tool names, got a mapping"),
        ("description: d\nverify: {a: 1}", "3: verify must be a list of commands, got a mapping"),
        (
            "description: d\nbudget: 5",
            "3: budget must be a mapping with any of steps, tool_calls, tokens, cost, "
            "wall_seconds, got a single value",
        ),
        (
            "description: d\nbudget:\n  cost: 0",
            "4: budget.cost must be a finite number above 0, got 0",
        ),
        (
            "description: d\nbudget:\n  wall_seconds: " + str(MAX_SECONDS + 1),
            f"4: budget.wall_seconds must be a finite number above 0 and at most "
            f"{MAX_SECONDS}, got {MAX_SECONDS + 1}",
        ),
        (
            "description: d\nbudget:\n  steps: 0",
            f"4: budget.steps must be from 1 to {MAX_COUNT}, got 0",
        ),
        (
            "description: d\n? [a, b]\n: 1",
            "3: unknown key (a list) in the front matter; allowed: description, model, "
            "tools, mode, workspace, budget, verify, output, on_failure, version, outcome",
        ),
        (
            "description: d\ntools:\n  - grep\ntools: []",
            "5: key 'tools' appears twice in the front matter (first on line 3)",
        ),
        (
            "description: d\non_failure: [retry]",
            "3: on_failure must be a policy word or a mapping (policy, attempts, agent, "
            "then), got a list",
        ),
        ("description: d\non_failure: {attempts: 2}", "3: on_failure has no 'policy'"),
        (
            "description: d\non_failure: {policy: sometimes}",
            "3: policy 'sometimes' is not a failure policy; one of "
            "fail_fast|best_effort|retry|escalate",
        ),
        (
            "description: d\non_failure:\n  policy: escalate\n  then: fail_fast",
            "5: on_failure.then only applies to policy retry, not escalate",
        ),
        (
            "description: d\non_failure:\n  policy: fail_fast\n  agent: x",
            "5: on_failure.agent only applies to policy retry, not fail_fast",
        ),
        (
            "description: d\non_failure:\n  policy: retry\n  attempts: 6",
            "5: on_failure.attempts must be a whole number from 1 to 5, got 6",
        ),
        (
            "description: d\non_failure:\n  policy: retry\n  attempts: true",
            "5: on_failure.attempts must be a whole number from 1 to 5, got True",
        ),
        (
            "description: d\non_failure:\n  policy: retry\n  agent: Bad",
            "5: on_failure.agent must be an agent name (1 to 63 characters of a-z, 0-9, '_' "
            "and '-', beginning with a letter or digit), got 'Bad'",
        ),
        (
            "description: d\non_failure:\n  policy: retry\n  then: maybe",
            "5: then 'maybe' is not a failure policy; one of fail_fast|best_effort|retry|escalate",
        ),
        (
            "description: d\noutput:\n  type: object\n  required:\n    - 1",
            "6: output is not a valid JSON schema at required/0: 1 is not of type 'string'",
        ),
        (
            "description: d\noutput:\n  type: object\n  required: [a, 1]",
            "5: output is not a valid JSON schema at required/1: 1 is not of type 'string'",
        ),
    ],
)
def test_each_refusal_names_its_line_and_what_was_given(front: str, message: str) -> None:
    assert refusal(front) == message


@pytest.mark.parametrize(("length", "shown"), [(40, None), (41, 39)])
def test_a_quoted_text_is_cut_after_forty_characters(length: int, shown: int | None) -> None:
    value = " " * length
    message = refusal(f"description: d\nmodel: '{value}'")
    expected = repr(value) if shown is None else repr(value[:shown]) + "…"
    assert message == f"3: model must be a non-empty string, got {expected}"


def test_limits_are_accepted_at_their_bounds() -> None:
    parsed = parse(
        f"description: d\nversion: 1\nbudget:\n  steps: 1\n  tokens: {MAX_COUNT}\n"
        f"  cost: 1000000000000\n  wall_seconds: {MAX_SECONDS}\n"
        "on_failure:\n  policy: retry\n  attempts: 1"
    )
    assert parsed.version == 1 and parsed.budget is not None
    assert (parsed.budget.max_steps, parsed.budget.max_tokens) == (1, MAX_COUNT)
    assert parsed.budget.max_wall_seconds == MAX_SECONDS
    assert parsed.on_failure.attempts == 1


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def test_nesting_is_allowed_up_to_its_limit_however_many_collections_came_before() -> None:
    parse(f"description: d\noutput: {{x: {nested(MAX_NESTING - 2)}}}")
    siblings = "\n".join(f"k{i}: [[1]]" for i in range(3))
    with pytest.raises(
        ConfigError, match=rf"^{SOURCE}:\d+: nested deeper than {MAX_NESTING} levels$"
    ):
        parse(
            f"description: d\noutput:\n  {siblings.replace(chr(10), chr(10) + '  ')}\n  deep: "
            f"{nested(MAX_NESTING)}"
        )
