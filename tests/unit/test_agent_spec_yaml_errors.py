"""An agent spec's file shape and YAML at their edges: which lines delimit the front
matter, how its line endings are read, how deep nesting is counted, and the file line
each YAML refusal names (keel.core.agent_spec)."""

from __future__ import annotations

import pytest

from keel.core.agent_spec import MAX_NESTING, AgentSpec, parse_agent_spec
from keel.core.errors import ConfigError

SOURCE = ".keel/agents/helper.md"
NO_FRONT_MATTER = (
    "1: no front matter: an agent spec begins with a line '---', then YAML keys "
    "(description: ...), then a line '---', then the instructions"
)
NEVER_CLOSED = "1: the front matter opened on line 1 is never closed by a line '---'"


def parse(data: bytes) -> AgentSpec:
    return parse_agent_spec(data, name="helper", source=SOURCE, known_tools=("read_file",))


def refusal(data: bytes) -> str:
    with pytest.raises(ConfigError) as err:
        parse(data)
    return str(err.value).removeprefix(f"{SOURCE}:")


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize("after", [" ", "\t", "X", "-"])
def test_only_a_line_of_exactly_three_dashes_opens_or_closes_the_front_matter(after: str) -> None:
    assert refusal(f"---{after}\ndescription: d\n---\nDo it.\n".encode()) == NO_FRONT_MATTER
    assert refusal(f"---\ndescription: d\n---{after}\nDo it.\n".encode()) == NEVER_CLOSED


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_a_block_text_in_the_front_matter_keeps_its_trailing_spaces(newline: str) -> None:
    front = "description: d\noutput:\n  type: string\n  description: |\n    Two spaces  \n    end"
    data = f"---\n{front}\n---\nDo it.\n".replace("\n", newline).encode()
    assert parse(data).output == {"type": "string", "description": "Two spaces  \nend"}


def test_a_line_ending_in_extra_carriage_returns_is_one_line_of_the_file() -> None:
    # "\r\r\n" comes from converting a CRLF file to CRLF once more; lines are counted by "\n"
    data = b"---\r\r\ndescription: d\r\r\nmode: yolo\r\r\n---\r\r\nDo it.\r\r\n"
    assert refusal(data) == "3: mode 'yolo' is not a mode; one of plan|ask|edit|auto"


def test_nesting_is_counted_from_the_depth_reached_after_a_list_closed() -> None:
    # the front matter (1) and output (2) hold the list `first` (3, closed again), so
    # `deep` begins at depth 3: MAX_NESTING - 2 more levels reach the limit, one more is over
    front = "description: d\noutput:\n  first: [1]\n  deep: "
    parse(f"---\n{front}{nested(MAX_NESTING - 2)}\n---\nDo it.\n".encode())
    assert refusal(f"---\n{front}{nested(MAX_NESTING - 1)}\n---\nDo it.\n".encode()) == (
        f"5: nested deeper than {MAX_NESTING} levels"
    )


def test_many_collections_side_by_side_are_not_nesting() -> None:
    count = 2 * MAX_NESTING
    properties = "".join(f"    p{i}: {{type: string}}\n" for i in range(count))
    data = f"---\ndescription: d\noutput:\n  type: object\n  properties:\n{properties}---\nDo it.\n"
    output = parse(data.encode()).output
    assert output is not None
    assert output["properties"] == {f"p{i}": {"type": "string"} for i in range(count)}


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_a_character_yaml_refuses_is_named_at_its_line(newline: str) -> None:
    # the bell character on line 4, with a line of YAML after it
    text = "---\ndescription: d\n\nmode: a\x07b\ntools: []\n---\nDo it.\n"
    data = text.replace("\n", newline).encode()
    assert refusal(data) == (
        "4: invalid YAML: unacceptable character #x0007: special characters are not allowed"
    )


def test_a_tag_deep_inside_the_output_schema_is_refused_at_its_own_line() -> None:
    data = (
        b"---\ndescription: d\noutput:\n  type: object\n  properties:\n"
        b"    a: !!python/name:os.system\n---\nDo it.\n"
    )
    assert refusal(data) == (
        "6: invalid YAML: could not determine a constructor for the tag "
        "'tag:yaml.org,2002:python/name:os.system'"
    )


def test_a_model_spec_without_a_provider_is_refused_even_with_a_colon_later() -> None:
    assert refusal(b"---\ndescription: d\nmodel: ':deepseek:chat'\n---\nDo it.\n") == (
        "3: model ':deepseek:chat' is not a model spec: expected PROVIDER:MODEL "
        "(e.g. deepseek:deepseek-chat) or scripted:PATH"
    )
    model = "openai:ft:gpt-4o:acme"
    assert parse(f"---\ndescription: d\nmodel: {model}\n---\nDo it.\n".encode()).model == model
