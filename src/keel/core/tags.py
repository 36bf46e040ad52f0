"""Run tags: short labels a run carries in its options, so runs can be found by them.

A tag is ``key = value``: the key a short lowercase name (``suite``, ``case``,
``eval.attempt``), the value any short text. ``keel eval`` tags every run it makes
(suite, case, attempt, config) and ``keel runs --tag KEY=VALUE`` lists them. Tags are
fixed at creation, like the rest of a run's options. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

from keel.core.errors import ConfigError

TAG_KEY: Final = re.compile(r"[a-z][a-z0-9_.-]{0,31}")
MAX_TAG_VALUE: Final = 200  # characters
MAX_TAGS: Final = 32


def check_tags(tags: Mapping[str, object] | None) -> dict[str, str] | None:
    """``tags`` as stored (None when there are none); ConfigError naming the first bad key
    or value: keys are lowercase names of at most 32 characters, values text of at most
    200 characters without control characters, and a run has at most 32 tags."""
    if not tags:
        return None
    if len(tags) > MAX_TAGS:
        raise ConfigError(f"a run has at most {MAX_TAGS} tags, got {len(tags)}")
    checked: dict[str, str] = {}
    for key, value in tags.items():
        if not isinstance(key, str) or not TAG_KEY.fullmatch(key):
            raise ConfigError(
                f"tag key {key!r}: a lowercase name ([a-z][a-z0-9_.-], at most 32 characters)"
            )
        if not isinstance(value, str):
            raise ConfigError(f"tag {key!r}: the value must be text, got {type(value).__name__}")
        if len(value) > MAX_TAG_VALUE or any(ord(c) < 32 or ord(c) == 127 for c in value):
            raise ConfigError(
                f"tag {key!r}: the value must be at most {MAX_TAG_VALUE} characters, "
                "without control characters"
            )
        checked[key] = value
    return checked


def parse_tag_filter(text: str) -> tuple[str, str]:
    """``KEY=VALUE`` -> (key, value); ConfigError when it is not that shape."""
    key, sep, value = text.partition("=")
    if not sep or not TAG_KEY.fullmatch(key):
        raise ConfigError(f"--tag {text!r}: give KEY=VALUE, KEY a lowercase name")
    return key, value


def has_tags(tags: Mapping[str, str] | None, wanted: Mapping[str, str]) -> bool:
    """True when ``tags`` holds every one of ``wanted`` with the same value."""
    held = tags or {}
    return all(held.get(key) == value for key, value in wanted.items())


__all__ = ["MAX_TAGS", "MAX_TAG_VALUE", "TAG_KEY", "check_tags", "has_tags", "parse_tag_filter"]
