"""The harness side of delegation: spawn, wait for and collect children; hand over.

One ``Delegation`` per ``Harness`` answers the delegation tools of every run that
harness drives (``keel.tools.delegation``), and is the driver's eye on a parent's
background children between steps. Guarantees:

- a spawn commits ``subagent_spawned`` on the parent before the child can run, and
  is keyed by its call: a resumed parent re-attaches to the child it made, never
  makes a second one (``keel.runtime.child_runs``);
- a child's end is recorded on its parent exactly once (``subagent_finished``, with
  the observation: status, summary, validated output, evidence, the revision it
  started from, its patch and which of the patch's files the parent changed since),
  and its failure policy is applied then — retry makes a fresh child, fail_fast and
  escalate are left to the pure decision through the fold;
- a child that waits for a person makes the parent that waits for it wait too;
- a parent that ends cancels its live descendants (``parent_ended:<status>``);
- the child's isolated workspace is removed once its result is on record.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from keel.core.agent_spec import AgentSpec, FailurePolicy
from keel.core.children import ChildRecord, SpawnRefused, check_limits, live_children
from keel.core.errors import ConfigError, KeelError, StopRequested, ToolError
from keel.core.events import EventType, NewEvent
from keel.core.state import RunState
from keel.core.status import RunStatus
from keel.core.verifiers import evidence_map
from keel.runtime.agent_config import AgentSettings, load_agent_settings
from keel.runtime.agent_specs import builtin_tool_names, load_agent_spec
from keel.runtime.cancel_tree import cancel_tree
from keel.runtime.child_runs import (
    NewChild,
    failure_policy,
    home_workspace,
    isolated_workspace,
    make_child,
    on_failure_dict,
)
from keel.runtime.child_slots import ChildSlots, execute_child
from keel.runtime.observations import (
    as_json,
    recorded_finish,
    shown_observation,
    started_result,
    status_only,
    waiting_on,
)
from keel.store.base import Store
from keel.tools.base import ToolContext, ToolResult
from keel.tools.patch_staleness import stale_paths
from keel.tools.patches import patch_paths

if TYPE_CHECKING:
    from keel.runtime.harness import Harness

WAIT_SLICE_S = 0.5  # how long one look at a child's log waits before looking again
Recorder = Callable[[Sequence[NewEvent]], None]


class Delegation:
    """Answers the delegation tools for the runs one harness drives."""

    def __init__(self, harness: Harness) -> None:
        self.harness = harness
        self.slots = ChildSlots(harness)
        self._removals: dict[str, set[str]] = {}  # parent run id -> child ids to clean up
        self._lock = threading.Lock()

    @property
    def store(self) -> Store:
        return self.harness.store

    # --- the tools -----------------------------------------------------------------------

    def spawn(
        self,
        ctx: ToolContext,
        *,
        agent: str,
        task: str,
        inputs: dict[str, Any] | None,
        background: bool,
        on_failure: str | None,
    ) -> ToolResult:
        parent = _parent_state(ctx)
        turn = parent.usage.steps  # the turn whose call this is (ids may repeat across turns)
        made = [  # a verifier's child (a reviewer) is never a model call's, whatever its id
            cid
            for cid, r in parent.children.items()
            if r.call_id == ctx.call_id and r.turn == turn and r.verifier is None
        ]
        if made:  # this call spawned before (a resumed parent): re-attach, never respawn
            child_id = max(made, key=lambda cid: parent.children[cid].attempt)
            record = parent.children[child_id]
            if not record.live:
                return self._observation_result(parent, child_id)
            if background:
                return started_result(child_id, record.task_id, record.agent, again=True)
            return self._foreground(ctx, parent, child_id)
        settings = self.settings_of(parent)
        check_limits(parent, max_depth=settings.max_depth, max_live=settings.max_live_children)
        spec = self.spec_of(agent, parent)
        policy = failure_policy(spec, on_failure)
        new = self.make(
            ctx,
            parent,
            spec,
            task,
            inputs,
            background,
            policy,
            attempt=1,
            call_id=ctx.call_id,
            turn=turn,
        )
        if background:
            self._start_in_background(new)
            return started_result(new.state.run_id, new.task.id, spec.name, again=False)
        return self._foreground(
            ctx, _parent_state(ctx, refresh=self.store), new.state.run_id, new=new
        )

    def wait(self, ctx: ToolContext, *, ids: list[str], timeout_seconds: float) -> ToolResult:
        parent = _parent_state(ctx)
        wanted = [self._resolve(parent, given) for given in dict.fromkeys(ids)]
        deadline = time.monotonic() + timeout_seconds
        if ctx.deadline is not None:
            deadline = min(deadline, ctx.deadline)
        finished: dict[str, dict[str, Any]] = {}
        shown: dict[str, dict[str, Any]] = {}
        while True:
            open_ids = [c for c in wanted if c not in shown]
            waiting_child: str | None = None
            for child_id in open_ids:
                record = parent.children[child_id]
                child = self.store.load_run(child_id)
                if not child.status.terminal and record.live:
                    child = self._run_if_free(child, record)
                if child.status.terminal or not record.live:
                    ended, shown[child_id] = self._conclude(ctx, parent, child_id, child)
                    if ended is not None:
                        finished[child_id] = ended
                        parent = _with_finished(parent, ended)
                    elif "retried_as" in shown[child_id]:
                        parent = _parent_state(ctx, refresh=self.store)
                elif child.status is RunStatus.WAITING:
                    waiting_child = waiting_child or child_id
            if waiting_child is not None or len(shown) == len(wanted):
                break
            if time.monotonic() >= deadline:
                break
            left = [c for c in wanted if c not in shown]
            self.store.wait_for_events(
                left[0],
                after=self.store.load_run(left[0]).last_seq,
                timeout=min(WAIT_SLICE_S, max(0.0, deadline - time.monotonic())),
            )
        results = []
        for child_id in wanted:
            if child_id in shown:
                results.append(shown[child_id])
            else:
                child = self.store.load_run(child_id)
                results.append(status_only(child))
        data: dict[str, Any] = {"children_finished": list(finished.values())}
        if waiting_child is not None and waiting_child not in shown:
            data["waiting_on_child"] = waiting_on(ctx, self.store.load_run(waiting_child))
        return ToolResult(output=as_json({"results": results}), data=data)

    def result(self, ctx: ToolContext, *, child: str) -> ToolResult:
        parent = _parent_state(ctx)
        child_id = self._resolve(parent, child)
        state = self.store.load_run(child_id)
        if not state.status.terminal and parent.children[child_id].live:
            return ToolResult(output=as_json(status_only(state)))
        data, shown = self._conclude(ctx, parent, child_id, state)
        extra = {"children_finished": [data]} if data is not None else {}
        return ToolResult(output=as_json(shown), data=extra)

    def handoff(self, ctx: ToolContext, *, agent: str, note: str) -> ToolResult:
        from keel.runtime.handoff import hand_over  # noqa: PLC0415 - only for a handoff

        current = _parent_state(ctx)
        spec = self.spec_of(agent, current)
        new_run = hand_over(
            self.store,
            self.harness.tools,
            current=current,
            spec=spec,
            note=note,
            call_id=ctx.call_id,
            redact=self.harness.redact_for(current),
        )
        return ToolResult(
            output=f"handed off to run {new_run.run_id} ({spec.name}); this run now ends",
            data={"handed_off": {"run_id": new_run.run_id, "agent": spec.name, "note": note}},
        )

    # --- between a parent's steps ----------------------------------------------------------

    def between_steps(self, parent: RunState) -> list[NewEvent]:
        """Background children that ended since the last look, recorded with their policy
        applied (a retry spawns its fresh child here); finished children's workspaces
        removed. Cheap when nothing changed: one snapshot read per live background child."""
        if parent.status.terminal:
            return []  # an ended run makes no retry; its children end with it
        self._remove_finished(parent)
        events: list[NewEvent] = []
        for child_id in live_children(parent):
            record = parent.children[child_id]
            if not record.background:
                continue
            child = self.store.load_run(child_id)
            if not child.status.terminal:
                continue
            data, new = self._settle(parent, child_id, child, call_id=record.call_id)
            events.append(NewEvent(type=EventType.SUBAGENT_FINISHED, data=data))
            parent = _with_finished(parent, data)
            if new is not None:
                events.append(new.spawned)
                self._start_in_background(new)
        return events

    def child_statuses(self, parent: RunState) -> dict[str, str]:
        """The status of the child a waiting parent waits for."""
        pending = parent.pending
        if pending is None or pending.kind != "child":
            return {}
        child = str((pending.arguments or {}).get("child_run_id"))
        try:
            return {child: self.store.load_run(child).status.value}
        except KeelError:
            return {}

    def end_of_run(self, final: RunState) -> None:
        """A run ended: its live descendants are cancelled (``parent_ended:<status>``)
        and their ends recorded on it; finished children's workspaces removed."""
        if not final.status.terminal:
            return
        reason = f"parent_ended:{final.status.value}"
        live = set(live_children(final))
        # A child whose spawn never reached the log (the run ended while it was being
        # made, so its subagent_spawned was refused) must not outlive the run either.
        live |= {c.run_id for c in self.store.child_runs(final.run_id) if not c.status.terminal}
        for child_id in sorted(live):
            with contextlib.suppress(KeelError):  # it ended meanwhile
                cancel_tree(self.store, child_id, reason)
        if not final.children:
            return
        state = self.store.load_run(final.run_id)
        events = []
        for child_id in live_children(state):
            child = self.store.load_run(child_id)
            if child.status.terminal:
                data = self.observe(state, child_id, child, policy="none")
                events.append(NewEvent(type=EventType.SUBAGENT_FINISHED, data=data))
        if events:
            with contextlib.suppress(KeelError):  # someone recorded them first
                self.store.append_events(final.run_id, events, expected_seq=state.last_seq)
        self._remove_finished(self.store.load_run(final.run_id), everything=True)

    def close(self) -> None:
        self.slots.stop()

    # --- making children -------------------------------------------------------------------

    def settings_of(self, parent: RunState) -> AgentSettings:
        try:
            return load_agent_settings(home_workspace(parent))
        except ConfigError as exc:
            raise ToolError(f"agent_spawn: {exc}") from None

    def spec_of(self, agent: str, parent: RunState) -> AgentSpec:
        try:
            known = {*builtin_tool_names(), *self.harness.tools.names()}
            return load_agent_spec(agent, home_workspace(parent), known_tools=known)
        except ConfigError as exc:
            raise ToolError(f"agent_spawn: nothing was spawned: {exc}") from None

    def make(
        self,
        ctx: ToolContext | None,
        parent: RunState,
        spec: AgentSpec,
        task: str,
        inputs: dict[str, Any] | None,
        background: bool,
        policy: Any,
        *,
        attempt: int,
        call_id: str,
        turn: int,
        record: Recorder | None = None,
        verifier: str | None = None,
    ) -> NewChild:
        settings = self.settings_of(parent)
        new = make_child(
            self.store,
            self.harness.tools,
            parent=parent,
            spec=spec,
            task_text=task,
            inputs=inputs,
            background=background,
            policy=policy,
            call_id=call_id,
            turn=turn,
            attempt=attempt,
            max_depth=settings.max_depth,
            max_live=settings.max_live_children,
            owner=self.harness.owner,
            lease_seconds=self.harness.lease_ttl,
            redact=self.harness.redact_for(parent),
            verifier=verifier,
        )
        recorder = record if record is not None else ctx.record if ctx is not None else None
        if recorder is not None:
            recorder([new.spawned])
        now = self.store.load_run(parent.run_id)
        if now.status.terminal:
            # The parent ended (cancelled) while the child was being made: its spawn was
            # refused, so the child must not outlive it.
            reason = (
                "parent_cancelled"
                if now.status is RunStatus.CANCELLED
                else (f"parent_ended:{now.status.value}")
            )
            with contextlib.suppress(KeelError):
                cancel_tree(self.store, new.state.run_id, reason)
            raise StopRequested(f"run {parent.run_id} ended while spawning {new.state.run_id}")
        return new

    def _start_in_background(self, new: NewChild) -> None:
        """Hand the child to this process's child slots (any worker may take it first)."""
        if new.token is not None:
            self.store.release_task(
                new.task.id,
                owner=self.harness.owner,
                token=new.token,
                reason="spawned in the background: any executor may take it",
            )
        self.slots.submit(new.task.id)

    def _foreground(
        self, ctx: ToolContext, parent: RunState, child_id: str, new: NewChild | None = None
    ) -> ToolResult:
        """Run (or wait for) the child now; its observation is the call's result."""
        while True:
            record = parent.children.get(child_id)
            token = new.token if new is not None else None
            child = execute_child(
                self.harness,
                child_id,
                task_id=(new.task.id if new is not None else record.task_id if record else None),
                token=token,
                should_stop=ctx_should_stop(ctx),
            )
            new = None
            if child.status is RunStatus.WAITING:
                shown = {
                    "child_run_id": child_id,
                    "task_id": child.task_id,
                    "status": "waiting",
                    "waiting_for": child.reason,
                    "note": "this run waits too; once a person answered the child (keel "
                    "approve / keel answer on the child's id), collect it with agent_wait",
                }
                return ToolResult(
                    output=as_json(shown), data={"waiting_on_child": waiting_on(ctx, child)}
                )
            if not child.status.terminal:
                raise StopRequested(
                    f"child {child_id} stopped before it ended ({child.status.value}); "
                    "resuming this run re-attaches to it"
                )
            data, retry = self._settle(parent, child_id, child, call_id=ctx.call_id, ctx=ctx)
            if retry is None:
                shown = shown_observation(data)
                return ToolResult(output=as_json(shown), data={"children_finished": [data]})
            # A retry: the failed child's end and the fresh child's spawn go on record now.
            _record(ctx, [NewEvent(type=EventType.SUBAGENT_FINISHED, data=data), retry.spawned])
            parent = _parent_state(ctx, refresh=self.store)
            child_id, new = retry.state.run_id, retry

    def _run_if_free(self, child: RunState, record: ChildRecord) -> RunState:
        """Execute a child here if nobody else does (no worker took it, no slot free)."""
        if record.task_id is None:
            return child
        task = self.store.get_task(record.task_id)
        if task.status.value != "pending":
            return child
        return execute_child(self.harness, child.run_id, task_id=task.id, token=None)

    # --- ending children -------------------------------------------------------------------

    def _conclude(
        self, ctx: ToolContext, parent: RunState, child_id: str, child: RunState
    ) -> tuple[dict[str, Any] | None, dict[str, Any]]:
        """For a child that ended: (its subagent_finished data if not yet recorded, what the
        parent model is shown). A retry under its policy is spawned in the background."""
        record = parent.children[child_id]
        if not record.live:
            return None, self._recorded_observation(parent, child_id, child)
        data, retry = self._settle(parent, child_id, child, call_id=record.call_id, ctx=ctx)
        if retry is None:
            return data, shown_observation(data)
        # The failed child's end and its fresh successor go on record now (the successor
        # runs in the background; the parent collects it like any other child).
        _record(ctx, [NewEvent(type=EventType.SUBAGENT_FINISHED, data=data), retry.spawned])
        self._start_in_background(retry)
        return None, shown_observation(data)

    def _settle(
        self,
        parent: RunState,
        child_id: str,
        child: RunState,
        *,
        call_id: str,
        ctx: ToolContext | None = None,
    ) -> tuple[dict[str, Any], NewChild | None]:
        """The child's subagent_finished data with its policy applied, and the fresh child
        a retry made (already recorded as spawned when ``ctx`` can record)."""
        record = parent.children[child_id]
        if child.status is RunStatus.COMPLETED:
            return self.observe(parent, child_id, child, policy="none"), None
        on_failure = record.on_failure or {}
        policy = str(on_failure.get("policy", FailurePolicy.FAIL_FAST.value))
        if child.status is RunStatus.CANCELLED and str(child.reason or "").startswith("parent_"):
            policy = "none"  # cancelled because its parent ended or was cancelled
        if policy == FailurePolicy.RETRY.value:
            attempts = int(on_failure.get("attempts", 1))
            if record.attempt < attempts:
                task = self.store.get_task(record.task_id) if record.task_id else None
                options = task.options if task is not None else {}
                agent = str(on_failure.get("agent") or record.agent)
                after = _with_finished(
                    parent, self.observe(parent, child_id, child, policy="retry")
                )
                try:
                    spec = self.spec_of(agent, parent)
                    new = make_child_again(
                        self,
                        after,
                        spec,
                        options,
                        record,
                        on_failure,
                        call_id=call_id,
                    )
                except (SpawnRefused, ToolError) as exc:
                    data = self.observe(parent, child_id, child, policy=_then(on_failure))
                    data["retry_refused"] = str(exc)
                    return data, None
                data = self.observe(parent, child_id, child, policy="retry")
                data["retried_as"] = new.state.run_id
                return data, new
            policy = _then(on_failure)
        return self.observe(parent, child_id, child, policy=policy), None

    def observe(
        self, parent: RunState, child_id: str, child: RunState, *, policy: str
    ) -> dict[str, Any]:
        """The observation of an ended child, as its parent's subagent_finished records it."""
        record = parent.children[child_id]
        result = child.result or {}
        patch_id, patch_files, stale = self._patch_of(parent, child)
        task_options = self._task_options(record)
        return {
            "call_id": record.call_id,
            "child_run_id": child_id,
            "task_id": record.task_id,
            "agent": record.agent,
            "attempt": record.attempt,
            "status": child.status.value,
            "reason": child.reason,
            "summary": result.get("summary"),
            "output": result.get("output"),
            "outcome": result.get("outcome"),
            "evidence": evidence_map(result),
            "remaining_actions": list(result.get("remaining_actions") or []),
            "patch": patch_id,
            "patch_files": patch_files,
            "stale": stale,
            "base_revision": task_options.get("base_revision"),
            "base_commit": (child.options.isolated or {}).get("base"),
            "usage": child.usage.to_dict(),
            "policy": policy,
            "task": task_options.get("task"),
            "inputs": task_options.get("inputs"),
        }

    def _task_options(self, record: ChildRecord) -> dict[str, Any]:
        if record.task_id is None:
            return {}
        try:
            return dict(self.store.get_task(record.task_id).options or {})
        except KeelError:
            return {}

    def _patch_of(
        self, parent: RunState, child: RunState
    ) -> tuple[str | None, list[str], list[str]]:
        """An isolated child's changes as a patch artifact, the files it touches, and which
        of those the parent changed since the child started (stale)."""
        workspace = isolated_workspace(child.options)
        if workspace is None or not workspace.path.exists():
            return None, [], []
        patch = workspace.patch()
        with self._lock:
            self._removals.setdefault(parent.run_id, set()).add(child.run_id)
        if not patch.strip():
            return None, [], []
        artifact = self.store.put_artifact(child.run_id, f"patch-{child.run_id}.diff", patch)
        try:
            files = patch_paths(patch)
        except ToolError:
            files = []
        stale = stale_paths(Path(parent.workspace), patch)
        return artifact.id, files, stale

    def _observation_result(self, parent: RunState, child_id: str) -> ToolResult:
        child = self.store.load_run(child_id)
        return ToolResult(output=as_json(self._recorded_observation(parent, child_id, child)))

    def _recorded_observation(
        self, parent: RunState, child_id: str, child: RunState
    ) -> dict[str, Any]:
        """What the parent is shown of a child whose end is already on record."""
        found = recorded_finish(self.store, parent.run_id, child_id)
        if found is not None:
            return shown_observation(found)
        return status_only(child)

    def _remove_finished(self, parent: RunState, *, everything: bool = False) -> None:
        with self._lock:
            pending = self._removals.get(parent.run_id)
            if not pending:
                if not everything:
                    return
                pending = set()
            done = {c for c in pending if c in parent.children and not parent.children[c].live}
            if everything:
                done |= {c for c, r in parent.children.items() if not r.live}
            self._removals[parent.run_id] = pending - done
        for child_id in done:
            try:
                workspace = isolated_workspace(self.store.load_run(child_id).options)
            except KeelError:
                continue
            if workspace is not None and workspace.path.exists():
                workspace.remove()

    def _resolve(self, parent: RunState, given: str) -> str:
        if given in parent.children:
            return given
        for child_id, record in parent.children.items():
            if record.task_id == given:
                return child_id
        known = ", ".join(f"{c} (task {r.task_id})" for c, r in parent.children.items())
        raise ToolError(f"unknown child {given!r}: this run's children are {known or 'none'}")


def make_child_again(
    delegation: Delegation,
    parent: RunState,
    spec: AgentSpec,
    task_options: dict[str, Any],
    record: ChildRecord,
    on_failure: dict[str, Any],
    *,
    call_id: str,
) -> NewChild:
    """A fresh child (new workspace, next attempt) for a child that failed under retry."""
    from keel.core.agent_spec import OnFailure  # noqa: PLC0415

    policy = OnFailure(
        policy=FailurePolicy.RETRY,
        attempts=int(on_failure.get("attempts", 1)),
        agent=on_failure.get("agent"),
        then=FailurePolicy(str(on_failure.get("then", "fail_fast"))),
    )
    settings = delegation.settings_of(parent)
    return make_child(
        delegation.store,
        delegation.harness.tools,
        parent=parent,
        spec=spec,
        task_text=str(task_options.get("task") or ""),
        inputs=task_options.get("inputs"),
        background=record.background,
        policy=policy,
        call_id=call_id,
        turn=record.turn,
        attempt=record.attempt + 1,
        max_depth=settings.max_depth,
        max_live=settings.max_live_children,
        owner=delegation.harness.owner,
        lease_seconds=delegation.harness.lease_ttl,
        redact=delegation.harness.redact_for(parent),
    )


def ctx_should_stop(ctx: ToolContext) -> Callable[[], bool] | None:
    return ctx.should_stop


def _record(ctx: ToolContext, events: list[NewEvent]) -> None:
    if ctx.record is None:
        raise ToolError("delegation needs a run that can record its children")
    ctx.record(events)


def _then(on_failure: dict[str, Any]) -> str:
    return str(on_failure.get("then", FailurePolicy.FAIL_FAST.value))


def _parent_state(ctx: ToolContext, refresh: Store | None = None) -> RunState:
    if refresh is not None:
        return refresh.load_run(ctx.run_id)
    if ctx.state is None:
        raise ToolError("delegation needs the run's state")
    return ctx.state


def _with_finished(parent: RunState, data: dict[str, Any]) -> RunState:
    """``parent`` as it will be once ``data`` (a subagent_finished) is folded in."""
    from keel.core import children as kids  # noqa: PLC0415
    from keel.core.state import _evolve  # noqa: PLC0415

    children, usage, _ = kids.finished(parent.children, parent.usage, data)
    return _evolve(parent, children=children, usage=usage)


__all__ = ["Delegation", "on_failure_dict"]
