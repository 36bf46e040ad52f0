"""What a decision depends on besides the run state: tools, the gate, the workspace, the time.

``decide`` reaches tools through a ``ToolCatalog`` and permissions through a ``Gate``,
so the decision stays pure and is tested with the real registry and policy, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from keel.policy.approvals import DEFAULT_REQUEST_TTL_S
from keel.policy.modes import Mode


class ToolInfo(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def effect(self) -> str: ...
    @property
    def recovery(self) -> str: ...


class ToolCatalog(Protocol):
    """What the decision needs to know of the tools: their kind, and argument checks."""

    def describe(self, name: str) -> ToolInfo:
        """The tool named ``name``; ToolError naming the available tools if unknown."""
        ...

    def validate(self, name: str, raw: str | dict[str, Any]) -> dict[str, Any]:
        """Validated arguments; ToolError (precise, for the model) if they are wrong."""
        ...


class Verdict(Protocol):
    @property
    def action(self) -> str: ...  # "allow" | "ask" | "deny"
    @property
    def rule(self) -> str: ...
    @property
    def reason(self) -> str: ...
    @property
    def permanent(self) -> bool: ...
    @property
    def writes_git(self) -> bool: ...


class Gate(Protocol):
    """The permission policy."""

    def decide(
        self, tool: str, effect: str, arguments: dict[str, Any], *, mode: Mode, workspace: Path
    ) -> Verdict: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class Situation:
    """Everything besides the run state that a decision depends on."""

    catalog: ToolCatalog
    gate: Gate
    workspace: Path
    now: datetime  # decides which approval requests and grants have expired
    approval_ttl_s: float = DEFAULT_REQUEST_TTL_S  # when the run sets no approval timeout
    # The status of the child a waiting parent waits for (read by the driver only then).
    child_statuses: Mapping[str, str] = field(default_factory=dict)
    # The lifecycle points some middleware is asked at (``keel.loop.middleware``).
    middleware_points: frozenset[str] = frozenset()


__all__ = ["Gate", "Situation", "ToolCatalog", "ToolInfo", "Verdict"]
