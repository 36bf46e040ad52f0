"""``keel gc``: remove the isolated workspaces a crash left behind.

An isolated workspace (``keel.runtime.worktrees``) is removed by whoever finishes
with it: a parent once it took its child's result, a worker once it settled its
task. A process that dies in between leaves it on disk (and, for a git worktree, its
entry under the repository's ``.git/worktrees``). :func:`collect_workspaces` finds
them through the store, never by guessing from the disk:

- a child run whose options record its isolated workspace (``RunOptions.isolated``)
  gives it up once the child has ended and its parent took the result (the parent
  ended, or records the child as finished);
- a task that asked for an isolated workspace (``"workspace": "isolated"``) gives up
  its run's once the run has ended (or is unknown to the store) and the task is
  settled (completed, failed or cancelled: its patch was taken); workspaces of its
  earlier attempts (``task-<id>-<attempt>``) that no run uses go too.

Workspaces of live runs are kept, and listed. Only this store's runs are looked at:
another store's workspaces in the same cache directory are never touched.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from keel.core.errors import KeelError, NotFound, UsageError
from keel.core.state import RunState
from keel.core.tasks import Task, TaskStatus
from keel.runtime import worktrees
from keel.store.base import Store

SETTLED = frozenset({TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.CANCELLED})


@dataclass(frozen=True, slots=True, kw_only=True)
class Workspace:
    """One isolated workspace ``gc`` looked at, and why it went or stayed."""

    path: str
    run_id: str | None
    task_id: str | None
    why: str  # e.g. "run completed", "run running", "task pending: its changes not taken"

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "run_id": self.run_id, "task_id": self.task_id, "why": self.why}


@dataclass(frozen=True, slots=True, kw_only=True)
class GcReport:
    removed: tuple[Workspace, ...] = ()
    kept: tuple[Workspace, ...] = ()  # of runs still live (or whose result is not taken)
    problems: tuple[str, ...] = ()  # runs or records that could not be read

    def to_dict(self) -> dict[str, Any]:
        return {
            "removed": [w.to_dict() for w in self.removed],
            "kept": [w.to_dict() for w in self.kept],
            "problems": list(self.problems),
        }


@dataclass(slots=True)
class _Collector:
    store: Store
    dry_run: bool
    removed: list[Workspace] = field(default_factory=list)
    kept: list[Workspace] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    seen: set[str] = field(default_factory=set)

    def remove(self, ws: worktrees.IsolatedWorkspace, found: Workspace) -> None:
        if str(ws.path) in self.seen:
            return
        self.seen.add(str(ws.path))
        if not (ws.path.exists() or ws.path.is_symlink() or ws.git_dir.exists()):
            return  # already gone: nothing to report
        if ws.path == ws.parent or ws.parent.is_relative_to(ws.path):
            self.problems.append(f"{ws.path}: recorded as inside its own parent; left alone")
            return
        if not self.dry_run:
            ws.remove()
        self.removed.append(found)

    def keep(self, path: str, found: Workspace) -> None:
        if path not in self.seen:
            self.seen.add(path)
            self.kept.append(found)


def collect_workspaces(store: Store, *, dry_run: bool = False) -> GcReport:
    """Remove (unless ``dry_run``) the isolated workspaces of ``store``'s ended runs."""
    collector = _Collector(store=store, dry_run=dry_run)
    for state in _runs(store, collector.problems):
        _child_workspace(collector, state)
    try:
        tasks = store.list_tasks()
    except KeelError as exc:
        collector.problems.append(f"tasks: {exc}")
        tasks = []
    for task in tasks:
        if (task.options or {}).get("workspace") == "isolated":
            _task_workspaces(collector, task)
    return GcReport(
        removed=tuple(collector.removed),
        kept=tuple(collector.kept),
        problems=tuple(collector.problems),
    )


def _runs(store: Store, problems: list[str]) -> Iterator[RunState]:
    for run_id in store.run_ids():
        try:
            yield store.load_run(run_id)
        except KeelError as exc:
            problems.append(f"run {run_id}: {exc}")


def _child_workspace(collector: _Collector, state: RunState) -> None:
    recorded = getattr(state.options, "isolated", None)
    if not recorded:
        return
    try:
        ws = worktrees.IsolatedWorkspace.from_dict(dict(recorded))
    except UsageError as exc:
        collector.problems.append(f"run {state.run_id}: {exc}")
        return
    status = state.status.value
    if not state.status.terminal:
        why = f"run {status}"
    elif _parent_still_waits(collector.store, state):
        why = f"run {status}; its parent has not taken the result yet"
    else:
        found = Workspace(path=str(ws.path), run_id=state.run_id, task_id=None, why=f"run {status}")
        collector.remove(ws, found)
        return
    collector.keep(
        str(ws.path),
        Workspace(path=str(ws.path), run_id=state.run_id, task_id=state.task_id, why=why),
    )


def _parent_still_waits(store: Store, child: RunState) -> bool:
    """The child's parent is live and has not recorded the child's end."""
    if child.parent_id is None:
        return False
    try:
        parent = store.load_run(child.parent_id)
    except NotFound:
        return False
    if parent.status.terminal:
        return False
    record = getattr(parent, "children", {}).get(child.run_id)
    if record is None:
        return False
    live = getattr(record, "live", None)
    if live is None and isinstance(record, dict):
        live = record.get("status") == "live"
    return bool(live)


def _task_workspaces(collector: _Collector, task: Task) -> None:
    run: RunState | None = None
    if task.run_id is not None:
        try:
            run = collector.store.load_run(task.run_id)
        except NotFound:
            run = None  # unknown to the store: nothing will ever use its workspace
        except KeelError as exc:
            collector.problems.append(f"task {task.id}: run {task.run_id}: {exc}")
            return
    live_path: str | None = None
    if run is not None:
        ws = worktrees.reopen(Path(run.workspace))
        ended = run.status.terminal
        if ws is not None and ended and task.status in SETTLED:
            why = f"run {run.status.value}"
            collector.remove(
                ws, Workspace(path=str(ws.path), run_id=run.run_id, task_id=task.id, why=why)
            )
        elif ws is not None:
            live_path = str(ws.path)
            why = f"run {run.status.value}"
            if ended:
                why += f"; task {task.status.value}: its changes are not taken yet"
            collector.keep(
                live_path, Workspace(path=live_path, run_id=run.run_id, task_id=task.id, why=why)
            )
    for ws, attempt in _attempts(task, run):
        if str(ws.path) == live_path:
            continue
        if task.status is TaskStatus.IN_PROGRESS and attempt >= task.attempt and run is None:
            continue  # being set up right now by the worker that holds the task
        why = "its run is unknown" if task.run_id is not None and run is None else "no run uses it"
        collector.remove(ws, Workspace(path=str(ws.path), run_id=None, task_id=task.id, why=why))


def _attempts(
    task: Task, run: RunState | None
) -> Iterator[tuple[worktrees.IsolatedWorkspace, int]]:
    """The isolated workspaces made for the task's attempts (``task-<id>-<attempt>``)."""
    roots: set[Path] = set()
    cwd = (task.options or {}).get("cwd")
    if isinstance(cwd, str) and cwd:
        roots.add(worktrees.default_root(Path(cwd)))
    if run is not None:
        roots.add(Path(run.workspace).parent)
    prefix = f"task-{task.id}-"
    for root in roots:
        if not root.is_dir():
            continue
        for entry in sorted(root.iterdir()):
            name = entry.name
            if not name.startswith(prefix) or not name[len(prefix) :].isdigit():
                continue
            ws = worktrees.reopen(entry)
            if ws is not None:
                yield ws, int(name[len(prefix) :])


__all__ = ["GcReport", "Workspace", "collect_workspaces"]
