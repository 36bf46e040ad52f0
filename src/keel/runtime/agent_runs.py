"""A top-level run that follows an agent spec (``keel run --agent NAME``, ``POST /runs``
with ``agent``).

The same contract a spawned child gets, with the caller in the parent's place: the
spec's tool allowlist intersected with the harness's tools, its mode never more
permissive than the one asked for (``keel.core.agent_spec.narrowed``), only tools that
change nothing for a ``shared-readonly`` spec, and the goal wrapped in the spec's
instructions and output schema (``compose_goal``), whose ``output`` ``request_completion``
must then match. An ``isolated`` spec still works in the run's own workspace: isolation
is from a parent's workspace, and a top-level run has none.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from keel.core.agent_spec import AgentSpec
from keel.core.budget import Budget
from keel.runtime.child_runs import agent_tools, compose_goal
from keel.tools.registry import ToolRegistry


@dataclass(frozen=True, slots=True)
class AgentRun:
    """What following ``spec`` makes of a run's goal, tools and mode."""

    spec: AgentSpec
    goal: str
    mode: str
    tools: tuple[str, ...]

    def options(self) -> dict[str, Any]:
        """The ``RunOptions`` fields the spec sets."""
        return {
            "tools": self.tools,
            "agent": {
                "name": self.spec.name,
                "digest": self.spec.digest,
                "version": self.spec.version,
                "source": self.spec.source,
            },
            "output_schema": self.spec.output,
        }

    @property
    def budget(self) -> Budget | None:
        """The spec's budget with the defaults where it sets none; None without one."""
        if self.spec.budget is None:
            return None
        default = Budget()
        return Budget(
            **{
                f.name: getattr(self.spec.budget, f.name)
                if getattr(self.spec.budget, f.name) is not None
                else getattr(default, f.name)
                for f in fields(Budget)
            }
        )


def agent_run(spec: AgentSpec, *, goal: str, mode: str, registry: ToolRegistry) -> AgentRun:
    """How a top-level run of ``spec`` with ``goal``, asked for in ``mode``, is set up."""
    kind = "shared-readonly" if spec.workspace == "shared-readonly" else "shared"
    tools, narrowed_mode = agent_tools(
        spec, list(registry.names()), mode, registry, kind=kind, leaf=False
    )
    return AgentRun(spec=spec, goal=compose_goal(spec, goal, None), mode=narrowed_mode, tools=tools)
