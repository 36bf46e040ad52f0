"""Making a child: its contract (tools, mode, budget, workspace) and its run and task.

Everything a child may do is fixed here, in code, from the parent's state and the
agent spec — never from what the model asked: its tools are the spec's allowlist
intersected with the parent's (a ``shared-readonly`` child gets only the ones that
change nothing), its mode is never more permissive than the parent's, its budget is
carved from what the parent has left (``keel.core.children.carve_budget``), and its
workspace is never more open than the parent's.

A child is a run (``parent_id``, its depth and root in its options) and a task in
the task graph whose run it is, so any worker sharing the store can execute it.
Both are created under one idempotency key, ``spawn:<parent>:<turn>:<call>:<attempt>``: a
parent resumed after a crash makes the same call again and gets the same child.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from keel.core.agent_spec import AgentSpec, FailurePolicy, OnFailure, narrowed
from keel.core.budget import Budget
from keel.core.children import SpawnRefused, carve_budget, reservation
from keel.core.errors import TaskNotClaimable
from keel.core.events import EventType, NewEvent
from keel.core.records import RunOptions
from keel.core.state import RunState
from keel.core.tasks import Task
from keel.faults import fault_point
from keel.runtime import worktrees
from keel.store.base import Store
from keel.tools.base import Effect
from keel.tools.delegation import DELEGATION_TOOL_NAMES
from keel.tools.registry import ToolRegistry

READONLY_REFUSED = frozenset({"plan_write", "plan_exit"})  # they write the workspace's plan file
ALWAYS_OFFERED = ("request_completion",)  # a child must be able to finish
TASK_HEADING = "## Your task"  # where a goal made by compose_goal states the task
MAX_SUBJECT = 120
CLAIM_PAUSE_S = 0.05


@dataclass(frozen=True, slots=True, kw_only=True)
class NewChild:
    """A child just made (or found again under its key) and the task claim this process
    holds on it (None when someone else holds it already)."""

    state: RunState
    task: Task
    token: str | None
    spawned: NewEvent  # the parent's subagent_spawned


def home_workspace(state: RunState) -> Path:
    """Where a run's agent specs and configuration live: its workspace, or for an
    isolated child the workspace its isolated copy was made from."""
    isolated = state.options.isolated
    if isolated and isolated.get("parent"):
        return Path(str(isolated["parent"]))
    return Path(state.workspace)


def failure_policy(spec: AgentSpec, word: str | None) -> OnFailure:
    """The spec's ``on_failure``, or the policy the call named (keeping the spec's retry
    settings when it names retry)."""
    if word is None:
        return spec.on_failure
    policy = FailurePolicy(word)
    if policy is spec.on_failure.policy:
        return spec.on_failure
    if policy is FailurePolicy.RETRY:
        return OnFailure(policy=policy, attempts=2, then=FailurePolicy.FAIL_FAST)
    return OnFailure(policy=policy)


def on_failure_dict(policy: OnFailure) -> dict[str, Any]:
    return {
        "policy": policy.policy.value,
        "attempts": policy.attempts,
        "agent": policy.agent,
        "then": policy.then.value,
    }


def child_tools(
    spec: AgentSpec, parent: RunState, registry: ToolRegistry, *, kind: str, leaf: bool
) -> tuple[tuple[str, ...], str]:
    """The child's tools and mode: never more than the parent's (see module docstring).

    ``leaf``: the child is at the maximum depth, so the delegation tools are left out.
    """
    parent_tools = list(parent.options.tools or registry.names())
    return agent_tools(spec, parent_tools, parent.mode, registry, kind=kind, leaf=leaf)


def agent_tools(
    spec: AgentSpec,
    offered: list[str],
    mode: str,
    registry: ToolRegistry,
    *,
    kind: str,
    leaf: bool,
) -> tuple[tuple[str, ...], str]:
    """The tools and mode of a run of ``spec`` when at most ``offered`` and ``mode`` are
    allowed: the spec's allowlist and mode narrowed to them, only tools that change
    nothing for a ``shared-readonly`` run, no delegation tools for a ``leaf``, and
    ``request_completion`` always (a run must be able to finish)."""
    tools, mode = narrowed(spec, parent_tools=offered, parent_mode=mode)
    chosen = list(tools)
    if kind == "shared-readonly":
        chosen = [
            name
            for name in chosen
            if name in registry
            and registry.get(name).effect in (Effect.READ, Effect.STATE)
            and name not in READONLY_REFUSED
        ]
    if leaf:
        chosen = [name for name in chosen if name not in DELEGATION_TOOL_NAMES]
    for name in ALWAYS_OFFERED:
        if name not in chosen and name in registry:
            chosen.append(name)
    return tuple(chosen), mode


def workspace_kind(spec: AgentSpec, parent: RunState) -> str:
    """The spec's workspace, never more open than the parent's: under a read-only parent
    a ``shared`` child is read-only too (an isolated one only writes its own copy)."""
    if parent.options.workspace_kind == "shared-readonly" and spec.workspace == "shared":
        return "shared-readonly"
    return spec.workspace


def compose_goal(spec: AgentSpec, task: str, inputs: dict[str, Any] | None) -> str:
    """What the child is told: the spec's instructions, its task, its inputs and, when
    its result must follow a schema, that schema. Never the parent's transcript."""
    parts = [spec.instructions.strip(), TASK_HEADING, task.strip()]
    if inputs:
        parts += ["## Inputs", json.dumps(inputs, ensure_ascii=False, indent=2, sort_keys=True)]
    if spec.output is not None:
        parts += [
            "## Your result",
            "Finish with request_completion, passing `output`: a JSON object matching this "
            "schema (it is checked; a result that does not match is sent back to you):",
            json.dumps(spec.output, ensure_ascii=False, sort_keys=True),
        ]
    return "\n\n".join(part for part in parts if part)


def task_of(state: RunState) -> str:
    """The task a run of an agent spec was given (its goal without the spec's
    instructions around it, see ``compose_goal``); any other run's whole goal."""
    goal = state.goal
    followed = state.parent_id is not None or state.options.agent is not None
    if not followed or TASK_HEADING not in goal:
        return goal
    after = goal.split(TASK_HEADING, 1)[1]
    return after.split("\n\n## ", 1)[0].strip() or goal


def make_child(
    store: Store,
    registry: ToolRegistry,
    *,
    parent: RunState,
    spec: AgentSpec,
    task_text: str,
    inputs: dict[str, Any] | None,
    background: bool,
    policy: OnFailure,
    call_id: str,
    turn: int,
    attempt: int,
    max_depth: int,
    max_live: int,
    owner: str,
    lease_seconds: float,
    redact: Any,
    verifier: str | None = None,
) -> NewChild:
    """Create (or find again) the child of ``parent`` for ``attempt`` of call ``call_id``
    of model turn ``turn`` (a provider may reuse a call id in a later turn).

    SpawnRefused for a budget that does not fit; a ToolError when the isolated
    workspace cannot be made. The returned task is claimed by ``owner`` when this call
    could claim it (the caller executes the child or hands the claim back).
    """
    kind = workspace_kind(spec, parent)
    leaf = parent.options.depth + 1 >= max_depth
    tools, mode = child_tools(spec, parent, registry, kind=kind, leaf=leaf)
    budget: Budget = carve_budget(parent, spec.budget, max_live=max_live)
    key = f"spawn:{parent.run_id}:{turn}:{call_id}:{attempt}"
    home = home_workspace(parent)
    isolated: worktrees.IsolatedWorkspace | None = None
    workspace = Path(parent.workspace)
    if kind == "isolated":
        isolated = worktrees.create(
            Path(parent.workspace),
            root=worktrees.default_root(home),
            name=f"child-{uuid.uuid4().hex[:20]}",
        )
        workspace = isolated.path
    options = RunOptions(
        model=spec.model or parent.options.model,
        mode=mode,
        verify=spec.verify,
        budget=budget,
        approval_timeout_s=parent.options.approval_timeout_s,
        grant_ttl_s=parent.options.grant_ttl_s,
        policy=parent.options.policy,
        sandbox=parent.options.sandbox,
        tools=tools,
        depth=parent.options.depth + 1,
        root_id=parent.options.root_id or parent.run_id,
        agent={
            "name": spec.name,
            "digest": spec.digest,
            "version": spec.version,
            "source": spec.source,
        },
        output_schema=spec.output,
        outcome=spec.outcome,
        workspace_kind=kind,
        isolated=_isolated_dict(isolated) if isolated is not None else None,
    )
    try:
        task, token = _task_for(
            store,
            parent=parent,
            spec=spec,
            task_text=task_text,
            inputs=inputs,
            background=background,
            key=key,
            owner=owner,
            lease_seconds=lease_seconds,
        )
        fault_point("before_child_run")
        child = store.create_run(
            goal=redact(compose_goal(spec, task_text, inputs)),
            workspace=str(workspace),
            options=options,
            parent_id=parent.run_id,
            task_id=task.id,
            idempotency_key=key,
            queued=True,
        )
    except BaseException:
        if isolated is not None:
            isolated.remove()
        raise
    if isolated is not None and child.options.isolated != options.isolated:
        isolated.remove()  # the child existed already (a resumed spawn): its own copy stands
    if token is not None and task.run_id is None:
        task = store.link_task_run(task.id, child.run_id, owner=owner, token=token)
    fault_point("before_spawn_recorded")
    spawned = NewEvent(
        type=EventType.SUBAGENT_SPAWNED,
        data={
            "call_id": call_id,
            "turn": turn,
            "child_run_id": child.run_id,
            "task_id": task.id,
            "agent": spec.name,
            "agent_digest": spec.digest,
            "agent_source": spec.source,
            "agent_version": spec.version,
            "background": background,
            "on_failure": on_failure_dict(policy),
            "attempt": attempt,
            "budget": child.options.budget.to_dict(),
            "reserved": reservation(child.options.budget, parent.options.budget),
            "workspace": kind,
            "base_revision": parent.mutation_revision,
            "base_commit": (child.options.isolated or {}).get("base"),
            "depth": child.options.depth,
            "tools": list(tools),
            "mode": mode,
            "task": task_text,
            **({"verifier": verifier} if verifier is not None else {}),
        },
    )
    return NewChild(state=child, task=task, token=token, spawned=spawned)


def _task_for(
    store: Store,
    *,
    parent: RunState,
    spec: AgentSpec,
    task_text: str,
    inputs: dict[str, Any] | None,
    background: bool,
    key: str,
    owner: str,
    lease_seconds: float,
) -> tuple[Task, str | None]:
    """The child's task, claimed by ``owner`` if it can be (a worker that claims a child
    task before its run is linked hands it back at once, so a few tries suffice)."""
    first_line = task_text.strip().splitlines()[0] if task_text.strip() else spec.name
    subject = f"{spec.name}: {first_line}"
    if len(subject) > MAX_SUBJECT:
        subject = subject[: MAX_SUBJECT - 1] + "…"
    task = store.create_task(
        subject,
        description=task_text,
        actor=f"run:{parent.run_id}",
        idempotency_key=key,
        options={
            "child_of": parent.run_id,
            "agent": spec.name,
            "task": task_text,
            "inputs": inputs,
            "background": background,
            "base_revision": parent.mutation_revision,
        },
    )
    if task.run_id is not None:
        return task, None  # made before: whoever executes it holds it, or it is free
    # Held by no one, or by a worker about to hand it back, or by this spawn's earlier
    # attempt in a process that died (its claim lapses within its lease).
    deadline = time.monotonic() + 2 * lease_seconds + 1
    while True:
        try:
            claimed = store.claim_task(owner=owner, lease_seconds=lease_seconds, task_id=task.id)
        except TaskNotClaimable:
            claimed = None
        if claimed is not None and claimed.lease_token is not None:
            return claimed, claimed.lease_token
        current = store.get_task(task.id)
        if current.run_id is not None:
            return current, None
        if time.monotonic() > deadline:
            break
        time.sleep(CLAIM_PAUSE_S)
    raise SpawnRefused(
        f"agent_spawn: could not claim the child's task {task.id} to link its run; try again"
    )


def _isolated_dict(ws: worktrees.IsolatedWorkspace) -> dict[str, Any]:
    return {
        "kind": ws.kind,
        "base": ws.base,
        "parent": str(ws.parent),
        "path": str(ws.path),
        "git_dir": str(ws.git_dir),
        "common_dir": None if ws.common_dir is None else str(ws.common_dir),
    }


def isolated_workspace(options: RunOptions) -> worktrees.IsolatedWorkspace | None:
    """The isolated workspace a child's options describe (None for other children)."""
    d = options.isolated
    if not d:
        return None
    return worktrees.IsolatedWorkspace(
        path=Path(d["path"]),
        kind=str(d["kind"]),
        base=str(d["base"]),
        parent=Path(d["parent"]),
        git_dir=Path(d["git_dir"]),
        common_dir=None if d.get("common_dir") is None else Path(d["common_dir"]),
    )


__all__ = [
    "NewChild",
    "child_tools",
    "compose_goal",
    "failure_policy",
    "home_workspace",
    "isolated_workspace",
    "make_child",
    "on_failure_dict",
    "workspace_kind",
]
