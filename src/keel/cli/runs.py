"""``keel runs``, ``keel show`` and ``keel events``: read-only views of the run store.

These commands never create a database: a missing file is reported, not made. A run
whose event log is damaged (``LogDamaged``: an event missing, out of place or not what
its hash says) makes ``show`` and ``events`` exit 2 with one line naming the event;
``runs`` lists it marked ``damaged`` among the others.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import typer
from rich.table import Table

from keel.cli.common import (
    DEFAULT_STORE,
    JsonOption,
    StoreOption,
    console,
    err_console,
    fail,
    keel_errors,
    print_json,
    shown,
    store_url,
)
from keel.core.budget import Dimension, Usage
from keel.core.errors import LogDamaged, RunNotFound
from keel.core.events import Event, EventType
from keel.core.state import RunState
from keel.core.status import RunStatus
from keel.core.text import printable
from keel.store.base import Store
from keel.store.url import open_store

FOLLOW_POLL_S = 1.0
EXCERPT = 90

STATUS_STYLE = {
    RunStatus.QUEUED: "dim",
    RunStatus.RUNNING: "cyan",
    RunStatus.WAITING: "yellow",
    RunStatus.PAUSED: "yellow",
    RunStatus.VERIFYING: "blue",
    RunStatus.COMPLETED: "green",
    RunStatus.FAILED: "red",
    RunStatus.BLOCKED: "red",
    RunStatus.CANCELLED: "magenta",
}


def register(app: typer.Typer) -> None:
    """Add this module's commands to ``app``."""
    app.command("runs")(runs_command)
    app.command("show")(show_command)
    app.command("events")(events_command)


@contextmanager
def reading(url: str | None) -> Iterator[Store]:
    """The existing store at ``url``; an unknown run id is reported with the store's URL."""
    store = open_store(store_url(url), must_exist=True)
    try:
        yield store
    except RunNotFound as exc:
        fail(f"{exc} (store {store.url})")
    finally:
        store.close()


# --- keel runs -----------------------------------------------------------------------


@keel_errors
def runs_command(
    status: RunStatus | None = typer.Option(
        None, "--status", case_sensitive=False, help="Only runs in this status."
    ),
    limit: int = typer.Option(100, "--limit", min=1, help="At most this many runs."),
    as_json: bool = JsonOption,
    store: str | None = StoreOption,
) -> None:
    """List runs, newest first (a run whose event log is damaged is marked so)."""
    with reading(store) as st:
        runs = st.survey_runs(status=status, limit=limit)
    if as_json:
        print_json([run_summary(r) for r in runs])
        return
    if not runs:
        console.print("no runs" + (f" with status {status.value}" if status else ""))
        return
    table = Table(box=None, header_style="bold")
    for column in ("RUN", "STATUS", "STEPS", "UPDATED"):
        table.add_column(column, no_wrap=True)
    table.add_column("GOAL", overflow="fold", min_width=16)
    table.add_column("REASON", overflow="fold", min_width=12)
    for run in runs:
        if isinstance(run, LogDamaged):
            damage = f"event log damaged at seq {run.seq}: {run.detail}"
            table.add_row(run.run_id, "[bold red]damaged[/]", "-", "-", "-", shown(damage))
            continue
        table.add_row(
            run.run_id,
            styled_status(run.status),
            str(run.usage.steps),
            short_time(run.updated_at),
            shown(excerpt(run.goal, 60)),
            shown(excerpt(run.reason or "", 60)),
        )
    console.print(table)
    damaged = [r.run_id for r in runs if isinstance(r, LogDamaged)]
    if damaged:
        err_console.print(
            f"{len(damaged)} run(s) with a damaged event log: `keel verify --all` names "
            "the first bad event of each",
            highlight=False,
            soft_wrap=True,
        )


def run_summary(run: RunState | LogDamaged) -> dict[str, Any]:
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


# --- keel show -----------------------------------------------------------------------


@keel_errors
def show_command(
    run_id: str = typer.Argument(..., help="The run to show."),
    as_json: bool = JsonOption,
    store: str | None = StoreOption,
) -> None:
    """Show one run: status, budget, todos, files, validations and what it waits for."""
    with reading(store) as st:
        run = st.load_run(run_id)
    if as_json:
        print_json({**run.to_dict(), "tokens": token_summary(run.usage)})
        return
    for line in describe_run(run, store_flag=answer_store_flag(store)):
        console.print(line, highlight=False)


def describe_run(run: RunState, *, store_flag: str = "") -> list[str]:
    """The human view of ``run`` as rich-markup lines."""
    lines = [f"[bold]{run.run_id}[/]  {styled_status(run.status)}"]
    if run.reason:
        lines.append(f"  reason     {shown(run.reason)}")
    lines.append(f"  goal       {shown(run.goal)}")
    lines.append(f"  workspace  {shown(run.workspace)}")
    if run.parent_id:
        lines.append(f"  parent     {run.parent_id}")
    if run.task_id:
        lines.append(f"  task       {run.task_id}")
    lines.append(f"  mode       {run.mode}   model {shown(run.options.model or '-')}")
    lines.append("[bold]budget[/]")
    budget = run.options.budget
    for dim in Dimension:
        used = run.usage.used(dim)
        limit = budget.limit(dim)
        lines.append(f"  {dim.value:<11}{amount(dim, used)} / {amount(dim, limit)}")
    lines.append("[bold]tokens[/]")
    lines += describe_tokens(run.usage)
    if run.todos:
        lines.append("[bold]todos[/]")
        marks = {"completed": "[green]✓[/]", "in_progress": "[cyan]…[/]"}
        lines += [f"  {marks.get(t.status, '·')} {shown(t.content)}" for t in run.todos]
    if run.changed_files:
        lines.append(f"[bold]changed files[/] (revision {run.mutation_revision})")
        lines += [f"  {shown(p)}  {h[:12]}" for p, h in sorted(run.changed_files.items())]
    if run.validations:
        lines.append("[bold]validations[/]")
        for v in run.validations:
            mark = "[green]passed[/]" if v.passed else f"[red]exit {v.exit_code}[/]"
            lines.append(
                f"  {mark}  {shown(v.command)}  rev {v.mutation_revision}  "
                f"{v.duration_s:.1f}s  {v.artifact or '-'}"
            )
    if run.approved_plan_sha256:
        lines.append("[bold]plan[/]")
        lines.append(f"  approved   sha256 {run.approved_plan_sha256[:16]}")
        if run.plan_paths is not None:
            named = ", ".join(run.plan_paths) or "none (the plan changes no files)"
            lines.append(f"  paths      {shown(named)}")
    if run.grants:
        lines.append("[bold]unused approvals[/]")
        for grant in run.grants.values():
            expiry = f"expires {grant.expires_at}" if grant.expires_at else "no expiry recorded"
            lines.append(f"  {shown(grant.tool or '?')} (call {grant.call_id})  {expiry}")
    if run.verification_gaps() and not run.status.terminal:
        lines.append("[bold]verification gaps[/]")
        lines += [f"  {shown(gap)}" for gap in run.verification_gaps()]
    if run.result:
        lines.append("[bold]result[/]")
        lines += describe_result(run.result)
    if run.status is RunStatus.WAITING:
        lines += describe_wait(run, store_flag)
    return lines


def token_summary(usage: Usage) -> dict[str, Any]:
    """Tokens by kind and the cache-hit ratio (cached / input; None before any input)."""
    ratio = usage.cache_hit_ratio
    return {
        "input": usage.input_tokens,
        "cached_input": usage.cached_input_tokens,
        "output": usage.output_tokens,
        "reasoning": usage.reasoning_tokens,
        "cache_hit_ratio": None if ratio is None else round(ratio, 4),
    }


def describe_tokens(usage: Usage) -> list[str]:
    """The run's tokens by kind, as ``keel show`` prints them."""
    ratio = usage.cache_hit_ratio
    hits = "-" if ratio is None else f"{ratio:.1%}"
    return [
        f"  input      {usage.input_tokens}  (cached {usage.cached_input_tokens}, "
        f"cache hits {hits})",
        f"  output     {usage.output_tokens}  (reasoning {usage.reasoning_tokens})",
    ]


def describe_result(result: dict[str, Any]) -> list[str]:
    lines = []
    summary = result.get("summary")
    if summary:
        lines.append(f"  {shown(str(summary))}")
    evidence = result.get("evidence") or []
    for item in evidence:
        lines.append(f"  evidence  {shown(item if isinstance(item, str) else compact(item))}")
    rest = {k: v for k, v in result.items() if k not in ("summary", "evidence")}
    if rest:
        lines.append(f"  {shown(compact(rest))}")
    return lines


def answer_store_flag(store: str | None) -> str:
    """`` --store URL`` when the store is not the default one, so a printed command works."""
    url = store_url(store)
    return "" if url == DEFAULT_STORE else f" --store {url}"


def describe_wait(run: RunState, store_flag: str) -> list[str]:
    """What a waiting run waits for, and the exact command that answers it."""
    rid = run.run_id
    pending = run.pending
    lines = ["[bold yellow]waiting for[/]"]
    if pending is not None and pending.kind == "question":
        lines.append(f"  the answer to: {shown(pending.question or '')}")
        lines.append(f"  answer:   keel answer {rid} TEXT{store_flag}")
        return lines
    if pending is not None and pending.kind == "plan":
        arguments = pending.arguments or {}
        lines.append(f"  approval of the plan (plan_exit, call {pending.call_id})")
        lines.append(f"  summary   {shown(str(arguments.get('summary', '')))}")
        plan = str(arguments.get("plan") or "").strip().splitlines()
        lines += ["  plan"] + [f"    {shown(text)}" for text in plan]
    elif pending is not None:
        what = {"approval": "approval", "unknown_outcome": "a decision on an interrupted call"}
        kind = what.get(pending.kind, f"a decision ({pending.kind})")
        lines.append(f"  {kind} of {shown(pending.tool or '?')} (call {pending.call_id})")
        lines.append(f"  arguments {shown(compact(pending.arguments or {}))}")
    if pending is not None:
        if pending.risk:
            lines.append(f"  risk      {shown(pending.risk)}")
        if pending.expires_at:
            lines.append(f"  expires   {pending.expires_at}")
    else:
        lines.append(f"  {shown(run.reason or 'a person')}")
    lines.append(f"  approve:  keel approve {rid}{store_flag}")
    lines.append(f"  deny:     keel approve {rid} --deny --reason TEXT{store_flag}")
    return lines


# --- keel events ---------------------------------------------------------------------


@keel_errors
def events_command(
    run_id: str = typer.Argument(..., help="The run whose events to print."),
    after: int = typer.Option(0, "--after", min=0, help="Only events after this sequence."),
    follow: bool = typer.Option(
        False, "--follow", "-f", help="Keep printing new events until the run ends."
    ),
    as_json: bool = JsonOption,
    store: str | None = StoreOption,
) -> None:
    """Print a run's events as a timeline (--json: one JSON object per line)."""
    emit: Callable[[Event], None] = emit_json if as_json else emit_line
    with reading(store) as st:
        if not follow:
            for event in st.read_events(run_id, after=after):
                emit(event)
            return
        try:
            follow_events(st, run_id, after, emit)
        except KeyboardInterrupt:
            raise typer.Exit(130) from None


def follow_events(store: Store, run_id: str, after: int, emit: Callable[[Event], None]) -> None:
    """Print events as they arrive; return once the run is terminal and fully printed."""
    while True:
        state = store.load_run(run_id)
        for event in store.read_events(run_id, after=after):
            emit(event)
            after = event.seq
        if state.status.terminal and after >= state.last_seq:
            return
        store.wait_for_events(run_id, after=after, timeout=FOLLOW_POLL_S)


def emit_json(event: Event) -> None:
    print_json(event.to_dict())


def emit_line(event: Event) -> None:
    stamp = event.recorded_at.strftime("%H:%M:%S.%f")[:-3]
    console.print(
        f"{event.seq:>5}  [dim]{stamp}[/]  [bold]{event.type.value:<20}[/] "
        f"{shown(event_summary(event))}",
        highlight=False,
        soft_wrap=True,
    )


def event_summary(event: Event) -> str:
    """One line saying what the event changed."""
    d = event.data
    kind = event.type
    if kind is EventType.RUN_CREATED:
        return f"{excerpt(d.get('goal', ''))} (in {d.get('workspace', '')})"
    if kind is EventType.STATUS_CHANGED:
        reason = f": {d['reason']}" if d.get("reason") else ""
        return f"{d.get('from', '?')} → {d.get('to', '?')}{reason}"
    if kind is EventType.MODEL_RESPONDED:
        usage = d.get("usage") or {}
        tokens = int(usage.get("input_tokens", 0)) + int(usage.get("output_tokens", 0))
        calls = [c.get("name", "?") for c in d.get("tool_calls") or [] if isinstance(c, dict)]
        said = excerpt(str(d.get("content") or ""), 50)
        parts = [f"{tokens} tokens", *([f"calls {', '.join(calls)}"] if calls else [])]
        finish = d.get("finish_reason")
        if finish not in (None, "stop", "tool_calls"):
            parts.append(f"finish {finish}")  # cut at the length limit, or refused
        if d.get("provider_finish_reason"):
            parts.append(f"provider said {d['provider_finish_reason']}")
        return "; ".join(parts) + (f" — {said}" if said else "")
    if kind in (EventType.TOOL_STARTED, EventType.APPROVAL_REQUESTED):
        return f"{d.get('tool', '?')} {excerpt(compact(d.get('arguments', {})))}"
    if kind in (EventType.TOOL_FINISHED, EventType.TOOL_FAILED):
        changed = sorted((d.get("changed_files") or {}).keys())
        tail = f" changed {', '.join(changed)}" if changed else ""
        message = f" {excerpt(str(d['message']))}" if d.get("message") else ""
        return f"{d.get('tool', '?')} ({d.get('call_id', '?')}){message}{tail}"
    if kind is EventType.INPUT_REQUESTED:
        return excerpt(str(d.get("question", "")))
    if kind is EventType.INPUT_RECEIVED:
        return excerpt(str(d.get("answer", "")))
    if kind in (EventType.VERIFICATION_PASSED, EventType.VERIFICATION_FAILED):
        records = d.get("records") or []
        return ", ".join(
            f"{r.get('command')} exit {r.get('exit_code')}" for r in records if isinstance(r, dict)
        )
    if kind is EventType.NOTE_ADDED:
        return excerpt(str(d.get("text", "")))
    return excerpt(compact(d))


# --- formatting ----------------------------------------------------------------------


def styled_status(status: RunStatus) -> str:
    return f"[{STATUS_STYLE[status]}]{status.value}[/]"


def amount(dim: Dimension, value: float | None) -> str:
    if value is None:
        return "∞"
    if dim is Dimension.COST:
        return f"${value:.4f}"
    if dim is Dimension.WALL_TIME:
        return f"{value:.1f}s"
    return str(int(value))


def short_time(iso: str | None) -> str:
    return iso[5:19].replace("T", " ") if iso else "-"


def compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "), default=str)


def excerpt(text: str, width: int = EXCERPT) -> str:
    """`text` on one line of at most `width` characters, with no control character left
    (a model's text must not reach the terminal as an escape sequence)."""
    flat = " ".join(printable(text, limit=len(text) + 1).split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"
