"""The live view of a run: step, model and tool activity, budget bars, todos, status."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.live import Live
from rich.panel import Panel
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from keel.cli.common import console
from keel.cli.runs import event_summary
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


# Bookkeeping events the live view leaves out (`keel events` shows every event).
QUIET = frozenset(
    {
        EventType.RUN_CREATED,
        EventType.RUN_RESUMED,
        EventType.MODEL_REQUESTED,
        EventType.TOOL_STARTED,
        EventType.VERIFICATION_STARTED,
        EventType.TODO_UPDATED,
        EventType.APPROVAL_GRANTED,
        EventType.INPUT_RECEIVED,
        EventType.CALL_RECONCILED,
    }
)


def describe_event(event: Event) -> str | None:
    """One human line for an event (as `keel events` words it), or None for bookkeeping."""
    if event.type in QUIET:
        return None
    return f"{event.type.value.replace('_', ' ')}: {event_summary(event)}"


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
