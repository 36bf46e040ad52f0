"""Drawing the task graph: a coloured tree for the terminal and Mermaid text.

Work flows from a blocker to its dependents, so the tree starts at tasks with no
blockers and hangs each dependent under every blocker it waits for; a task drawn
before is shown again only by id (``↑ shown above``), so the tree stays finite and
every edge stays visible.
"""

from __future__ import annotations

from rich.tree import Tree

from keel.cli.common import shown
from keel.core.tasks import Task, TaskStatus, blocked_reason

STATUS_STYLE = {
    TaskStatus.PENDING: "yellow",
    TaskStatus.IN_PROGRESS: "bold blue",
    TaskStatus.COMPLETED: "green",
    TaskStatus.FAILED: "bold red",
    TaskStatus.CANCELLED: "dim",
}
READY_STYLE = "bold cyan"
MERMAID_FILL = {
    "pending": "#fff3c4",
    "ready": "#c4f1ff",
    "in_progress": "#c4d7ff",
    "completed": "#c8f7c5",
    "failed": "#ffc4c4",
    "cancelled": "#e0e0e0",
}


def status_label(task: Task) -> str:
    """``ready`` for a pending task nothing holds, else the status itself."""
    return "ready" if task.ready else task.status.value


def status_markup(task: Task) -> str:
    style = READY_STYLE if task.ready else STATUS_STYLE[task.status]
    return f"[{style}]{status_label(task)}[/]"


def _node_label(task: Task) -> str:
    parts = [f"{status_markup(task)} [bold]{task.id}[/] {shown(task.subject)}"]
    if task.owner and task.status is TaskStatus.IN_PROGRESS:
        parts.append(f"[dim]({shown(task.owner)})[/]")
    reason = blocked_reason(task)
    if reason:
        parts.append(f"[dim]— {shown(reason)}[/]")
    return " ".join(parts)


def dependents_of(tasks: list[Task]) -> dict[str, list[str]]:
    """For each task id, the ids of the tasks it blocks (in creation order)."""
    out: dict[str, list[str]] = {t.id: [] for t in tasks}
    for task in tasks:
        for blocker in task.blocked_by:
            out.setdefault(blocker, []).append(task.id)
    return out


def render_tree(tasks: list[Task]) -> Tree:
    """A rich Tree of the whole graph, statuses in colour."""
    by_id = {t.id: t for t in tasks}
    below = dependents_of(tasks)
    counts: dict[TaskStatus | str, int] = {}
    for t in tasks:
        key: TaskStatus | str = "ready" if t.ready else t.status
        counts[key] = counts.get(key, 0) + 1
    summary = ", ".join(f"{n} {getattr(k, 'value', k)}" for k, n in counts.items())
    root = Tree(f"[bold]task graph[/] [dim]({len(tasks)} tasks: {summary or 'none'})[/]")
    drawn: set[str] = set()

    def add(parent: Tree, task_id: str) -> None:
        if task_id in drawn:
            parent.add(f"[dim]↑ {task_id} (shown above)[/]")
            return
        drawn.add(task_id)
        node = parent.add(_node_label(by_id[task_id]))
        for child in below.get(task_id, []):
            add(node, child)

    for task in tasks:
        if not task.blocked_by:
            add(root, task.id)
    return root


def render_mermaid(tasks: list[Task]) -> str:
    """Mermaid flowchart text: an edge from each blocker to the task it blocks."""
    lines = ["flowchart TD"]
    for task in tasks:
        subject = task.subject.replace('"', "#quot;")
        lines.append(f'    {task.id}["{task.id}: {subject}<br/>{status_label(task)}"]')
    for task in tasks:
        for blocker in task.blocked_by:
            lines.append(f"    {blocker} --> {task.id}")
    used = sorted({status_label(t) for t in tasks})
    for label in used:
        members = ",".join(t.id for t in tasks if status_label(t) == label)
        lines.append(f"    classDef {label} fill:{MERMAID_FILL[label]},stroke:#555")
        lines.append(f"    class {members} {label}")
    return "\n".join(lines)
