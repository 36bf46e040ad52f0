"""The live view of a run: step, model and tool activity, budget bars, todos, status, and
the model's text as it streams in.

Streamed pieces (``StreamDelta``) arrive on the thread that calls the model; the view
only appends them to a bounded string there, and Rich's refresh thread renders the
tail at its own rate — so a fast stream costs the model call next to nothing. They are
never stored: the turn is recorded whole, once, as ``model_responded``.
"""

from __future__ import annotations

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.panel import Panel
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from keel.cli.common import console
from keel.cli.runs import event_summary, excerpt
from keel.core.budget import Dimension
from keel.core.events import Event, EventType
from keel.core.state import RunState
from keel.core.text import terminal_safe
from keel.models.base import StreamDelta

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
STREAM_SHOWN = 160  # characters of the streaming text shown, its tail
STREAM_KEPT = 4 * STREAM_SHOWN  # characters buffered before the buffer is trimmed
STREAM_FRAME = 8  # columns the panels around the activity take


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

    def __init__(self, target: Console | None = None) -> None:
        self.activity: list[str] = []
        self.state: RunState | None = None
        self.streaming = ""  # the current attempt's text so far (its tail)
        self.stream_kind = "content"
        self.attempt = 0
        self.live = Live(
            console=target or console,
            refresh_per_second=8,
            transient=False,
            get_renderable=self.render,
        )

    def __enter__(self) -> LiveView:
        self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.live.__exit__(None, None, None)

    def on_event(self, event: Event, state: RunState) -> None:
        line = describe_event(event)
        if line:
            self.activity = [*self.activity, f"#{event.seq} {line}"][-ACTIVITY_LINES:]
        if event.type is EventType.MODEL_RESPONDED:
            self.streaming, self.attempt = "", 0  # the turn is on record now
        self.state = state
        if self.live.is_started:
            self.live.refresh()

    def on_delta(self, delta: StreamDelta) -> None:
        """Keep the tail of the current attempt's text of one kind; a new attempt starts
        afresh (a stream cut mid-answer is retried whole, so its text was never the answer)."""
        if delta.attempt > self.attempt:
            self.streaming, self.attempt = "", delta.attempt
        if delta.kind != self.stream_kind:  # thinking done, the answer starts: show it alone
            self.streaming, self.stream_kind = "", delta.kind
        piece = f" [{delta.name}] {delta.text}" if delta.name else delta.text
        text = self.streaming + piece
        self.streaming = text if len(text) <= STREAM_KEPT else text[-STREAM_SHOWN:]

    def stream_line(self) -> str | None:
        """``model: …`` with the tail of the streaming text on one line of the console (at
        most ``STREAM_SHOWN`` characters of it), or None when nothing streams."""
        text = excerpt(self.streaming, len(self.streaming) + 1)  # escapes and all, flattened
        if not text:
            return None
        label = {"reasoning": "model (thinking)", "tool_call": "model (calling)"}
        label_text = f"{label.get(self.stream_kind, 'model')}: "
        room = min(STREAM_SHOWN, self.live.console.width - len(label_text) - STREAM_FRAME)
        room = max(room, 20)
        if len(text) > room:
            text = "…" + text[-(room - 1) :]
        return label_text + text

    def render(self) -> RenderableType:
        state = self.state
        if state is None:  # nothing stored yet: a fresh run's first turn may be streaming
            streaming = self.stream_line()
            return Text("starting…" + (f"\n{streaming}" if streaming else ""))
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
            todos.append(f"{mark} {terminal_safe(todo.content)}\n")
        parts: list[RenderableType] = [head, budget]
        if state.todos:
            parts.append(Panel(todos, title="todos", expand=True))
        activity = Text("\n".join(self.activity))
        streaming = self.stream_line()
        if streaming:
            activity.append(("\n" if self.activity else "") + streaming, style="italic")
        parts.append(Panel(activity, title="activity", expand=True))
        return Panel(Group(*parts), title=f"keel run {state.run_id}")
