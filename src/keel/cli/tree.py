"""The tree of runs a delegating run makes: read from the store, walked, and worded.

A run's children are the runs created with its id as parent (``Store.child_runs``,
oldest first). What only the parent's log knows about each — foreground or
background, the attempt, the result it took, the patch and its stale paths — comes
from its ``subagent_spawned`` and ``subagent_finished`` events (``child_facts``).

The walk stops ``MAX_TREE_DEPTH`` levels down and never visits a run twice, so a
damaged parent link cannot make it loop; a child whose log is damaged leaves its
parent's children unread and says why (``RunNode.damage``). Everything a model or a
task wrote goes through ``shown`` before it is printed.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from rich.table import Table

from keel.cli.common import err_console, shown
from keel.cli.display import amount, excerpt, short_time, styled_status
from keel.core.budget import Dimension
from keel.core.errors import LogDamaged
from keel.core.events import Event, EventType
from keel.core.state import RunState
from keel.core.status import RunStatus

if TYPE_CHECKING:
    from keel.store.base import Store

MAX_TREE_DEPTH = 8  # levels below a top-level run the views walk (delegation allows 2 by default)
DIGEST_SHOWN = 12


class ChildReader(Protocol):
    """What the walk needs of a store (``Store.child_runs``)."""

    def child_runs(self, run_id: str) -> list[RunState]: ...


@dataclass(frozen=True, slots=True)
class RunNode:
    """One run and its children as the store holds them."""

    state: RunState
    children: tuple[RunNode, ...] = ()
    damage: str | None = None  # why the children could not be read (a damaged child log)


def task_of(state: RunState) -> str:
    """The task a run of an agent spec was given (``keel.runtime.child_runs.task_of``)."""
    # imported on first use: keel.runtime.child_runs loads the tools and agent specs, which
    # `keel runs`, `keel show` and every other `keel` start would pay for this one function
    from keel.runtime.child_runs import task_of as goal_task  # noqa: PLC0415

    return goal_task(state)


# --- reading the tree ----------------------------------------------------------------------


def build_tree(store: ChildReader, state: RunState, *, max_depth: int = MAX_TREE_DEPTH) -> RunNode:
    """``state`` with its descendants, ``max_depth`` levels down at most."""
    seen = {state.run_id}

    def grow(run: RunState, depth: int) -> RunNode:
        if depth >= max_depth:
            return RunNode(run)
        try:
            found = store.child_runs(run.run_id)
        except LogDamaged as exc:
            return RunNode(run, damage=str(exc))
        nodes = []
        for child in found:
            if child.run_id not in seen:
                seen.add(child.run_id)
                nodes.append(grow(child, depth + 1))
        return RunNode(run, tuple(nodes))

    return grow(state, 0)


def top_level_runs(
    store: Store, *, status: RunStatus | None, limit: int
) -> list[RunState | LogDamaged]:
    """The newest ``limit`` runs that have no parent (``status`` filters them, not their
    children); a run whose log is damaged is listed as its ``LogDamaged``."""
    asked = limit
    while True:
        runs = store.survey_runs(status=status, limit=asked)
        top = [r for r in runs if isinstance(r, LogDamaged) or r.parent_id is None]
        if len(top) >= limit or len(runs) < asked:
            return top[:limit]
        asked *= 4


def descendants(node: RunNode) -> Iterator[RunNode]:
    """Every run below ``node``, depth first, each before its own children."""
    for child in node.children:
        yield child
        yield from descendants(child)


def waiting_descendants(node: RunNode) -> list[RunState]:
    return [d.state for d in descendants(node) if d.state.status is RunStatus.WAITING]


def child_facts(events: Iterable[Event]) -> dict[str, dict[str, Any]]:
    """Per child run id, what the parent's log says: ``spawned`` (its latest
    ``subagent_spawned`` data) and ``finished`` (its ``subagent_finished`` data, or None)."""
    facts: dict[str, dict[str, Any]] = {}
    for event in events:
        if event.type not in (EventType.SUBAGENT_SPAWNED, EventType.SUBAGENT_FINISHED):
            continue
        child = str(event.data.get("child_run_id", ""))
        entry = facts.setdefault(child, {"spawned": None, "finished": None})
        key = "spawned" if event.type is EventType.SUBAGENT_SPAWNED else "finished"
        entry[key] = dict(event.data)
    return facts


# --- facts of one run ----------------------------------------------------------------------


def agent_name(state: RunState) -> str | None:
    agent = state.options.agent or {}
    name = agent.get("name")
    return str(name) if name else None


def agent_label(state: RunState) -> str:
    """``NAME (sha256 PREFIX, SOURCE, vN)`` of a child's spec; ``-`` for a top-level run."""
    agent = state.options.agent
    if not agent:
        return "-"
    parts = []
    if agent.get("digest"):
        parts.append(f"sha256 {str(agent['digest'])[:DIGEST_SHOWN]}")
    if agent.get("source"):
        parts.append(str(agent["source"]))
    if agent.get("version") is not None:
        parts.append(f"v{agent['version']}")
    extra = f" ({', '.join(parts)})" if parts else ""
    return f"{agent.get('name') or '?'}{extra}"


def run_summary(run: RunState | LogDamaged) -> dict[str, Any]:
    """The JSON of one run in ``keel runs`` (one node's own fields in ``--tree``)."""
    if isinstance(run, LogDamaged):
        return {
            "run_id": run.run_id,
            "status": None,
            "damaged": {"seq": run.seq, "detail": run.detail, "message": str(run)},
        }
    return {
        "run_id": run.run_id,
        "status": run.status.value,
        "reason": run.reason,
        "goal": run.goal,
        "workspace": run.workspace,
        "parent_id": run.parent_id,
        "task_id": run.task_id,
        "usage": run.usage.to_dict(),
        "last_seq": run.last_seq,
        "updated_at": run.updated_at,
    }


# --- keel runs --tree ----------------------------------------------------------------------


def tree_json(node: RunNode | LogDamaged) -> dict[str, Any]:
    """A run as ``keel runs --tree --json`` prints it: its summary, where it sits in the
    tree, its agent, and its ``children`` (nested the same way, oldest first)."""
    if isinstance(node, LogDamaged):
        return {**run_summary(node), "children": []}
    state = node.state
    out = {
        **run_summary(state),
        "depth": state.options.depth,
        "root_id": state.options.root_id,
        "agent": state.options.agent,
        "budget": state.options.budget.to_dict(),
        "children": [tree_json(child) for child in node.children],
    }
    if node.damage:
        out["children_damaged"] = node.damage
    return out


def tree_table(roots: list[RunNode | LogDamaged]) -> Table:
    """The runs as a table, each child on its own row indented under its parent."""
    table = Table(box=None, header_style="bold")
    for column in ("RUN", "STATUS", "AGENT", "STEPS", "TOKENS", "COST", "UPDATED"):
        table.add_column(column, no_wrap=True)
    table.add_column("GOAL", overflow="fold", min_width=16)
    table.add_column("REASON", overflow="fold", min_width=12)
    for root in roots:
        if isinstance(root, LogDamaged):
            damage = f"event log damaged at seq {root.seq}: {root.detail}"
            table.add_row(root.run_id, "[bold red]damaged[/]", *["-"] * 6, shown(damage))
            continue
        for prefix, node in _rows(root, "", ""):
            state = node.state
            reason = state.reason or ""
            if node.damage:
                reason = f"{reason}; children unreadable: {node.damage}".lstrip("; ")
            table.add_row(
                f"{prefix}{state.run_id}",
                styled_status(state.status),
                shown(agent_name(state) or "-"),
                str(state.usage.steps),
                str(state.usage.tokens),
                amount(Dimension.COST, state.usage.cost),
                short_time(state.updated_at),
                shown(excerpt(task_of(state), 60)),
                shown(excerpt(reason, 60)),
            )
    return table


def _rows(node: RunNode, prefix: str, below: str) -> Iterator[tuple[str, RunNode]]:
    """``(tree prefix, node)`` for ``node`` and its descendants, in drawing order."""
    yield prefix, node
    for index, child in enumerate(node.children):
        last = index == len(node.children) - 1
        branch, rest = ("└─ ", "   ") if last else ("├─ ", "│  ")
        yield from _rows(child, below + branch, below + rest)


# --- keel show: lineage, children, waiting descendants --------------------------------------


def describe_lineage(state: RunState) -> list[str]:
    """Where a child sits in its tree (nothing for a top-level run)."""
    if state.parent_id is None:
        return []
    options = state.options
    return [
        f"  parent     {state.parent_id}",
        f"  root       {options.root_id or state.parent_id}   depth {options.depth}",
        f"  agent      {shown(agent_label(state))}",
    ]


def children_entries(
    run: RunState, node: RunNode, facts: Mapping[str, Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """The children of ``run`` (``node``: its tree) as ``keel show --json`` lists them,
    oldest first; a child the run's state names but the store has no run for (a spawn
    cut short) comes last, with ``missing: true`` and only what the parent knows."""
    entries = []
    for child in node.children:
        record = run.children.get(child.state.run_id)
        entries.append(
            child_entry(
                child.state,
                record.to_dict() if record is not None else None,
                facts.get(child.state.run_id),
            )
        )
    found = {child.state.run_id for child in node.children}
    for child_id, record in run.children.items():
        if child_id not in found:
            entries.append(
                {
                    "run_id": child_id,
                    "missing": True,
                    "agent": {"name": record.agent},
                    "status": None,
                    "call_id": record.call_id,
                    "task_id": record.task_id,
                    "background": record.background,
                    "attempt": record.attempt,
                }
            )
    return entries


def child_entry(
    child: RunState, record: Mapping[str, Any] | None, facts: Mapping[str, Any] | None
) -> dict[str, Any]:
    """One child as ``keel show --json`` lists it: the child run's own facts, what its
    parent's state holds of it (``record``), and what its parent's log says of its end."""
    spawned = (facts or {}).get("spawned") or {}
    finished = (facts or {}).get("finished")
    result = child.result or {}
    took = finished or {}
    return {
        "run_id": child.run_id,
        "missing": False,
        "agent": child.options.agent,
        "status": child.status.value,
        "reason": child.reason,
        "task": spawned.get("task") or task_of(child),
        "task_id": child.task_id,
        "call_id": (record or {}).get("call_id") or spawned.get("call_id"),
        "background": (record or {}).get("background", spawned.get("background")),
        "attempt": (record or {}).get("attempt", spawned.get("attempt")),
        "depth": child.options.depth,
        "workspace": child.options.workspace_kind,
        "budget": child.options.budget.to_dict(),
        "usage": child.usage.to_dict(),
        "result_taken": finished is not None,
        "summary": took.get("summary") or result.get("summary"),
        "output": took.get("output", result.get("output")),
        "evidence": took.get("evidence", result.get("evidence")),
        "patch": took.get("patch"),
        "patch_files": took.get("patch_files") or [],
        "stale": took.get("stale") or [],
        "policy": took.get("policy"),
        "base_revision": spawned.get("base_revision", took.get("base_revision")),
    }


def describe_children(entries: list[dict[str, Any]]) -> list[str]:
    """The ``children`` section of ``keel show`` (``entries`` from ``children_entries``)."""
    if not entries:
        return []
    lines = ["[bold]children[/]"]
    for entry in entries:
        if entry["missing"]:
            lines.append(
                f"  [bold]{shown(str(entry['run_id']))}[/]  [dim]no run recorded for this "
                f"child (its spawn was cut short)[/]"
            )
            continue
        how = [
            "background" if entry["background"] else "foreground",
            *([f"attempt {entry['attempt']}"] if entry["attempt"] else []),
            *([f"workspace {entry['workspace']}"] if entry["workspace"] else []),
        ]
        agent = (entry["agent"] or {}).get("name") or "-"
        lines.append(
            f"  [bold]{entry['run_id']}[/]  {styled_status(RunStatus(entry['status']))}  "
            f"{shown(str(agent))}  [dim]{shown(', '.join(how))}[/]"
        )
        lines.append(f"    task      {shown(excerpt(str(entry['task'] or '')))}")
        lines.append(f"    used      {_used(entry)}")
        if entry["summary"]:
            lines.append(f"    summary   {shown(excerpt(str(entry['summary'])))}")
        if entry["status"] != RunStatus.COMPLETED.value and entry["reason"]:
            lines.append(f"    reason    {shown(excerpt(str(entry['reason'])))}")
        if entry["patch"]:
            files = [str(p) for p in entry["patch_files"]]
            named = f" ({len(files)} files: {', '.join(files)})" if files else ""
            lines.append(f"    patch     {shown(str(entry['patch']) + named)}")
        if entry["stale"]:
            stale = ", ".join(str(p) for p in entry["stale"])
            lines.append(
                f"    [yellow]stale[/]     {shown(stale)} (changed here after the child started)"
            )
    return lines


def _used(entry: Mapping[str, Any]) -> str:
    usage, budget = entry["usage"], entry["budget"]
    limits = {
        Dimension.STEPS: "max_steps",
        Dimension.TOOL_CALLS: "max_tool_calls",
        Dimension.TOKENS: "max_tokens",
        Dimension.COST: "max_cost",
    }
    return " · ".join(
        f"{dim.value.replace('_', ' ')} {amount(dim, usage.get(dim.value, 0))} / "
        f"{amount(dim, budget.get(key))}"
        for dim, key in limits.items()
    )


def wait_facts(state: RunState, store_flag: str = "") -> tuple[str, list[tuple[str, str]]]:
    """What a waiting run waits for, in words, and the ``(label, command)`` pairs that
    answer it (none when it waits for its own child, which is listed itself)."""
    rid = state.run_id
    pending = state.pending
    approve = ("approve", f"keel approve {rid}{store_flag}")
    deny = ("deny", f"keel approve {rid} --deny --reason TEXT{store_flag}")
    if pending is None:
        return state.reason or "a person", [approve, deny]
    arguments = pending.arguments or {}
    if pending.kind == "question":
        return f"the answer to: {pending.question or ''}", [
            ("answer", f"keel answer {rid} TEXT{store_flag}")
        ]
    if pending.kind == "signoff":
        name = pending.question or "?"
        return f"the sign-off of {name} (its verifiers passed at this revision)", [
            ("sign off", f"keel approve {rid} --verifier {name}{store_flag}"),
            ("decline", f"keel approve {rid} --verifier {name} --deny --reason TEXT{store_flag}"),
        ]
    if pending.kind == "child":
        child = arguments.get("child_run_id") or "?"
        what = arguments.get("what")
        return f"its child {child}" + (f", which waits for {what}" if what else ""), []
    if pending.kind == "child_failure":
        child = arguments.get("child_run_id") or "?"
        agent = arguments.get("agent") or "?"
        ended = f"{arguments.get('status') or 'failed'}: {arguments.get('reason') or ''}"
        return f"a decision on its failed child {child} ({agent}, {ended})", [
            ("retry", f"keel approve {rid}{store_flag}"),
            ("give up", f"keel approve {rid} --deny --reason TEXT{store_flag}"),
            ("instruct", f"keel answer {rid} TEXT{store_flag}"),
        ]
    if pending.kind == "plan":
        return f"approval of the plan (plan_exit, call {pending.call_id})", [approve, deny]
    if pending.kind == "unknown_outcome":
        what = f"a decision on the interrupted call to {pending.tool or '?'}"
        return f"{what} (call {pending.call_id})", [approve, deny]
    kind = "approval" if pending.kind == "approval" else f"a decision ({pending.kind})"
    return f"{kind} of {pending.tool or '?'} (call {pending.call_id})", [approve, deny]


def waiting_entry(state: RunState, store_flag: str = "") -> dict[str, Any]:
    """One waiting descendant as ``keel show --json`` lists it."""
    what, commands = wait_facts(state, store_flag)
    return {
        "run_id": state.run_id,
        "parent_id": state.parent_id,
        "depth": state.options.depth,
        "agent": agent_name(state),
        "reason": state.reason,
        "pending": state.pending.to_dict() if state.pending is not None else None,
        "waits_for": what,
        "commands": [command for _, command in commands],
    }


def describe_waiting(waiting: list[RunState], store_flag: str = "") -> list[str]:
    """The ``waiting descendants`` section of ``keel show``: each one, what it waits
    for, and the command that answers it."""
    if not waiting:
        return []
    lines = ["[bold yellow]waiting descendants[/]"]
    for state in waiting:
        what, commands = wait_facts(state, store_flag)
        where = f"{agent_name(state) or '-'}, depth {state.options.depth}, under {state.parent_id}"
        lines.append(f"  [bold]{state.run_id}[/]  [dim]({shown(where)})[/]")
        lines.append(f"    waits for  {shown(excerpt(what, 200))}")
        lines += [f"    {label + ':':<10} {shown(command)}" for label, command in commands]
    return lines


# --- keel events: a parent's subagent events on one line -----------------------------------


def spawn_summary(d: Mapping[str, Any]) -> str:
    """``explorer run_x (background, attempt 2): the task…`` for ``subagent_spawned``."""
    how = ["background" if d.get("background") else "foreground"]
    if int(d.get("attempt") or 1) > 1:
        how.append(f"attempt {d.get('attempt')}")
    if d.get("workspace"):
        how.append(str(d["workspace"]))
    task = excerpt(str(d.get("task") or ""), 70)
    return f"{d.get('agent', '?')} {d.get('child_run_id', '?')} ({', '.join(how)}): {task}"


def finish_summary(d: Mapping[str, Any]) -> str:
    """``explorer run_x completed: the summary… (patch art_y, stale a.py)`` for
    ``subagent_finished``."""
    head = f"{d.get('agent', '?')} {d.get('child_run_id', '?')} {d.get('status', '?')}"
    said = d.get("summary") or d.get("reason") or ""
    tail = []
    if d.get("patch"):
        tail.append(f"patch {d['patch']}")
    if d.get("stale"):
        tail.append(f"stale {', '.join(str(p) for p in d['stale'])}")
    policy = d.get("policy")
    if policy and policy != "none" and d.get("status") != RunStatus.COMPLETED.value:
        tail.append(f"policy {policy}")
    if d.get("retried_as"):
        tail.append(f"retried as {d['retried_as']}")
    text = head + (f": {excerpt(str(said), 70)}" if said else "")
    return text + (f" ({'; '.join(tail)})" if tail else "")


def note_children_damage(node: RunNode) -> None:
    """Say on stderr which runs' children could not be read (their logs are damaged)."""
    for damaged in (n for n in (node, *descendants(node)) if n.damage):
        err_console.print(
            f"children of {damaged.state.run_id} unreadable: {shown(damaged.damage or '')} — "
            "`keel verify --all` names the bad event",
            highlight=False,
            soft_wrap=True,
        )


__all__ = [
    "MAX_TREE_DEPTH",
    "ChildReader",
    "RunNode",
    "agent_label",
    "agent_name",
    "build_tree",
    "child_entry",
    "child_facts",
    "children_entries",
    "descendants",
    "describe_children",
    "describe_lineage",
    "describe_waiting",
    "finish_summary",
    "run_summary",
    "spawn_summary",
    "task_of",
    "top_level_runs",
    "tree_json",
    "tree_table",
    "wait_facts",
    "waiting_descendants",
    "waiting_entry",
]
