"""The live view of a run: step, model and tool activity, budget bars, todos, status, and
the model's text as it streams in.

Streamed pieces (``StreamDelta``) arrive on the thread that calls the model; the view
only appends them to a bounded string there, and Rich's refresh thread renders the
tail at its own rate — so a fast stream costs the model call next to nothing. They are
never stored: the turn is recorded whole, once, as ``model_responded``.

A run that delegates gets one line per live child (agent, run id, status, steps). The
parent's state says which children live; their status and steps are read from the
store only when the parent records a spawn or a finish (and once when the view meets
a parent that already has live children), never per event. A child's own events, if
the harness passes them to the same view, update its line at no cost.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.panel import Panel
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from keel.cli.common import console
from keel.cli.display import excerpt
from keel.cli.runs import event_summary
from keel.core.budget import Dimension
from keel.core.errors import KeelError
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
CHILD_EVENTS = frozenset(
    {EventType.SUBAGENT_SPAWNED, EventType.SUBAGENT_FINISHED, EventType.WAITING_ON_CHILD}
)

ChildRuns = Callable[[str], Sequence[RunState]]  # Store.child_runs


@dataclass(frozen=True, slots=True)
class ChildProgress:
    """What the view last learnt of one child: its status and the steps it used."""

    status: str
    steps: int | None = None


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
        EventType.TRACE_STARTED,
    }
)


def describe_event(event: Event) -> str | None:
    """One human line for an event (as `keel events` words it), or None for bookkeeping."""
    if event.type in QUIET:
        return None
    return f"{event.type.value.replace('_', ' ')}: {event_summary(event)}"


class LiveView:
    """A rich Live panel fed with each stored event.

    ``run_id`` is the run watched (default: the run of the first event); events of any
    other run are taken as a child's own. ``child_runs`` (``Store.child_runs``, called
    on the thread that feeds events) gives the children's status and steps.
    """

    def __init__(
        self,
        target: Console | None = None,
        *,
        run_id: str | None = None,
        child_runs: ChildRuns | None = None,
    ) -> None:
        self.run_id = run_id
        self.child_runs = child_runs
        self.progress: dict[str, ChildProgress] = {}  # by child run id; replaced, not mutated
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
        if self.run_id is None:
            self.run_id = state.run_id
        if state.run_id != self.run_id:  # a child's own event: its line, nothing else
            self.progress = {**self.progress, state.run_id: _progress_of(state)}
            self._refresh()
            return
        line = describe_event(event)
        if line:
            self.activity = [*self.activity, f"#{event.seq} {line}"][-ACTIVITY_LINES:]
        if event.type is EventType.MODEL_RESPONDED:
            self.streaming, self.attempt = "", 0  # the turn is on record now
        first = self.state is None
        self.state = state
        if event.type is EventType.WAITING_ON_CHILD:
            child = str(event.data.get("child_run_id", ""))
            steps = self.progress.get(child, ChildProgress(status="waiting")).steps
            self.progress = {**self.progress, child: ChildProgress(status="waiting", steps=steps)}
        elif event.type in CHILD_EVENTS or (first and self.live_children()):
            self.read_children()
        self._refresh()

    def _refresh(self) -> None:
        if self.live.is_started:
            self.live.refresh()

    def live_children(self) -> list[str]:
        """The watched run's live children, in the order they were spawned."""
        state = self.state
        if state is None:
            return []
        return [child for child, record in state.children.items() if record.live]

    def read_children(self) -> None:
        """The status and steps of the live children, from the store (one query). A
        failed read keeps what the view knew: the view never stops a run."""
        if self.child_runs is None or self.run_id is None:
            return
        try:
            found = self.child_runs(self.run_id)
        except KeelError:
            return
        live = set(self.live_children())
        known = {c.run_id: _progress_of(c) for c in found if c.run_id in live}
        self.progress = {**self.progress, **known}

    def children_lines(self) -> list[str]:
        """One line per live child: ``▸ agent  run id  status  step N``."""
        state = self.state
        if state is None:
            return []
        lines = []
        for child in self.live_children():
            record = state.children[child]
            seen = self.progress.get(child, ChildProgress(status="queued"))
            steps = f"  step {seen.steps}" if seen.steps is not None else ""
            where = "  (background)" if record.background else ""
            line = f"▸ {record.agent or '?'}  {child}  {seen.status}{steps}{where}"
            lines.append(terminal_safe(line))
        return lines

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
        children = self.children_lines()
        if children:
            parts.append(Panel(Text("\n".join(children)), title="children", expand=True))
        if state.todos:
            parts.append(Panel(todos, title="todos", expand=True))
        activity = Text("\n".join(self.activity))
        streaming = self.stream_line()
        if streaming:
            activity.append(("\n" if self.activity else "") + streaming, style="italic")
        parts.append(Panel(activity, title="activity", expand=True))
        return Panel(Group(*parts), title=f"keel run {state.run_id}")


def _progress_of(state: RunState) -> ChildProgress:
    return ChildProgress(status=state.status.value, steps=state.usage.steps)
