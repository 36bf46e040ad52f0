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

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

from keel.core.agent_spec import AgentSpec
from keel.core.budget import Budget
from keel.core.errors import ConfigError
from keel.runtime.child_runs import ALWAYS_OFFERED, agent_tools, compose_goal
from keel.tools.registry import ToolRegistry


@dataclass(frozen=True, slots=True)
class AgentRun:
    """What following ``spec`` makes of a run's goal, tools and mode."""

    spec: AgentSpec
    goal: str
    mode: str
    tools: tuple[str, ...]

    def options(self) -> dict[str, Any]:
        """The ``RunOptions`` fields the spec sets, bar ``tools`` (see ``allowlist``)."""
        return {
            "agent": {
                "name": self.spec.name,
                "digest": self.spec.digest,
                "version": self.spec.version,
                "source": self.spec.source,
            },
            "output_schema": self.spec.output,
            **({"outcome": self.spec.outcome} if self.spec.outcome else {}),
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


def allowlist(
    asked: Sequence[str] | None,
    registry: ToolRegistry,
    spec_tools: tuple[str, ...] | None,
    *,
    mcp_servers: tuple[str, ...] = (),
) -> tuple[str, ...] | None:
    """The tools a run is offered, in the registry's order: those ``asked`` for (``keel
    run --tools``) within an agent spec's ``spec_tools``, and ``request_completion``
    always; None (every tool) when neither limits them. A name of a tool of one of the
    workspace's ``mcp_servers`` (``mcp__SERVER__TOOL``) is kept as asked: the servers'
    tools are known once they are connected. ConfigError for an empty list or a name
    with no tool, listing the tools there are."""
    if asked is None:
        return spec_tools
    names = [name.strip() for name in asked if name.strip()]
    if not names:
        raise ConfigError("the tool allowlist is empty: name at least one tool, or leave it out")
    prefixes = tuple(f"mcp__{server}__" for server in mcp_servers)
    remote = [name for name in names if prefixes and name.startswith(prefixes)]
    unknown = sorted({name for name in names if name not in registry and name not in remote})
    if unknown:
        raise ConfigError(
            f"unknown tool{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))} "
            f"in the allowlist; the tools are: {', '.join(registry.names())}"
        )
    wanted = set(names) | set(ALWAYS_OFFERED)
    if spec_tools is not None:
        wanted &= set(spec_tools) | set(ALWAYS_OFFERED)
    return (
        *(name for name in registry.names() if name in wanted),
        *sorted(name for name in set(remote) if name in wanted),
    )
