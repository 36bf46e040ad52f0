"""The live view of a run: step, model and tool activity, budget bars, todos, status."""

from __future__ import annotations

from typing import Any

from rich.console import Group, RenderableType
from rich.live import Live
from rich.panel import Panel
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from keel.cli.common import console
from keel.core.budget import Dimension
from keel.core.events import Event, EventType
from keel.core.state import RunState

STATUS_STYLE = {
    "running": "cyan",
    "verifying": "magenta",
    "waiting": "yellow",
    "completed": "green",
    "failed": "red",
    "blocked": "red",
    "cancelled": "dim",
    "queued": "blue",
    "paused": "blue",
}
ACTIVITY_LINES = 8


def describe_event(event: Event) -> str | None:
    """One human line for an event, or None for bookkeeping events."""
    d: dict[str, Any] = event.data
    t = event.type
    if t is EventType.MODEL_RESPONDED:
        calls = ", ".join(c["name"] for c in d.get("tool_calls", ()))
        said = (d.get("content") or "").strip().replace("\n", " ")
        return f"model: {'calls ' + calls if calls else said[:100] or '(empty)'}"
    if t is EventType.TOOL_FINISHED:
        return f"tool {d.get('tool')}: ok {_args(d.get('arguments'))}"
    if t is EventType.TOOL_FAILED:
        return f"tool {d.get('tool')}: {d.get('error_kind')}: {str(d.get('message'))[:120]}"
    if t is EventType.STATUS_CHANGED:
        reason = f" ({d['reason']})" if d.get("reason") else ""
        return f"status {d.get('from')} -> {d.get('to')}{reason}"
    if t is EventType.VERIFICATION_PASSED:
        return "verification passed"
    if t is EventType.VERIFICATION_FAILED:
        return "verification failed: " + "; ".join(d.get("gaps", ()))
    if t is EventType.APPROVAL_REQUESTED:
        return f"waiting for approval: {d.get('tool')} {_args(d.get('arguments'))}"
    if t is EventType.INPUT_REQUESTED:
        return f"question: {d.get('question')}"
    if t is EventType.RETRY_SCHEDULED:
        return f"provider error, retry {d.get('attempt')} in {d.get('wait_seconds', 0):.1f}s"
    if t in (EventType.BUDGET_WARNING, EventType.BUDGET_EXHAUSTED, EventType.NO_PROGRESS_DETECTED):
        return f"{t.value.replace('_', ' ')}: {d.get('dimension') or d.get('what')}"
    if t is EventType.NOTE_ADDED:
        return f"harness note: {str(d.get('text', '')).splitlines()[0][:100]}"
    return None


def _args(arguments: Any) -> str:
    text = str(arguments)
    return text if len(text) <= 80 else text[:77] + "..."


class LiveView:
    """A rich Live panel fed with each stored event."""

    def __init__(self) -> None:
        self.activity: list[str] = []
        self.state: RunState | None = None
        self.live = Live(console=console, refresh_per_second=8, transient=False)

    def __enter__(self) -> LiveView:
        self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.live.__exit__(None, None, None)

    def on_event(self, event: Event, state: RunState) -> None:
        line = describe_event(event)
        if line:
            self.activity = [*self.activity, f"#{event.seq} {line}"][-ACTIVITY_LINES:]
        self.state = state
        self.live.update(self.render())

    def render(self) -> RenderableType:
        state = self.state
        if state is None:
            return Text("starting…")
        style = STATUS_STYLE.get(state.status.value, "white")
        head = Text.assemble(
            ("status ", "bold"),
            (state.status.value, f"bold {style}"),
            (f"  step {state.usage.steps}  tool calls {state.usage.tool_calls}", ""),
            (f"  {state.reason}" if state.reason else "", "dim"),
        )
        budget = Table.grid(padding=(0, 1))
        limits = state.options.budget
        for dim in Dimension:
            limit = limits.limit(dim)
            if limit is None:
                continue
            used = state.usage.used(dim)
            budget.add_row(
                dim.value.replace("_", " "),
                ProgressBar(total=float(limit), completed=min(float(used), float(limit)), width=30),
                f"{used:g}/{limit:g}",
            )
        todos = Text()
        for todo in state.todos:
            mark = {"completed": "✔", "in_progress": "▶"}.get(todo.status, "·")
            todos.append(f"{mark} {todo.content}\n")
        parts: list[RenderableType] = [head, budget]
        if state.todos:
            parts.append(Panel(todos, title="todos", expand=True))
        parts.append(Panel(Text("\n".join(self.activity)), title="activity", expand=True))
        return Panel(Group(*parts), title=f"keel run {state.run_id}")
