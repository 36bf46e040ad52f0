"""Glob matching by component automaton: the old regex semantics, without the backtracking."""

from __future__ import annotations

import re
import time

from hypothesis import given
from hypothesis import strategies as st

from keel.tools.globbing import GlobPattern


def reference(pattern: str) -> re.Pattern[str]:
    """The regex glob of earlier releases ('*' and '?' within a name, '**' any directories):
    right, but exponential on some patterns."""
    segments = pattern.split("/")
    out = []
    for index, segment in enumerate(segments):
        last = index == len(segments) - 1
        if segment == "**":
            out.append(".*" if last else "(?:[^/]+/)*")
        else:
            piece = "".join(
                "[^/]*" if ch == "*" else "[^/]" if ch == "?" else re.escape(ch) for ch in segment
            )
            out.append(piece + ("" if last else "/"))
    return re.compile("".join(out))


names = st.sampled_from(["a", "b", "ab", "ba", ".x", "aab"])
segments = st.sampled_from(["**", "*", "a", "b*", "*b", "?", "a*b", "??"])


@given(
    st.lists(segments, min_size=1, max_size=4).map("/".join),
    st.lists(names, min_size=1, max_size=5).map("/".join),
)
def test_matches_what_the_regex_glob_matched(pattern: str, path: str) -> None:
    if pattern.endswith("/**"):  # the old regex let a trailing ** match an empty rest
        pattern += "/*"
    assert GlobPattern(pattern).matches(path) == (reference(pattern).fullmatch(path) is not None)


def test_many_double_stars_cost_little_on_a_deep_path() -> None:
    pattern = GlobPattern("/".join(["**"] * 60) + "/*a*a*a*a*a*a*b")
    path = "/".join(["aaaaaaaaaaaaaaaaaaaa"] * 200)
    started = time.monotonic()
    assert not pattern.matches(path)
    assert pattern.matches(path + "/aaaaaaab")
    assert time.monotonic() - started < 0.5


def test_a_walk_can_stop_where_nothing_below_can_match() -> None:
    pattern = GlobPattern("src/*/test_*.py")
    states = pattern.advance(pattern.start, "docs")
    assert not pattern.alive(states)
    states = pattern.advance(pattern.advance(pattern.start, "src"), "pkg")
    assert pattern.alive(states) and not pattern.accepts(states)
    assert pattern.accepts(pattern.advance(states, "test_x.py"))
