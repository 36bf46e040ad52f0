"""How verifiers, sign-offs and reviewer agents are named and checked, and how a review's
blocking issues read (keel.core.verifiers, pure)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from keel.core.errors import ConfigError
from keel.core.verifiers import (
    blocking_issues,
    check_reviewers,
    check_signoffs,
    named_verifiers,
    split_verifier,
)

BAD_NAME = (
    "a verifier's name is lowercase letters, digits, '_' or '-' (at most 64), starting with "
    "a letter; got {!r}"
)


def test_a_named_command_may_itself_contain_an_equals_sign() -> None:
    assert split_verifier("build=make CFLAGS=-O2") == ("build", "make CFLAGS=-O2")


@pytest.mark.parametrize("name", ["Bad Name", "", "9lives"])
def test_a_bad_verifier_name_is_quoted_in_the_refusal(name: str) -> None:
    with pytest.raises(ConfigError, match=f"^{re.escape(BAD_NAME.format(name))}$"):
        named_verifiers({name: "pytest"})


def test_an_empty_command_is_refused_as_such() -> None:
    with pytest.raises(ConfigError, match=r"^a verifier's command is empty$"):
        named_verifiers({"unit": "  "})


def test_a_command_given_twice_is_named_in_the_refusal() -> None:
    with pytest.raises(ConfigError, match=r"^the verifier command 'ruff' is given twice$"):
        named_verifiers(["unit=pytest", "lint=ruff", "style=ruff"])


def test_a_bad_signoff_name_is_quoted_in_the_refusal() -> None:
    with pytest.raises(ConfigError, match=f"^{re.escape(BAD_NAME.format('Security'))}$"):
        check_signoffs(["security", "Security"], [])


@pytest.mark.parametrize(
    "given",
    [["review=reviewer", "style=style-checker"], {"review": "reviewer", "style": "style-checker"}],
)
def test_reviewers_are_given_as_name_agent_pairs_or_a_mapping(given: Any) -> None:
    assert check_reviewers(given, ["unit"]) == (("review", "reviewer"), ("style", "style-checker"))


@pytest.mark.parametrize(
    ("given", "message"),
    [
        (["Review=reviewer"], BAD_NAME.format("Review")),
        (
            ["review=a=b"],
            "the reviewer 'review' names no agent spec: give NAME=AGENT, e.g. "
            "review=reviewer (got 'a=b')",
        ),
        (
            {"review": " "},
            "the reviewer 'review' names no agent spec: give NAME=AGENT, e.g. "
            "review=reviewer (got '')",
        ),
        (
            ["review=reviewer", "review=other"],
            "two reviewers are named 'review'; give each its own name",
        ),
        (["unit=reviewer"], "'unit' names both a reviewer and another verifier"),
    ],
)
def test_a_bad_reviewer_is_refused_saying_what_is_wrong(given: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        check_reviewers(given, ["unit"])


@pytest.mark.parametrize(
    "output", [None, "looks fine", {"summary": "ok"}, {"blocking_issues": "x"}]
)
def test_an_output_without_a_list_of_blocking_issues_is_not_a_review(output: Any) -> None:
    assert blocking_issues(output) is None


def test_each_blocking_issue_reads_as_one_line_with_where_it_is() -> None:
    review = {
        "blocking_issues": [
            {"file": "src/a.py", "line": 12, "description": " off by one "},
            {"file": "src/b.py", "description": "no test"},
            {"file": "src/c.py", "line": 0, "description": "line zero"},
            {"line": 3, "description": "somewhere"},
            {"file": "", "description": ""},
            {},
            "plain text issue",
            7,
        ]
    }
    assert blocking_issues(review) == [
        "src/a.py:12: off by one",
        "src/b.py: no test",
        "src/c.py:0: line zero",
        "somewhere",
        "(no description)",
        "(no description)",
        "plain text issue",
        "7",
    ]
    assert blocking_issues({"blocking_issues": []}) == []
