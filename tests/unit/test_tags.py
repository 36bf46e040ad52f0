"""Run tags: checked before anything is stored, round-tripped in the options, filtered on."""

from __future__ import annotations

import pytest

from keel.core.errors import ConfigError
from keel.core.records import RunOptions
from keel.core.tags import check_tags, has_tags, parse_tag_filter


def test_tags_are_checked_and_round_trip_in_the_run_options() -> None:
    tags = check_tags({"suite": "coding", "eval.attempt": "2"})
    options = RunOptions(tags=tags)
    assert RunOptions.from_dict(options.to_dict()).tags == {"suite": "coding", "eval.attempt": "2"}
    assert "tags" not in RunOptions().to_dict()  # stored only when set
    assert check_tags({}) is None
    for bad in ({"Suite": "x"}, {"suite": 3}, {"suite": "a\nb"}, {"k": "x" * 201}):
        with pytest.raises(ConfigError):
            check_tags(bad)


def test_a_tag_filter_is_key_equals_value() -> None:
    assert parse_tag_filter("case=fix-pin") == ("case", "fix-pin")
    assert parse_tag_filter("note=a=b") == ("note", "a=b")
    with pytest.raises(ConfigError, match="give KEY=VALUE"):
        parse_tag_filter("case")
    assert has_tags({"suite": "s", "case": "c"}, {"suite": "s"})
    assert not has_tags(None, {"suite": "s"})
    assert not has_tags({"suite": "t"}, {"suite": "s"})
