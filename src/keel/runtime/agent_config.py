"""``[agents]`` in ``.keel/config.toml``: the limits every spawn in a workspace obeys.

    [agents]
    max_depth = 2           # a top-level run is depth 0; its children 1; theirs 2
    max_live_children = 4   # children of one run not yet ended, at once
    child_slots = 4         # threads this process gives to executing background children
                            # (0: only `keel worker`s execute them)

Every key is optional; a wrong key or value is a ConfigError naming the file and key.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from keel.core.children import DEFAULT_MAX_DEPTH, DEFAULT_MAX_LIVE_CHILDREN
from keel.core.errors import ConfigError
from keel.runtime.config import CONFIG_FILE

MAX_LIMIT = 64


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentSettings:
    max_depth: int = DEFAULT_MAX_DEPTH
    max_live_children: int = DEFAULT_MAX_LIVE_CHILDREN
    child_slots: int = DEFAULT_MAX_LIVE_CHILDREN


def load_agent_settings(workspace: Path) -> AgentSettings:
    """``[agents]`` of ``workspace/.keel/config.toml`` (defaults where absent)."""
    path = workspace / CONFIG_FILE
    if not path.is_file():
        return AgentSettings()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError, OSError) as exc:
        raise ConfigError(f"{path}: cannot read the configuration: {exc}") from None
    table: Any = data.get("agents", {})
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: 'agents' must be a table ([agents])")
    known = ("max_depth", "max_live_children", "child_slots")
    values: dict[str, int] = {}
    for key, value in table.items():
        if key not in known:
            raise ConfigError(
                f"{path}: unknown [agents] setting {key!r}; known: {', '.join(known)}"
            )
        low = 0 if key in ("child_slots", "max_depth") else 1
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= MAX_LIMIT:
            raise ConfigError(
                f"{path}: [agents] {key} must be a whole number from {low} to {MAX_LIMIT}, "
                f"got {value!r}"
            )
        values[key] = value
    return AgentSettings(**values)


__all__ = ["AgentSettings", "load_agent_settings"]
