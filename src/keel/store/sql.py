"""Named SQL queries: every statement of a dialect lives in one ``.sql`` file.

A file is a sequence of blocks, each introduced by a ``-- name: query_name`` line
(procrastinate's shape). Other comment lines are kept inside the block; text
before the first name line is ignored. Loading is done once per process.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

_NAME = re.compile(r"^--\s*name:\s*([A-Za-z_][A-Za-z0-9_]*)\s*$")


def parse_queries(text: str) -> dict[str, str]:
    """Split ``text`` into ``{name: statement}``; a repeated name is a ValueError."""
    queries: dict[str, str] = {}
    name: str | None = None
    lines: list[str] = []

    def flush() -> None:
        if name is not None:
            body = "\n".join(lines).strip()
            if not body:
                raise ValueError(f"query {name!r} is empty")
            queries[name] = body

    for line in text.splitlines():
        match = _NAME.match(line.strip())
        if match:
            flush()
            name = match.group(1)
            if name in queries:
                raise ValueError(f"query {name!r} is defined twice")
            lines = []
        else:
            lines.append(line)
    flush()
    return queries


@cache
def load_queries(package: str, filename: str) -> dict[str, str]:
    """The named queries of ``filename`` shipped inside ``package`` (e.g. keel.store.sqlite)."""
    text = resources.files(package).joinpath(filename).read_text(encoding="utf-8")
    return parse_queries(text)
