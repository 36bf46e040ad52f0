"""Glob patterns over workspace paths, matched one component at a time, in linear time.

A pattern is split at ``/`` into segments. ``**`` matches any number of whole
components (none included); any other segment matches exactly one component with
``*`` (any run of characters), ``?`` (one character) and ``[...]``/``[!...]``
(a class). Matching is a simulation of the pattern's automaton over the path's
components: the set of segments that could come next is carried from a directory
to its entries, so a walk advances it once per entry and never enters a
directory below which nothing can match. A path of ``c`` components costs at most
``c * s`` segment tests for ``s`` segments, whatever the number of ``**``: there
is no backtracking to blow up. One segment test is ``fnmatch``'s translation,
which matches each ``*`` with an atomic group (no backtracking into it either),
on a name of at most 255 bytes.

Segments are OS names (``os.fsdecode``): the caller decodes the model's spelling
(``keel.core.pathnames.spelled_path``) before building a pattern.
"""

from __future__ import annotations

import fnmatch
import functools
import re
from collections.abc import Callable

MAGIC = re.compile(r"[*?\[]")

States = frozenset[int]


class GlobPattern:
    """A compiled glob; ``start``/``advance``/``accepts`` walk it along a path."""

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        segments = [s for s in pattern.split("/") if s not in ("", ".")]
        # Runs of ** are one **: the automaton is the same and smaller.
        collapsed: list[str] = []
        for segment in segments:
            if not (segment == "**" and collapsed and collapsed[-1] == "**"):
                collapsed.append(segment)
        self.segments: tuple[str, ...] = tuple(collapsed)
        self._tests: tuple[Callable[[str], bool] | None, ...] = tuple(
            None if s == "**" else segment_test(s) for s in self.segments
        )
        self.start: States = self._closure({0})

    def advance(self, states: States, name: str) -> States:
        """The states after one more path component ``name``."""
        following: set[int] = set()
        for index in states:
            if index >= len(self.segments):
                continue
            test = self._tests[index]
            if test is None:  # ** takes this component and may take more
                following.add(index)
            elif test(name):
                following.add(index + 1)
        return self._closure(following)

    def accepts(self, states: States) -> bool:
        """Does a path that led to ``states`` match the whole pattern?"""
        return len(self.segments) in states

    def alive(self, states: States) -> bool:
        """Could a longer path through here still match?"""
        return any(index < len(self.segments) for index in states)

    def matches(self, path: str) -> bool:
        """Does the relative posix ``path`` match the whole pattern?"""
        states = self.start
        for name in path.split("/"):
            if name in ("", "."):
                continue
            states = self.advance(states, name)
            if not states:
                return False
        return self.accepts(states)

    def _closure(self, states: set[int]) -> States:
        """Add the states reachable without a component: a ** may match none."""
        todo = list(states)
        while todo:
            index = todo.pop()
            skippable = index < len(self.segments) and self.segments[index] == "**"
            if skippable and index + 1 not in states:
                states.add(index + 1)
                todo.append(index + 1)
        return frozenset(states)


@functools.lru_cache(maxsize=256)
def segment_test(segment: str) -> Callable[[str], bool]:
    """Whether one name matches one segment (no ``/`` in either): equality when the
    segment has no wildcard, else fnmatch's linear-time translation."""
    if MAGIC.search(segment) is None:
        return segment.__eq__
    regex = re.compile(fnmatch.translate(segment))
    return lambda name: regex.match(name) is not None


__all__ = ["MAGIC", "GlobPattern", "States", "segment_test"]
