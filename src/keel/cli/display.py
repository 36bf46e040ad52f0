"""How the read-only views word a value: a status in colour, an amount of a budget
dimension, a short time, a one-line excerpt of any text.

``excerpt`` is the one way model- or task-provided text is cut to a line: it drops
every control character, so such text never reaches the terminal as an escape
sequence (the caller still passes it through ``shown`` to escape rich markup).
"""

from __future__ import annotations

import json
from typing import Any

from keel.core.budget import Dimension
from keel.core.status import RunStatus
from keel.core.text import printable

EXCERPT = 90

STATUS_STYLE = {
    RunStatus.QUEUED: "dim",
    RunStatus.RUNNING: "cyan",
    RunStatus.WAITING: "yellow",
    RunStatus.PAUSED: "yellow",
    RunStatus.VERIFYING: "blue",
    RunStatus.COMPLETED: "green",
    RunStatus.FAILED: "red",
    RunStatus.BLOCKED: "red",
    RunStatus.CANCELLED: "magenta",
}


def styled_status(status: RunStatus) -> str:
    return f"[{STATUS_STYLE[status]}]{status.value}[/]"


def amount(dim: Dimension, value: float | None) -> str:
    if value is None:
        return "∞"
    if dim is Dimension.COST:
        return f"${value:.4f}"
    if dim is Dimension.WALL_TIME:
        return f"{value:.1f}s"
    return str(int(value))


def short_time(iso: str | None) -> str:
    return iso[5:19].replace("T", " ") if iso else "-"


def compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "), default=str)


def excerpt(text: str, width: int = EXCERPT) -> str:
    """`text` on one line of at most `width` characters, with no control character left
    (a model's text must not reach the terminal as an escape sequence)."""
    flat = " ".join(printable(text, limit=len(text) + 1).split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


__all__ = ["EXCERPT", "STATUS_STYLE", "amount", "compact", "excerpt", "short_time", "styled_status"]
