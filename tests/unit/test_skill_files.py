"""Parsing one SKILL.md (keel.core.skills, pure): the front matter, the instructions, and a
precise SOURCE:LINE refusal for each way a file can be wrong."""

from __future__ import annotations

import hashlib
import re

import pytest

from keel.core.errors import ConfigError
from keel.core.skills import (
    MAX_DESCRIPTION,
    MAX_SKILL_BYTES,
    NAME_RULE,
    check_skill_name,
    parse_skill,
    skill_path,
)

SOURCE = ".keel/skills/demo/SKILL.md"
GOOD = (
    b"---\nname: demo\ndescription: |\n  Shows  how\n  it works.\nlicense: MIT\n---\n"
    b"\n# Demo\nDo it.\n\n"
)


def parse(data: bytes, folder: str = "demo") -> object:
    return parse_skill(data, folder=folder, source=SOURCE)


def refused(data: bytes, message: str, folder: str = "demo") -> None:
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        parse(data, folder)


def test_a_skill_has_its_name_description_instructions_and_the_digest_of_its_bytes() -> None:
    skill = parse_skill(GOOD, folder="demo", source=SOURCE)
    assert (skill.name, skill.description) == ("demo", "Shows how it works.")
    assert skill.instructions == "# Demo\nDo it."
    assert (skill.digest, skill.source) == (hashlib.sha256(GOOD).hexdigest(), SOURCE)
    assert skill.summary() == {
        "name": "demo",
        "description": "Shows how it works.",
        "digest": hashlib.sha256(GOOD).hexdigest(),
    }


def test_a_byte_order_mark_and_padded_fences_are_accepted() -> None:
    data = "\ufeff--- \nname: ' demo '\ndescription: d\n ---\nx\n".encode()
    skill = parse_skill(data, folder="demo", source=SOURCE)
    assert (skill.name, skill.instructions) == ("demo", "x")


def test_the_path_of_a_skill() -> None:
    assert skill_path("demo") == ".keel/skills/demo/SKILL.md"


@pytest.mark.parametrize("name", ["a", "a-b", "x9", "a" * 64, "0-release-notes"])
def test_valid_skill_names(name: str) -> None:
    check_skill_name(name, SOURCE)


@pytest.mark.parametrize("name", ["", "-a", "a-", "a--b", "Demo", "a_b", "a" * 65, "a.b"])
def test_a_bad_skill_name_is_refused_with_the_rule(name: str) -> None:
    with pytest.raises(ConfigError) as err:
        check_skill_name(name, SOURCE)
    assert str(err.value) == f"{SOURCE}: skill name {name!r} is not allowed: a name is {NAME_RULE}"


def test_a_folder_with_a_bad_name_is_refused_before_its_file_is_read() -> None:
    refused(b"", f"{SOURCE}: skill name 'Demo' is not allowed: a name is {NAME_RULE}", "Demo")


def test_a_file_over_the_size_limit_is_refused_and_one_at_it_is_read() -> None:
    at_limit = GOOD + b"x" * (MAX_SKILL_BYTES - len(GOOD))
    assert parse(at_limit) is not None
    refused(
        at_limit + b"x",
        f"{SOURCE}: {MAX_SKILL_BYTES + 1} bytes, over the {MAX_SKILL_BYTES} allowed",
    )


def test_a_file_that_is_not_utf8_names_the_line_and_offset() -> None:
    refused(b"---\nname: demo\n\xff\n", f"{SOURCE}:3: not UTF-8 text (at byte offset 15)")


@pytest.mark.parametrize("data", [b"", b"name: demo\n---\n", b"\n---\n"])
def test_a_file_must_open_with_front_matter(data: bytes) -> None:
    refused(
        data,
        f"{SOURCE}:1: a SKILL.md starts with '---' and YAML front matter (name, description), "
        "closed by another '---'",
    )


def test_front_matter_must_be_closed() -> None:
    refused(b"---\nname: demo\n", f"{SOURCE}:1: the front matter is never closed with '---'")


def test_front_matter_that_is_not_yaml_names_the_line_in_the_file() -> None:
    with pytest.raises(ConfigError) as err:
        parse(b"---\nname: demo\ndescription: d\nbad: [1\n---\nx\n")
    assert re.fullmatch(
        rf"{re.escape(SOURCE)}:5: the front matter is not valid YAML: expected ',' or ']'.*",
        str(err.value),
    )


def test_front_matter_must_be_a_mapping() -> None:
    refused(
        b"---\n- name\n---\nx\n",
        f"{SOURCE}:2: the front matter must be a mapping (name, description)",
    )


@pytest.mark.parametrize(
    ("front", "message"),
    [
        (b"description: d\n", "the front matter needs 'name', a non-empty string"),
        (
            b"name: 3\ndescription: d\n",
            "the front matter needs 'name', a non-empty string (got int)",
        ),
        (
            b"name: demo\ndescription: ' '\n",
            "the front matter needs 'description', a non-empty string (got str)",
        ),
        (b"name: demo\n", "the front matter needs 'description', a non-empty string"),
    ],
)
def test_name_and_description_are_needed_and_the_closing_line_is_named(
    front: bytes, message: str
) -> None:
    data = b"---\n" + front + b"---\nx\n"
    closing = front.count(b"\n") + 2
    refused(data, f"{SOURCE}:{closing}: {message}")


def test_the_name_must_be_the_folders() -> None:
    refused(
        b"---\nname: other\ndescription: d\n---\nx\n",
        f"{SOURCE}: name 'other' is not its folder's name 'demo'",
    )


def test_the_description_has_at_most_1024_characters() -> None:
    def with_description(n: int) -> bytes:
        return b"---\nname: demo\ndescription: " + b"d" * n + b"\n---\nx\n"

    assert parse(with_description(MAX_DESCRIPTION)) is not None
    refused(
        with_description(MAX_DESCRIPTION + 1),
        f"{SOURCE}: the description has 1025 characters; at most 1024 (say what the skill does "
        "and when to use it)",
    )


def test_empty_instructions_are_refused_naming_the_line_after_the_front_matter() -> None:
    refused(
        b"---\nname: demo\ndescription: d\n---\n \n\n",
        f"{SOURCE}:5: the instructions after the front matter are empty",
    )


def test_a_control_character_in_the_front_matter_is_refused_naming_its_line() -> None:
    # YAML's reader refuses it before parsing, with no mark and no problem of its own.
    refused(
        b"---\nname: de\x01mo\ndescription: d\n---\nx\n",
        f"{SOURCE}:2: the front matter is not valid YAML: unacceptable character #x0001: "
        'special characters are not allowed\n  in "<unicode string>", position 8',
    )


def test_empty_front_matter_is_not_a_mapping() -> None:
    refused(
        b"---\n---\nx\n",
        f"{SOURCE}:2: the front matter must be a mapping (name, description)",
    )
