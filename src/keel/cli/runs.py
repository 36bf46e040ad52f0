"""``keel runs``, ``keel show`` and ``keel events``: read-only views of the run store.

These commands never create a database: a missing file is reported, not made. A run
whose event log is damaged (``LogDamaged``: an event missing, out of place or not what
its hash says) makes ``show`` and ``events`` exit 2 with one line naming the event;
``runs`` lists it marked ``damaged`` among the others.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
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
from keel.cli.display import amount, compact, excerpt, short_time, styled_status
from keel.cli.stats import run_figure_lines, run_figures
from keel.cli.tree import (
    build_tree,
    child_facts,
    children_entries,
    describe_children,
    describe_lineage,
    describe_waiting,
    finish_summary,
    note_children_damage,
    run_summary,
    spawn_summary,
    top_level_runs,
    tree_json,
    tree_table,
    wait_facts,
    waiting_descendants,
    waiting_entry,
)
from keel.core.budget import MAX_COUNT, Dimension, Usage
from keel.core.errors import LogDamaged, RunNotFound
from keel.core.events import Event, EventType
from keel.core.state import RunState
from keel.core.status import RunStatus
from keel.core.tags import has_tags, parse_tag_filter
from keel.core.verifiers import evidence_map
from keel.store.base import Store, iter_all_events
from keel.store.url import open_store

FOLLOW_POLL_S = 1.0


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
    tag: list[str] = typer.Option(
        [], "--tag", help="Only runs tagged KEY=VALUE (repeatable: every one must match)."
    ),
    tree: bool = typer.Option(
        False,
        "--tree",
        help="Top-level runs with their subagents indented below them (--status and "
        "--limit choose the top-level runs; --json nests them under `children`).",
    ),
    as_json: bool = JsonOption,
    store: str | None = StoreOption,
) -> None:
    """List runs, newest first (a run whose event log is damaged is marked so)."""
    if tree and tag:
        fail("--tag does not combine with --tree: list the tagged runs, then show one")
    if tree:
        runs_tree(status, limit, as_json, store)
        return
    with reading(store) as st:
        runs = (
            tagged_runs(st, status, limit, tag)
            if tag
            else st.survey_runs(status=status, limit=limit)
        )
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
    note_damaged(runs)


def tagged_runs(
    st: Store, status: RunStatus | None, limit: int, tags: Sequence[str]
) -> list[RunState | LogDamaged]:
    """The newest ``limit`` runs carrying every tag (``KEY=VALUE``); every run is read, as
    tags live in the options (a run whose log is damaged cannot show its tags: left out)."""
    wanted = dict(parse_tag_filter(text) for text in tags)
    every = st.survey_runs(status=status, limit=MAX_COUNT)
    found = [r for r in every if isinstance(r, RunState) and has_tags(r.options.tags, wanted)]
    return list(found[:limit])


def runs_tree(status: RunStatus | None, limit: int, as_json: bool, store: str | None) -> None:
    """``keel runs --tree``: each top-level run with its descendants."""
    with reading(store) as st:
        tops = top_level_runs(st, status=status, limit=limit)
        roots = [r if isinstance(r, LogDamaged) else build_tree(st, r) for r in tops]
    if as_json:
        print_json([tree_json(root) for root in roots])
        return
    if not roots:
        console.print("no runs" + (f" with status {status.value}" if status else ""))
        return
    console.print(tree_table(roots))
    for root in roots:
        if not isinstance(root, LogDamaged):
            note_children_damage(root)
    note_damaged(tops)


def note_damaged(runs: list[RunState | LogDamaged]) -> None:
    damaged = [r.run_id for r in runs if isinstance(r, LogDamaged)]
    if damaged:
        err_console.print(
            f"{len(damaged)} run(s) with a damaged event log: `keel verify --all` names "
            "the first bad event of each",
            highlight=False,
            soft_wrap=True,
        )


# --- keel show -----------------------------------------------------------------------


@keel_errors
def show_command(
    run_id: str = typer.Argument(..., help="The run to show."),
    as_json: bool = JsonOption,
    store: str | None = StoreOption,
) -> None:
    """Show one run: status, budget, todos, files, validations, what it waits for, its
    children and the descendants that wait for a person."""
    store_flag = answer_store_flag(store)
    with reading(store) as st:
        run = st.load_run(run_id)
        node = build_tree(st, run)
        facts = child_facts(iter_all_events(st, run_id)) if node.children or run.children else {}
        figures = st.run_stats(run_id=run_id)
    entries = children_entries(run, node, facts)
    waiting = waiting_descendants(node)
    if as_json:
        print_json(
            {
                **run.to_dict(),
                "tokens": token_summary(run.usage),
                "evidence": evidence_map(run.result),
                "children": entries,
                "waiting_descendants": [waiting_entry(w, store_flag) for w in waiting],
                "figures": run_figures(figures),
            }
        )
        return
    family = describe_children(entries)
    for line in describe_run(run, store_flag=store_flag, family=family):
        console.print(line, highlight=False)
    for line in run_figure_lines(figures):
        console.print(line, highlight=False)
    for line in describe_waiting(waiting, store_flag):
        console.print(line, highlight=False)
    note_children_damage(node)


def describe_run(run: RunState, *, store_flag: str = "", family: Sequence[str] = ()) -> list[str]:
    """The human view of ``run`` as rich-markup lines (``family``: its children's lines,
    shown before what the run waits for)."""
    lines = [f"[bold]{run.run_id}[/]  {styled_status(run.status)}"]
    if run.reason:
        lines.append(f"  reason     {shown(run.reason)}")
    lines.append(f"  goal       {shown(run.goal)}")
    lines.append(f"  workspace  {shown(run.workspace)}")
    lines += describe_lineage(run)
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
    lines += family
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
    if result.get("outcome"):
        lines.append(f"  outcome   {shown(str(result['outcome']))}")
    for name, ref in evidence_map(result).items():
        lines.append(f"  evidence  {shown(name)}: {ref}")
    for action in result.get("remaining_actions") or ():
        lines.append(f"  left      {shown(str(action))}")
    shown_keys = ("summary", "evidence", "outcome", "remaining_actions")
    rest = {k: v for k, v in result.items() if k not in shown_keys}
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
    if pending is not None and pending.kind in ("child", "child_failure", "signoff"):
        what, commands = wait_facts(run, store_flag)
        lines.append(f"  {shown(what)}")
        lines += [f"  {label + ':':<9} {shown(command)}" for label, command in commands]
        child = (pending.arguments or {}).get("child_run_id")
        if pending.kind == "child" and child:
            lines.append(f"  see:      keel show {shown(str(child))}{store_flag}")
        return lines
    if pending is not None and pending.kind == "plan":
        arguments = pending.arguments or {}
        lines.append(f"  approval of the plan (plan_exit, call {pending.call_id})")
        lines.append(f"  summary   {shown(str(arguments.get('summary', '')))}")
        plan = str(arguments.get("plan") or "").strip().splitlines()
        lines += ["  plan"] + [f"    {shown(text)}" for text in plan]
    elif pending is not None:
        words = {"approval": "approval", "unknown_outcome": "a decision on an interrupted call"}
        kind = words.get(pending.kind, f"a decision ({pending.kind})")
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
    if kind is EventType.SUBAGENT_SPAWNED:
        return spawn_summary(d)
    if kind is EventType.SUBAGENT_FINISHED:
        return finish_summary(d)
    if kind is EventType.WAITING_ON_CHILD:
        what = f" for {excerpt(str(d['what']))}" if d.get("what") else ""
        return f"child {d.get('child_run_id', '?')} waits{what}"
    if kind is EventType.HANDED_OFF:
        note = f": {excerpt(str(d['note']), 70)}" if d.get("note") else ""
        return f"to {d.get('run_id', '?')} ({d.get('agent', '?')}){note}"
    return excerpt(compact(d))
