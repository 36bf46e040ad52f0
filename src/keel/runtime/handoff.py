"""Handoff: one run passes its whole task to a run of another agent, and ends.

Unlike a spawn, responsibility moves: the current run completes with outcome
``handed_off`` naming the new run, and the new run is a sibling (same parent, same
depth) that receives what the first one knew — the goal, the plan, the todos, the
harness's notes, the person's answers it was given, the handoff note — and exactly
the budget the first one had left. Its tools and mode are the agent spec's,
narrowed by the first run's (never more). Both runs record it: ``handed_off`` on the
first, a ``note_added`` naming the first on the second. The new run is queued with
a task of its own, so ``Harness.run`` (which follows a handoff) or any worker
executes it. Keyed by the call: a resumed run hands over to the same run.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from keel.core.agent_spec import AgentSpec
from keel.core.budget import Budget, Dimension
from keel.core.children import SpawnRefused
from keel.core.errors import KeelError, TaskNotClaimable
from keel.core.events import EventType, NewEvent
from keel.core.state import RunState
from keel.runtime.child_runs import child_tools
from keel.store.base import Store
from keel.tools.registry import ToolRegistry

MAX_NOTES = 10


def remaining_budget(state: RunState) -> Budget:
    """What ``state``'s run has left in every limited dimension; SpawnRefused if nothing."""
    budget, usage = state.options.budget, state.usage
    left: dict[Dimension, float | None] = {}
    for dim in Dimension:
        limit = budget.limit(dim)
        left[dim] = None if limit is None else limit - usage.used(dim)
        if left[dim] is not None and left[dim] <= 0:  # type: ignore[operator]
            raise SpawnRefused(
                f"handoff refused: this run has no {dim.value.replace('_', ' ')} left to hand "
                "over; request completion or stop instead"
            )
    return Budget(
        max_steps=_whole(left[Dimension.STEPS]),
        max_tool_calls=_whole(left[Dimension.TOOL_CALLS]),
        max_tokens=_whole(left[Dimension.TOKENS]),
        max_cost=left[Dimension.COST],
        max_wall_seconds=left[Dimension.WALL_TIME],
    )


def handoff_goal(current: RunState, spec: AgentSpec, note: str) -> str:
    """What the new run is told: the spec's instructions and everything the first run knew."""
    parts = [spec.instructions.strip(), "## The goal", current.goal.strip()]
    parts += ["## Handed over by run " + current.run_id, note.strip()]
    if current.plan:
        parts += ["## The plan so far", current.plan.strip()]
    if current.todos:
        parts += [
            "## Todos",
            "\n".join(f"- [{t.status}] {t.content}" for t in current.todos),
        ]
    if current.notes:
        parts += [
            "## Known facts and notes",
            "\n".join(f"- {n}" for n in current.notes[-MAX_NOTES:]),
        ]
    if current.changed_files:
        parts += ["## Files changed so far", "\n".join(sorted(current.changed_files))]
    return "\n\n".join(p for p in parts if p)


def hand_over(
    store: Store,
    registry: ToolRegistry,
    *,
    current: RunState,
    spec: AgentSpec,
    note: str,
    call_id: str,
    redact: Callable[[str], str],
    owner: str = "handoff",
) -> RunState:
    """Create (or find again, for the same call) the run that takes over ``current``."""
    budget = remaining_budget(current)
    tools, mode = child_tools(
        spec, current, registry, kind=current.options.workspace_kind or "shared", leaf=False
    )
    key = f"handoff:{current.run_id}:{call_id}"
    options = replace(
        current.options,
        model=spec.model or current.options.model,
        mode=mode,
        verify=current.options.verify or spec.verify,
        budget=budget,
        tools=tools,
        agent={
            "name": spec.name,
            "digest": spec.digest,
            "version": spec.version,
            "source": spec.source,
        },
        output_schema=current.options.output_schema,
    )
    task = store.create_task(
        f"{spec.name}: take over run {current.run_id}",
        description=note,
        actor=f"run:{current.run_id}",
        idempotency_key=key,
        options={"handoff_from": current.run_id, "agent": spec.name},
    )
    token = None
    if task.run_id is None:
        try:
            claimed = store.claim_task(owner=owner, lease_seconds=60.0, task_id=task.id)
        except TaskNotClaimable:
            claimed = None
        token = claimed.lease_token if claimed is not None else None
    new = store.create_run(
        goal=redact(handoff_goal(current, spec, note)),
        workspace=str(Path(current.workspace)),
        options=options,
        parent_id=current.parent_id,
        task_id=task.id,
        idempotency_key=key,
        queued=True,
    )
    if token is not None:
        store.link_task_run(task.id, new.run_id, owner=owner, token=token)
        store.release_task(task.id, owner=owner, token=token, reason="handed over: ready to run")
    if new.last_seq == 1:
        with contextlib.suppress(KeelError):  # recorded by an earlier attempt of this call
            new, _ = store.append_events(
                new.run_id,
                [
                    NewEvent(
                        type=EventType.NOTE_ADDED,
                        data={
                            "text": f"You take over from run {current.run_id}, which handed its "
                            f"task to you ({spec.name}): {redact(note)}",
                            "handoff_from": current.run_id,
                        },
                    )
                ],
                expected_seq=1,
            )
    return new


def _whole(value: float | None) -> int | None:
    return None if value is None else int(value)


__all__ = ["hand_over", "handoff_goal", "remaining_budget"]
