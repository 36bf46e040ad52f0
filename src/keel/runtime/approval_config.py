"""``[approvals]`` in ``.keel/config.toml``: how long requests and grants live.

    [approvals]
    timeout_seconds = 86400      # an unanswered request fails the run after this
    grant_ttl_seconds = 86400    # a granted call not yet run asks again after this

Both are optional (default 24 h) and must be a number of seconds above 0 and at
most ``MAX_SECONDS``; ``keel run --approval-timeout`` and ``Harness.create``'s
``approval_timeout`` / ``grant_ttl`` override them. The values are stored with the
run, so a resume or a worker applies the same ones.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from keel.core.budget import check_seconds
from keel.core.errors import ConfigError
from keel.runtime.config import CONFIG_FILE

_KEYS = ("timeout_seconds", "grant_ttl_seconds")


@dataclass(frozen=True, slots=True, kw_only=True)
class ApprovalSettings:
    """Seconds a request may wait and a grant stays usable; None: the 24 h default."""

    timeout_s: float | None = None
    grant_ttl_s: float | None = None


def load_approval_settings(cwd: Path) -> ApprovalSettings:
    """``[approvals]`` of ``cwd/.keel/config.toml`` (defaults if absent); ConfigError naming
    the file and key when a value is not a usable number of seconds."""
    path = cwd / CONFIG_FILE
    if not path.is_file():
        return ApprovalSettings()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError, OSError) as exc:
        raise ConfigError(f"{path}: cannot read the configuration: {exc}") from None
    table: Any = data.get("approvals", {})
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: 'approvals' must be a table ([approvals])")
    unknown = sorted(set(table) - set(_KEYS))
    if unknown:
        raise ConfigError(
            f"{path}: unknown approvals setting(s) {', '.join(unknown)}; known: {', '.join(_KEYS)}"
        )
    for key in _KEYS:
        check_seconds(f"{path}: [approvals] {key}", table.get(key))
    timeout, ttl = table.get("timeout_seconds"), table.get("grant_ttl_seconds")
    return ApprovalSettings(
        timeout_s=None if timeout is None else float(timeout),
        grant_ttl_s=None if ttl is None else float(ttl),
    )


__all__ = ["ApprovalSettings", "load_approval_settings"]
