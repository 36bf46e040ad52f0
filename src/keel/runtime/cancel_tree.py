"""Cancelling a run and every live run below it, with what the tree already did.

``cancel_tree`` cancels the run (the caller's reason), then walks its descendants
(``Store.child_runs``, top down) and cancels every one that has not ended with the
reason ``parent_cancelled``. Each cancel is an optimistic append from any process: a
stale read (``ConcurrentUpdate``) is read again and retried; a descendant that ended
meanwhile is left as it is. Once a run is cancelled no new action may start on it
(``keel.store.step.fold_step`` refuses it), so a child executing in another process
stops before its next action; the outcomes of calls already under way stay
recordable. The walk is repeated until a pass finds nothing left to cancel, so a
child created while the first pass ran is cancelled too.

For every cancelled run its task claims go back to pending
(``release_claims_of_ended_run``), and a cancelled descendant's own task (the task
it executes, ``task_id``) is cancelled as ``run:<child id>``. The task-graph rules
(``keel.core.tasks.check_cancel``) let only the holder cancel a task whose lease is
live: such a task is left to its holder, which settles it when it sees its run
ended, and the report says so.

The report lists every write, execute or external call started anywhere in the
tree (from each run's ``tool_started`` events) with its outcome: cancelling does not
undo them, they stay on record.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass, field
from typing import Any

from keel.core.errors import (
    ConcurrentUpdate,
    InvalidTaskTransition,
    NotOwner,
    TaskNotFound,
)
from keel.core.events import EventType
from keel.core.state import RunState, transition
from keel.core.status import RunStatus
from keel.core.tasks import TaskStatus
from keel.runtime.task_claims import release_claims_of_ended_run, run_owner
from keel.store.base import Store, iter_all_events
from keel.tools.base import Effect

PARENT_CANCELLED = "parent_cancelled"
SIDE_EFFECTS = frozenset({Effect.WRITE.value, Effect.EXECUTE.value, Effect.EXTERNAL.value})
CANCEL_ATTEMPTS = 50  # optimistic appends per run before a ConcurrentUpdate is raised
MAX_PASSES = 3  # walks of the tree: a later one catches children created during the last
SUMMARY_CHARS = 120

FINISHED = "finished"
FAILED = "failed"
UNKNOWN = "started, outcome unknown"


@dataclass(frozen=True, slots=True, kw_only=True)
class SideEffect:
    """A write, execute or external call started in the tree, and how it ended."""

    run_id: str
    call_id: str
    tool: str
    effect: str  # write | execute | external ("unknown" in a log that did not record it)
    outcome: str  # "finished" | "failed" | "started, outcome unknown"
    summary: str  # the call's arguments in short (a path, a command line), <= 120 chars

    def to_dict(self) -> dict[str, str]:
        return {
            "run_id": self.run_id,
            "call_id": self.call_id,
            "tool": self.tool,
            "effect": self.effect,
            "outcome": self.outcome,
            "summary": self.summary,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class CancelReport:
    """What ``cancel_tree`` did: the run's new state, the descendants it cancelled, and
    the side effects already done in the tree (they stay on record)."""

    state: RunState  # the cancelled run, after its cancel
    cancelled: list[str] = field(default_factory=list)  # descendant run ids, top down
    side_effects: list[SideEffect] = field(default_factory=list)  # in tree order, then seq
    tasks_cancelled: list[str] = field(default_factory=list)  # cancelled descendants' tasks
    tasks_left: dict[str, str] = field(default_factory=dict)  # task id -> why not cancelled

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.state.run_id,
            "status": self.state.status.value,
            "reason": self.state.reason,
            "cancelled": list(self.cancelled),
            "side_effects": [effect.to_dict() for effect in self.side_effects],
            "tasks_cancelled": list(self.tasks_cancelled),
            "tasks_left": dict(self.tasks_left),
        }


def cancel_tree(store: Store, run_id: str, reason: str, *, by: str | None = None) -> CancelReport:
    """Cancel ``run_id`` with ``reason`` and every live descendant with ``parent_cancelled``.

    ``by`` (who decided: a person's name, ``token:NAME`` through the API) is recorded on
    the run's own ``status_changed``. RunNotFound for an unknown run; InvalidTransition
    (nothing written) if the run itself has already ended or ``reason`` is blank.
    """
    state = _cancel(store, store.load_run(run_id), reason, descendant=False, by=by)
    assert state is not None  # the run itself: an ended one raised InvalidTransition
    release_claims_of_ended_run(store, state)
    cancelled: list[str] = []
    tasks_cancelled: list[str] = []
    tasks_left: dict[str, str] = {}
    tree: list[str] = []
    for _ in range(MAX_PASSES):
        tree, newly = _cancel_descendants(store, run_id, tasks_cancelled, tasks_left)
        cancelled.extend(newly)
        if not newly:
            break
    return CancelReport(
        state=state,
        cancelled=cancelled,
        side_effects=[effect for rid in tree for effect in side_effects_of(store, rid)],
        tasks_cancelled=tasks_cancelled,
        tasks_left=tasks_left,
    )


def _cancel_descendants(
    store: Store, root_id: str, tasks_cancelled: list[str], tasks_left: dict[str, str]
) -> tuple[list[str], list[str]]:
    """One top-down walk below ``root_id``: (every run of the tree, the ones cancelled now)."""
    tree = [root_id]
    cancelled: list[str] = []
    index = 0
    while index < len(tree):
        for child in store.child_runs(tree[index]):
            tree.append(child.run_id)
            ended = _cancel(store, child, PARENT_CANCELLED, descendant=True)
            if ended is None:
                continue  # it had ended already: left as it is (its children are still walked)
            cancelled.append(child.run_id)
            release_claims_of_ended_run(store, ended)
            if ended.task_id:
                _cancel_task(store, ended, tasks_cancelled, tasks_left)
        index += 1
    return tree, cancelled


def _cancel(
    store: Store, state: RunState, reason: str, *, descendant: bool, by: str | None = None
) -> RunState | None:
    """Append the move to ``cancelled``, reading again after a concurrent write.

    A descendant that has ended is left as it is (None); for the run itself that is an
    InvalidTransition (from ``transition``).
    """
    for attempt in range(CANCEL_ATTEMPTS):
        if descendant and state.status.terminal:
            return None
        extra = {"by": by} if by else {}
        event = transition(state, RunStatus.CANCELLED, reason, **extra)
        try:
            cancelled, _ = store.append_events(state.run_id, [event], expected_seq=state.last_seq)
        except ConcurrentUpdate:
            if attempt + 1 == CANCEL_ATTEMPTS:
                raise
            # A busy writer: let its step land, then read again. The wait is jittered and
            # grows (to 20 ms): a writer appending in a tight loop gets the lock back
            # first when both retry in step, so the cancel would lose every time.
            time.sleep(random.uniform(0, min(0.02, 0.002 * (attempt + 1))))
            state = store.load_run(state.run_id)
            continue
        return cancelled
    raise AssertionError("unreachable")  # pragma: no cover


def _cancel_task(
    store: Store, child: RunState, tasks_cancelled: list[str], tasks_left: dict[str, str]
) -> None:
    """Cancel the task a cancelled descendant executes, if the task-graph rules allow."""
    assert child.task_id is not None
    task_id = child.task_id
    try:
        task = store.get_task(task_id)
        if task.status in (TaskStatus.COMPLETED, TaskStatus.CANCELLED):
            return
        store.cancel_task(task_id, actor=run_owner(child.run_id), reason=PARENT_CANCELLED)
    except NotOwner as exc:
        tasks_left[task_id] = (
            f"{exc}; its holder settles it when it sees run {child.run_id} cancelled"
        )
        return
    except (InvalidTaskTransition, TaskNotFound) as exc:
        tasks_left[task_id] = str(exc)
        return
    tasks_cancelled.append(task_id)


def side_effects_of(store: Store, run_id: str) -> list[SideEffect]:
    """Every write, execute or external call started in ``run_id``, with its outcome."""
    started: dict[str, dict[str, Any]] = {}
    outcomes: dict[str, str] = {}
    for event in iter_all_events(store, run_id):
        call_id = event.data.get("call_id")
        if not isinstance(call_id, str):
            continue
        if event.type is EventType.TOOL_STARTED:
            effect = event.data.get("effect")
            if effect is None or effect in SIDE_EFFECTS:
                started.setdefault(call_id, event.data)
        elif event.type is EventType.TOOL_FINISHED:
            outcomes[call_id] = FINISHED
        elif event.type is EventType.TOOL_FAILED:
            outcomes[call_id] = FAILED
    return [
        SideEffect(
            run_id=run_id,
            call_id=call_id,
            tool=str(data.get("tool", "?")),
            effect=str(data.get("effect") or "unknown"),
            outcome=outcomes.get(call_id, UNKNOWN),
            summary=summarize_arguments(data.get("arguments")),
        )
        for call_id, data in started.items()
    ]


def summarize_arguments(arguments: Any) -> str:
    """A call's arguments in at most 120 characters: its path, its command line, or its
    arguments as JSON."""
    if isinstance(arguments, dict):
        argv = arguments.get("argv")
        if isinstance(argv, list) and argv:
            text = " ".join(str(part) for part in argv)
        elif isinstance(arguments.get("command"), str):
            text = arguments["command"]
        elif isinstance(arguments.get("path"), str):
            text = arguments["path"]
        else:
            text = json.dumps(arguments, ensure_ascii=False, default=str, sort_keys=True)
    elif arguments is None:
        text = ""
    else:
        text = json.dumps(arguments, ensure_ascii=False, default=str)
    text = " ".join(text.split())  # one line
    if len(text) > SUMMARY_CHARS:
        text = text[: SUMMARY_CHARS - 1] + "…"
    return text
