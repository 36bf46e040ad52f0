"""Text made valid for the record (keel.core.text): lone surrogates replaced wherever they
are, nesting kept up to its limit, reason lines cut at their limit."""

from __future__ import annotations

from typing import Any

import pytest

from keel.core.errors import UsageError
from keel.core.text import (
    MAX_DEPTH,
    check_storable,
    has_lone_surrogate,
    printable,
    valid_data,
    valid_text,
)


def test_valid_text_is_left_alone_and_counted_as_nothing_replaced() -> None:
    assert valid_text("abc") == ("abc", 0)
    assert valid_text("café") == ("café", 0)
    assert valid_text("a\ud800b") == ("a\ufffdb", 1)


def nested(kind: type, levels: int) -> Any:
    value: Any = "\ud800"
    for _ in range(levels):
        value = {"k": value} if kind is dict else [value]
    return value


def test_nesting_is_kept_as_structure_up_to_its_limit_and_shown_as_text_below() -> None:
    for kind in (dict, list):
        kept = valid_data(nested(kind, MAX_DEPTH))
        for _ in range(MAX_DEPTH):
            kept = kept["k"] if kind is dict else kept[0]
        assert kept == "\ufffd"
        deep = nested(kind, MAX_DEPTH + 1)
        shown = valid_data(deep)
        for _ in range(MAX_DEPTH):
            shown, deep = (shown["k"], deep["k"]) if kind is dict else (shown[0], deep[0])
        assert shown == valid_text(repr(deep))[0]


def test_keys_are_made_valid_too_and_other_keys_are_kept() -> None:
    assert valid_data({"\ud800": "x"}) == {"\ufffd": "x"}
    assert valid_data({1: "a\ud800"}) == {1: "a\ufffd"}
    clean = {"a": ["b", ("c",)]}
    assert valid_data(clean) is clean


def test_a_reason_line_is_cut_at_500_characters() -> None:
    assert printable("x" * 500) == "x" * 500
    assert printable("x" * 501) == "x" * 499 + "…"


def test_a_named_text_with_a_lone_surrogate_is_refused_with_the_code_point_and_the_fix() -> None:
    with pytest.raises(UsageError) as refused:
        check_storable("the goal", "fix a\ud83db")
    assert str(refused.value) == (
        "the goal contains a lone surrogate (U+D83D), which is not text UTF-8 can hold; "
        "send valid Unicode"
    )


def test_non_ascii_text_without_a_lone_surrogate_is_storable() -> None:
    for text in ("café", "naïve ☕", "emoji \U0001f600", "日本語"):
        assert not has_lone_surrogate(text)
        check_storable("the goal", text)
    assert has_lone_surrogate("caf\udce9")
