"""`keel tasks …`: the shared task graph from the command line.

``--owner`` defaults to ``KEEL_AGENT_ID``, else ``user@host``: the same name in every
command, so a person can ``claim`` in one command and ``complete`` in the next
(token-less writes are accepted from the owner while its lease is live). Errors —
unknown id, cycle, not owner, blocked — print one line and exit 2; ``claim`` with
nothing ready exits 1. ``cancel`` withdraws a task for good: anyone may cancel a
pending or failed task (or one whose lease lapsed), only the owner one it holds.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from enum import StrEnum

import typer
from rich.table import Table

from keel.cli.common import (
    JsonOption,
    StoreOption,
    console,
    err_console,
    keel_errors,
    print_json,
    shown,
)
from keel.cli.common import store_url as resolve_store_url
from keel.cli.task_graph import render_mermaid, render_tree, status_markup
from keel.core.tasks import Task, TaskEvent, TaskStatus, blocked_reason
from keel.runtime.identity import default_owner
from keel.store.base import Store
from keel.store.url import open_store

DEFAULT_LEASE_S = 3600.0

tasks_app = typer.Typer(
    name="tasks",
    help="The shared task graph: create, block, claim, complete, fail, cancel, draw.",
    no_args_is_help=True,
)


class GraphFormat(StrEnum):
    TEXT = "text"  # a coloured tree in the terminal
    MERMAID = "mermaid"  # Mermaid flowchart text


OwnerOption = typer.Option(
    None, "--owner", help="Who acts (default: KEEL_AGENT_ID, else user@host).", show_default=False
)


@contextmanager
def opened(url: str | None) -> Iterator[Store]:
    store = open_store(resolve_store_url(url))
    try:
        yield store
    finally:
        store.close()


def _when(task: Task) -> str:
    return task.lease_expires_at.isoformat(timespec="seconds") if task.lease_expires_at else ""


def _task_table(tasks: list[Task]) -> Table:
    table = Table(show_edge=False, header_style="bold")
    table.add_column("id", no_wrap=True)
    table.add_column("status", no_wrap=True)
    for column in ("subject", "owner", "attempt", "waiting on"):
        table.add_column(column)
    for t in tasks:
        waits = blocked_reason(t) or (", ".join(t.blocked_by) if t.blocked_by else "")
        table.add_row(
            t.id, status_markup(t), shown(t.subject), shown(t.owner or ""), str(t.attempt), waits
        )
    return table


def _reason_with_hint(task: Task) -> str:
    reason = blocked_reason(task) or ""
    if task.held_by_failed and not task.held_by_cancelled:
        reason += " — `keel tasks reopen ID` puts a failed task back to pending"
    return reason


def _result_label(task: Task) -> str:
    """A failed or cancelled task's ``result`` is why; a completed one's is what came of it."""
    if task.status in (TaskStatus.FAILED, TaskStatus.CANCELLED):
        return f"{task.status.value} because"
    return "result"


def _print_task(task: Task, events: list[TaskEvent] | None = None) -> None:
    console.print(
        f"[bold]{task.id}[/] {status_markup(task)}  {shown(task.subject)}", highlight=False
    )
    if task.description:
        console.print(f"  {shown(task.description)}", highlight=False)
    rows = [
        ("owner", task.owner or ""),
        ("attempt", str(task.attempt)),
        ("lease until", _when(task) if task.status is TaskStatus.IN_PROGRESS else ""),
        ("blocked by", ", ".join(task.blocked_by)),
        ("waiting on", _reason_with_hint(task)),
        (_result_label(task), task.result or ""),
        ("run", task.run_id or ""),
        ("idempotency key", task.idempotency_key or ""),
    ]
    for label, value in rows:
        if value:
            console.print(f"  {label}: {shown(value)}", highlight=False)
    if events is not None:
        console.print("  history:")
        for e in events:
            detail = ", ".join(f"{k}={v}" for k, v in e.data.items() if v not in (None, "", []))
            stamp = e.recorded_at.isoformat(timespec="milliseconds")
            line = f"    {e.seq:>3} {stamp} {e.type} by {shown(e.actor)} {shown(detail)}"
            console.print(line, highlight=False)


@tasks_app.command("create")
@keel_errors
def create(
    subject: str = typer.Argument(..., help="What the task is."),
    description: str = typer.Option("", "--description", help="Longer text for the agent."),
    blocked_by: list[str] = typer.Option([], "--blocked-by", help="A task that must finish first."),
    key: str | None = typer.Option(None, "--key", help="Idempotency key: repeats return the task."),
    isolated: bool = typer.Option(
        False,
        "--isolated",
        help="The run works in an isolated workspace (a git worktree or a copy); its "
        "changes come back as a patch artifact named in the task's result.",
    ),
    owner: str | None = OwnerOption,
    json_out: bool = JsonOption,
    store: str | None = StoreOption,
) -> None:
    """Create a task; prints its id."""
    with opened(store) as s:
        task = s.create_task(
            subject,
            description=description,
            blocked_by=blocked_by,
            actor=owner or default_owner(),
            idempotency_key=key,
            options={"workspace": "isolated"} if isolated else None,
        )
    if json_out:
        print_json(task.to_dict())
    else:
        print(task.id)


@tasks_app.command("block")
@keel_errors
def block(
    task_id: str = typer.Argument(..., metavar="ID", help="The task that must wait."),
    by: list[str] = typer.Option(..., "--by", help="The task it waits for (repeatable)."),
    owner: str | None = OwnerOption,
    json_out: bool = JsonOption,
    store: str | None = StoreOption,
) -> None:
    """Make ID wait for another task (only while ID is pending)."""
    with opened(store) as s:
        task = s.add_dependencies(task_id, by, actor=owner or default_owner())
    if json_out:
        print_json(task.to_dict())
    else:
        console.print(f"{task.id} is blocked by {', '.join(task.blocked_by)}", highlight=False)


@tasks_app.command("list")
@keel_errors
def list_(
    ready: bool = typer.Option(False, "--ready", help="Only tasks a claim may take now."),
    status: TaskStatus | None = typer.Option(None, "--status", help="Only tasks in this status."),
    json_out: bool = JsonOption,
    store: str | None = StoreOption,
) -> None:
    """List tasks, oldest first, naming what holds each pending one."""
    with opened(store) as s:
        tasks = s.list_tasks(status=status, ready=ready)
    if json_out:
        print_json([t.to_dict() for t in tasks])
    elif not tasks:
        err_console.print("no tasks")
    else:
        console.print(_task_table(tasks), highlight=False)


@tasks_app.command("show")
@keel_errors
def show(
    task_id: str = typer.Argument(..., metavar="ID"),
    json_out: bool = JsonOption,
    store: str | None = StoreOption,
) -> None:
    """One task with its whole history."""
    with opened(store) as s:
        task = s.get_task(task_id)
        events = s.task_events(task_id)
    if json_out:
        print_json({"task": task.to_dict(), "events": [e.to_dict() for e in events]})
    else:
        _print_task(task, events)


@tasks_app.command("claim")
@keel_errors
def claim(
    task_id: str | None = typer.Argument(None, metavar="[ID]", help="Default: oldest ready."),
    owner: str | None = OwnerOption,
    lease: float = typer.Option(DEFAULT_LEASE_S, "--lease", help="Lease length in seconds."),
    json_out: bool = JsonOption,
    store: str | None = StoreOption,
) -> None:
    """Claim a task (or the oldest ready one); exits 1 when nothing is ready."""
    with opened(store) as s:
        task = s.claim_task(owner=owner or default_owner(), lease_seconds=lease, task_id=task_id)
    if json_out:
        print_json(task.to_dict() if task else None)
    elif task is None:
        err_console.print("no task is ready to claim")
    else:
        console.print(
            f"{task.id} claimed by {shown(task.owner or '')} (attempt {task.attempt}, lease until "
            f"{_when(task)}): {shown(task.subject)}",
            highlight=False,
        )
    if task is None:
        raise typer.Exit(1)


@tasks_app.command("complete")
@keel_errors
def complete(
    task_id: str = typer.Argument(..., metavar="ID"),
    owner: str | None = OwnerOption,
    result: str | None = typer.Option(None, "--result", help="What came of it."),
    token: str | None = typer.Option(None, "--token", help="Lease token, to fence a stale holder."),
    json_out: bool = JsonOption,
    store: str | None = StoreOption,
) -> None:
    """Complete an owned task; prints the tasks that became ready by it."""
    with opened(store) as s:
        ready = s.complete_task(task_id, owner=owner or default_owner(), token=token, result=result)
    if json_out:
        print_json({"completed": task_id, "now_ready": [t.to_dict() for t in ready]})
        return
    console.print(f"{task_id} completed", highlight=False)
    for t in ready:
        console.print(f"  now ready: {t.id} {shown(t.subject)}", highlight=False)


@tasks_app.command("fail")
@keel_errors
def fail_(
    task_id: str = typer.Argument(..., metavar="ID"),
    reason: str = typer.Option(..., "--reason", help="Why it was given up."),
    owner: str | None = OwnerOption,
    token: str | None = typer.Option(None, "--token", help="Lease token, to fence a stale holder."),
    json_out: bool = JsonOption,
    store: str | None = StoreOption,
) -> None:
    """Fail an owned task; its dependents stay blocked until it is reopened."""
    with opened(store) as s:
        task = s.fail_task(task_id, owner=owner or default_owner(), reason=reason, token=token)
    if json_out:
        print_json(task.to_dict())
    else:
        console.print(f"{task.id} failed: {shown(reason)}", highlight=False)


@tasks_app.command("cancel")
@keel_errors
def cancel(
    task_id: str = typer.Argument(..., metavar="ID"),
    reason: str = typer.Option(..., "--reason", help="Why it will not be done."),
    owner: str | None = OwnerOption,
    json_out: bool = JsonOption,
    store: str | None = StoreOption,
) -> None:
    """Withdraw a task for good; tasks blocked by it say they can never be claimed."""
    with opened(store) as s:
        task = s.cancel_task(task_id, actor=owner or default_owner(), reason=reason)
        stranded = [t for t in s.list_tasks(status=TaskStatus.PENDING) if task.id in t.blocked_by]
    if json_out:
        print_json({"task": task.to_dict(), "blocked_for_good": [t.id for t in stranded]})
        return
    console.print(f"{task.id} cancelled: {shown(reason)}", highlight=False)
    for t in stranded:
        console.print(f"  {t.id} can never be claimed now: {shown(t.subject)}", highlight=False)


@tasks_app.command("reopen")
@keel_errors
def reopen(
    task_id: str = typer.Argument(..., metavar="ID"),
    owner: str | None = OwnerOption,
    json_out: bool = JsonOption,
    store: str | None = StoreOption,
) -> None:
    """Put a failed task back to pending for a new attempt (its history keeps the failure)."""
    with opened(store) as s:
        task = s.reopen_task(task_id, actor=owner or default_owner())
    if json_out:
        print_json(task.to_dict())
    else:
        console.print(f"{task.id} is pending again (attempts so far: {task.attempt})")


@tasks_app.command("graph")
@keel_errors
def graph(
    fmt: GraphFormat = typer.Option(GraphFormat.TEXT, "--format", help="text or mermaid."),
    json_out: bool = JsonOption,
    store: str | None = StoreOption,
) -> None:
    """Draw the dependency graph with statuses in colour (or as Mermaid text)."""
    with opened(store) as s:
        tasks = s.list_tasks()
    if json_out:
        print_json(
            {
                "tasks": [t.to_dict() for t in tasks],
                "edges": [[b, t.id] for t in tasks for b in t.blocked_by],
            }
        )
    elif fmt is GraphFormat.MERMAID:
        print(render_mermaid(tasks))
    else:
        console.print(render_tree(tasks), highlight=False)


def register(app: typer.Typer) -> None:
    """Add the ``tasks`` command group to ``app``."""
    app.add_typer(tasks_app, name="tasks")
