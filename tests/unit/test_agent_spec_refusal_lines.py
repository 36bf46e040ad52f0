"""An agent spec's on_failure, budget and output refusals name the line of the key, even
when its value sits on the next line, and say what was found (keel.core.agent_spec)."""

from __future__ import annotations

import pytest

from keel.core.agent_spec import (
    AgentSpec,
    FailurePolicy,
    OnFailure,
    parse_agent_spec,
)
from keel.core.errors import ConfigError

SOURCE = ".keel/agents/helper.md"
POLICIES = "fail_fast|best_effort|retry|escalate"


def parse(front: str) -> AgentSpec:
    data = f"---\ndescription: d\n{front}\n---\nDo it.\n".encode()
    return parse_agent_spec(data, name="helper", source=SOURCE, known_tools=("read_file",))


def refusal(front: str) -> str:
    with pytest.raises(ConfigError) as err:
        parse(front)
    return str(err.value).removeprefix(f"{SOURCE}:")


@pytest.mark.parametrize(
    ("front", "message"),
    [
        (
            "on_failure:\n  policy:\n    give_up",
            f"4: policy 'give_up' is not a failure policy; one of {POLICIES}",
        ),
        (
            "on_failure:\n  policy: retry\n  attempts:\n    6",
            "5: on_failure.attempts must be a whole number from 1 to 5, got 6",
        ),
        (
            "on_failure:\n  policy: retry\n  agent:\n    Bad Name",
            "5: on_failure.agent must be an agent name (1 to 63 characters of a-z, 0-9, '_' "
            "and '-', beginning with a letter or digit), got 'Bad Name'",
        ),
        (
            "on_failure:\n  policy: retry\n  then:\n    give_up",
            f"5: then 'give_up' is not a failure policy; one of {POLICIES}",
        ),
        (
            "on_failure:\n  policy: retry\n  then:\n    retry",
            "5: on_failure.then cannot be retry: give fail_fast, best_effort or escalate",
        ),
        (
            "on_failure:\n  policy: escalate\n  then:\n    fail_fast",
            "5: on_failure.then only applies to policy retry, not escalate",
        ),
    ],
)
def test_an_on_failure_refusal_names_the_keys_line_not_its_values(front: str, message: str) -> None:
    assert refusal(front) == message


def test_an_unknown_on_failure_key_is_refused_naming_on_failure() -> None:
    assert refusal("on_failure:\n  policy: retry\n  tries: 2") == (
        "5: unknown key 'tries' in on_failure; allowed: policy, attempts, agent, then"
    )


def test_a_mapping_with_a_policy_other_than_retry_gives_that_policy() -> None:
    assert parse("on_failure:\n  policy: best_effort").on_failure == OnFailure(
        policy=FailurePolicy.BEST_EFFORT
    )


def test_retry_attempts_are_accepted_up_to_five() -> None:
    on_failure = parse("on_failure:\n  policy: retry\n  attempts: 5").on_failure
    assert on_failure == OnFailure(policy=FailurePolicy.RETRY, attempts=5)


def test_a_budget_that_is_a_list_is_refused_naming_what_it_is() -> None:
    assert refusal("budget: [5]") == (
        "3: budget must be a mapping with any of steps, tool_calls, tokens, cost, "
        "wall_seconds, got a list"
    )


def test_a_schema_wrong_as_a_whole_names_no_place_inside_it() -> None:
    # draft-04 checks that exclusiveMaximum comes with maximum at the schema's root
    front = (
        "output:\n  $schema: 'http://json-schema.org/draft-04/schema#'\n  exclusiveMaximum: true"
    )
    assert refusal(front) == (
        "3: output is not a valid JSON schema: 'maximum' is a dependency of 'exclusiveMaximum'"
    )
