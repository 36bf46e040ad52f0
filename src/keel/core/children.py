"""A parent's children as its state knows them, and the rules a spawn must pass.

Everything here is pure: the limits (depth, live children) and the budget a child
is carved from its parent's remaining budget are decided from the parent's folded
state, so a resumed parent decides exactly as the first process did.

Budget carving. Tokens and cost are *pools* the whole tree draws from: a child's
allotment is reserved from its parent's remaining pool while the child lives, and
when it ends its actual use is added to the parent's usage (its reservation
released). Steps, tool calls and wall time are each agent's own clock: a child may
use at most what its parent has left, and using them does not move the parent's.
A spec that asks for more than is available is refused with the numbers; a
dimension the spec leaves open gets an equal share of what is unreserved among
the parent's free child places (tokens, cost) or the parent's remainder (clocks).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from keel.core.budget import Budget, Dimension, Usage
from keel.core.errors import ToolError

if TYPE_CHECKING:
    from jsonschema.exceptions import ValidationError

    from keel.core.state import RunState

DEFAULT_MAX_DEPTH = 2
DEFAULT_MAX_LIVE_CHILDREN = 4
LIVE = "live"
MAX_SCHEMA_ERRORS = 5  # validation errors told to a child whose output does not match
POOLS = (Dimension.TOKENS, Dimension.COST)
CLOCKS = (Dimension.STEPS, Dimension.TOOL_CALLS, Dimension.WALL_TIME)


class SpawnRefused(ToolError):
    """A spawn the contract does not allow (depth, live children, budget, tools, mode):
    the parent model reads why, with the numbers, and nothing is created."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ChildRecord:
    """One child as its parent's state knows it (from ``subagent_spawned``/``_finished``)."""

    call_id: str
    task_id: str | None
    agent: str
    turn: int = 0  # the parent's model turn that made the call (call ids may repeat)
    background: bool
    attempt: int
    status: str = LIVE  # "live" until subagent_finished, then the child's terminal status
    reserved_tokens: int = 0
    reserved_cost: float = 0.0
    on_failure: dict[str, Any] = field(default_factory=dict)
    verifier: str | None = None  # the reviewer verifier it was made for; None: a model's call

    @property
    def live(self) -> bool:
        return self.status == LIVE

    def to_dict(self) -> dict[str, Any]:
        return {
            "call_id": self.call_id,
            "turn": self.turn,
            "task_id": self.task_id,
            "agent": self.agent,
            "background": self.background,
            "attempt": self.attempt,
            "status": self.status,
            "reserved_tokens": self.reserved_tokens,
            "reserved_cost": self.reserved_cost,
            "on_failure": dict(self.on_failure),
            **({"verifier": self.verifier} if self.verifier is not None else {}),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ChildRecord:
        return cls(
            call_id=str(d["call_id"]),
            turn=int(d.get("turn", 0)),
            task_id=d.get("task_id"),
            agent=str(d.get("agent", "")),
            background=bool(d.get("background", False)),
            attempt=int(d.get("attempt", 1)),
            status=str(d.get("status", LIVE)),
            reserved_tokens=int(d.get("reserved_tokens", 0)),
            reserved_cost=float(d.get("reserved_cost", 0.0)),
            on_failure=dict(d.get("on_failure") or {}),
            verifier=d.get("verifier"),
        )


# --- folding -------------------------------------------------------------------------------


def spawned(children: Mapping[str, ChildRecord], d: Mapping[str, Any]) -> dict[str, ChildRecord]:
    """``children`` with the one ``subagent_spawned`` names (a repeat changes nothing)."""
    child_id = str(d["child_run_id"])
    if child_id in children:
        return dict(children)
    reserved = d.get("reserved") or {}
    record = ChildRecord(
        call_id=str(d.get("call_id", "")),
        turn=int(d.get("turn", 0)),
        task_id=d.get("task_id"),
        agent=str(d.get("agent", "")),
        background=bool(d.get("background", False)),
        attempt=int(d.get("attempt", 1)),
        reserved_tokens=int(reserved.get("tokens") or 0),
        reserved_cost=float(reserved.get("cost") or 0.0),
        on_failure=dict(d.get("on_failure") or {}),
        verifier=None if d.get("verifier") is None else str(d["verifier"]),
    )
    return {**children, child_id: record}


def finished(
    children: Mapping[str, ChildRecord], usage: Usage, d: Mapping[str, Any]
) -> tuple[dict[str, ChildRecord], Usage, bool]:
    """After ``subagent_finished``: the children (that one ended, its reservation gone),
    the parent's usage with the child's tokens and cost added, and whether this was news
    (False for a repeat or an unknown child: nothing changes then)."""
    child_id = str(d.get("child_run_id", ""))
    record = children.get(child_id)
    if record is None or not record.live:
        return dict(children), usage, False
    ended = ChildRecord(
        call_id=record.call_id,
        turn=record.turn,
        task_id=record.task_id,
        agent=record.agent,
        background=record.background,
        attempt=record.attempt,
        status=str(d.get("status", "failed")),
        on_failure=record.on_failure,
        verifier=record.verifier,
    )
    return {**children, child_id: ended}, usage.absorb(d.get("usage") or {}), True


# --- the rules of a spawn -------------------------------------------------------------------


def live_children(state: RunState) -> list[str]:
    return [child for child, record in state.children.items() if record.live]


def reserved(state: RunState, dim: Dimension) -> float:
    """What the parent's live children hold of pool ``dim``."""
    if dim is Dimension.TOKENS:
        return float(sum(r.reserved_tokens for r in state.children.values() if r.live))
    if dim is Dimension.COST:
        return sum(r.reserved_cost for r in state.children.values() if r.live)
    return 0.0


def check_limits(state: RunState, *, max_depth: int, max_live: int) -> None:
    """SpawnRefused when a child of ``state`` would be too deep or one too many."""
    depth = state.options.depth + 1
    if depth > max_depth:
        raise SpawnRefused(
            f"agent_spawn refused: a child of this run would be at depth {depth}, and the "
            f"maximum depth is {max_depth} ([agents] max_depth in .keel/config.toml); do "
            "this part of the work yourself"
        )
    live = live_children(state)
    if len(live) >= max_live:
        raise SpawnRefused(
            f"agent_spawn refused: this run already has {len(live)} live children "
            f"({', '.join(live)}) and the maximum is {max_live} ([agents] max_live_children); "
            "collect one with agent_wait first"
        )


def carve_budget(state: RunState, wanted: Budget | None, *, max_live: int) -> Budget:
    """The budget a new child of ``state`` gets, or SpawnRefused saying which dimension
    does not fit and by how much (see the module docstring for the rules)."""
    parent = state.options.budget
    free_places = max(1, max_live - len(live_children(state)))
    limits: dict[Dimension, float | None] = {}
    for dim in Dimension:
        asked = wanted.limit(dim) if wanted is not None else None
        limit = parent.limit(dim)
        if limit is None:
            limits[dim] = asked
            continue
        left = max(0.0, limit - state.usage.used(dim) - reserved(state, dim))
        if asked is not None and asked > left:
            held = reserved(state, dim)
            holding = f", of which live children hold {_amount(dim, held)}" if held else ""
            raise SpawnRefused(
                f"agent_spawn refused: the child's {_label(dim)} budget is {_amount(dim, asked)} "
                f"but this run has {_amount(dim, left)} left (limit {_amount(dim, limit)}, used "
                f"{_amount(dim, state.usage.used(dim))}{holding}); spawn a smaller task, or "
                "collect a child first"
            )
        share = asked if asked is not None else (left / free_places if dim in POOLS else left)
        if dim is not Dimension.COST and dim is not Dimension.WALL_TIME:
            share = math.floor(share)
        if share <= 0:
            raise SpawnRefused(
                f"agent_spawn refused: this run has no {_label(dim)} left to give a child "
                f"(limit {_amount(dim, limit)}, used {_amount(dim, state.usage.used(dim))}, "
                f"held by live children {_amount(dim, reserved(state, dim))})"
            )
        limits[dim] = share
    return Budget(
        max_steps=_whole(limits[Dimension.STEPS]),
        max_tool_calls=_whole(limits[Dimension.TOOL_CALLS]),
        max_tokens=_whole(limits[Dimension.TOKENS]),
        max_cost=limits[Dimension.COST],
        max_wall_seconds=limits[Dimension.WALL_TIME],
    )


def reservation(child_budget: Budget, parent: Budget) -> dict[str, Any]:
    """What a child holds of its parent's pools: its limits where the parent has one."""
    return {
        "tokens": child_budget.max_tokens if parent.max_tokens is not None else None,
        "cost": child_budget.max_cost if parent.max_cost is not None else None,
    }


def _whole(value: float | None) -> int | None:
    return None if value is None else int(value)


def _label(dim: Dimension) -> str:
    return dim.value.replace("_", " ")


def _amount(dim: Dimension, value: float) -> str:
    if dim is Dimension.COST:
        return f"${value:.4f}"
    if dim is Dimension.WALL_TIME:
        return f"{value:.0f} s"
    return f"{int(value):,}"


# --- a child's structured result -------------------------------------------------------------


def output_problems(schema: Mapping[str, Any], output: Any) -> list[str]:
    """Why ``output`` does not match ``schema`` (at most ``MAX_SCHEMA_ERRORS``, each with
    where in the output it is); an empty list when it matches."""
    # jsonschema costs 40 ms to import and only a child with an output schema needs it;
    # this module is loaded by keel.core.state, i.e. by every `keel` command
    from jsonschema.validators import validator_for  # noqa: PLC0415

    validator_class = validator_for(schema)
    validator = validator_class(schema)
    problems: list[str] = []
    errors = sorted(validator.iter_errors(output), key=lambda e: list(e.absolute_path))
    for error in errors[:MAX_SCHEMA_ERRORS]:
        problems.append(_problem(error))
    extra = len(errors) - MAX_SCHEMA_ERRORS
    if extra > 0:
        problems.append(f"and {extra} more")
    return problems


def _problem(error: ValidationError) -> str:
    where = "/".join(str(p) for p in error.absolute_path) or "(the whole output)"
    message = error.message if len(error.message) <= 300 else error.message[:299] + "…"
    return f"{where}: {message}"


__all__ = [
    "DEFAULT_MAX_DEPTH",
    "DEFAULT_MAX_LIVE_CHILDREN",
    "ChildRecord",
    "SpawnRefused",
    "carve_budget",
    "check_limits",
    "finished",
    "live_children",
    "output_problems",
    "reservation",
    "spawned",
]
