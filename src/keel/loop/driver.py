"""The loop's thin I/O shell: perform what ``decide`` asks, record it, ask again.

Guarantees:
- every step's events are committed before the next decision is taken, so a
  process can die anywhere and a new one continues from the store alone;
- a side-effecting call is committed as ``tool_started`` (idempotency key
  ``<run_id>:<call_id>``, exact arguments, intended file hashes) before it runs,
  and ``tool_finished``/``tool_failed`` after, so a resume never repeats it blindly;
- every write carries the run's lease token: once another process took the
  run over, this one's writes are refused (``LeaseLost``) and it stops;
- nothing the model sends strands a run: an exception in a tool, its arguments or
  its intent is a ``tool_failed`` the model reads, every call has a deadline
  (``ToolContext.deadline``), and anything else unexpected ends the run ``failed``
  with ``internal_error: …`` (``keel.loop.failures``), never ``running`` undriven.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from keel.core.errors import (
    ConcurrentUpdate,
    InvalidTransition,
    LeaseLost,
    ModelError,
    StopRequested,
    StoreError,
    ToolError,
)
from keel.core.events import Event, EventType, NewEvent
from keel.core.guard import PathGuard
from keel.core.middleware import Point
from keel.core.records import ValidationRecord
from keel.core.redact import Redactor, SecretSource
from keel.core.state import RunState
from keel.core.text import has_lone_surrogate, valid_data
from keel.core.verifiers import review_command
from keel.faults import fault_point
from keel.loop.actions import (
    CallModel,
    Commit,
    Halt,
    ReconcileCall,
    RunTool,
    RunVerifiers,
    SettleProcess,
)
from keel.loop.catalog import RegistryCatalog, TotalGate, offered_specs
from keel.loop.compaction import ContextKeeper
from keel.loop.context import ContextBudget
from keel.loop.decide import Gate, Situation, decide
from keel.loop.failures import PASS_THROUGH, error_kind, error_message, internal_failure
from keel.loop.fingerprint import fingerprint, shown_changes
from keel.loop.middleware import MiddlewareChain
from keel.loop.middleware_driving import MiddlewareDriving
from keel.loop.outcomes import (
    after_model,
    after_verification,
    call_failed,
    call_finished,
    call_started,
    loose_arguments,
    model_failed,
    reconciled_event,
    replay_safe,
    replayed_records,
    retry_event,
)
from keel.loop.prepare import build_messages, system_prompt
from keel.loop.token_estimate import specs_tokens
from keel.loop.transcript import Transcript, recent_transcript
from keel.loop.turns import valid_turn
from keel.loop.verification import check_workspace, no_reviewer
from keel.models.base import (
    Model,
    ModelRequest,
    ModelTurn,
    RetryNotice,
    StreamDelta,
    ToolCall,
    ToolSpec,
)
from keel.sandbox import orphans
from keel.sandbox.base import Sandbox, SandboxSettings
from keel.store.base import Store
from keel.store.step import FoldedStep, dump_json, fold_step
from keel.tools.base import Effect, Tool, ToolContext, ToolResult
from keel.tools.commands import effective_timeout
from keel.tools.deadline import call_deadline
from keel.tools.registry import ToolRegistry

SIDE_EFFECTS = frozenset({Effect.WRITE.value, Effect.EXECUTE.value, Effect.EXTERNAL.value})
CALL_OUTCOMES = frozenset({EventType.TOOL_FINISHED, EventType.TOOL_FAILED})
MAX_EVENT_OUTPUT = 64_000  # characters of a tool's output kept inline in its event
VERIFIER_TIMEOUT_S = 900.0

EventSink = Callable[[Event, RunState], None]
DeltaSink = Callable[[StreamDelta], None]


@dataclass(slots=True, kw_only=True)
class LeaseGuard:
    """The run's lease as the driver sees it; a heartbeat thread may flag it lost."""

    token: str | None = None
    lost: str | None = None  # why, once the heartbeat failed

    def check(self, run_id: str) -> None:
        if self.lost is not None:
            raise LeaseLost(run_id, self.lost)


@dataclass(slots=True, kw_only=True)
class Driver:
    """Drives one run until it waits, finishes, or loses its lease."""

    store: Store
    model: Model
    registry: ToolRegistry
    gate: Gate
    state: RunState
    owner: str  # the run's identity, used by task tools
    lease: LeaseGuard = field(default_factory=LeaseGuard)
    on_event: EventSink | None = None
    redactor: Redactor = field(default_factory=lambda: Redactor.from_mapping(os.environ))
    verifier_timeout_s: float = VERIFIER_TIMEOUT_S
    should_stop: Callable[[], bool] | None = None  # checked between steps (graceful stop)
    sandbox: Sandbox | None = None  # where programs run; None: unconfined (tests of the loop)
    guard: PathGuard = field(default_factory=PathGuard)
    settings: SandboxSettings = field(default_factory=SandboxSettings)
    secrets: SecretSource | None = None  # None: only the environment's secrets are known
    on_delta: DeltaSink | None = None  # a streaming model's pieces, for watching; never stored
    # Children (keel.runtime.delegation.Delegation): answers the delegation tools and looks
    # at the run's background children between steps. None: this run spawns nothing.
    delegation: Any = None
    # Reviewer verifiers (keel.runtime.reviews.Reviews). None: a run with reviewers gets
    # an unfixable gap here (nothing in this process can make a reviewer).
    reviews: Any = None
    middleware: MiddlewareChain = field(default_factory=MiddlewareChain)
    transcript: Transcript = field(init=False)
    workspace: Path = field(init=False)
    _catalog: RegistryCatalog = field(init=False)
    _specs: tuple[ToolSpec, ...] = field(init=False)
    _window: ContextKeeper = field(init=False)  # when to compact the transcript (loop.context)
    _stored: RunState = field(init=False)  # the state as the store has it
    _pending: FoldedStep | None = field(init=False)  # folded into ``state``, not yet stored
    _pending_events: list[NewEvent] = field(init=False)  # the same, unfolded (for a retry)
    _points: frozenset[str] = field(init=False)
    _asking: MiddlewareDriving = field(init=False)
    _system: tuple[RunState, str] | None = field(init=False)  # the state's system prompt

    def __post_init__(self) -> None:
        self._points = frozenset(p.value for p in self.middleware.points)
        self._asking = MiddlewareDriving(self.middleware)
        self._stored = self.state
        self._system = None
        self._pending = None
        self._pending_events = []
        self.workspace = Path(self.state.workspace).resolve()
        self.transcript = recent_transcript(self.store, self.state)
        self._catalog = RegistryCatalog(self.registry)
        self._specs = offered_specs(self.registry)
        self._window = ContextKeeper(
            budget=ContextBudget.of(self.state.options),
            specs_tokens=specs_tokens(self._specs),
            scrub=lambda text: self.redactor.scrub_text(text),  # noqa: PLW0108 - redactor is replaced
        )

    @property
    def run_id(self) -> str:
        return self.state.run_id

    def _committed_first(self, name: str) -> bool:
        """A read, or a call whose start is committed before its effect (``_run_tool``)."""
        if name not in self.registry:
            return False
        effect = self.registry.get(name).effect
        return effect is Effect.READ or effect.value in SIDE_EFFECTS

    # --- the loop ------------------------------------------------------------------------

    def drive(self) -> RunState:
        """Perform actions until the run halts; returns the final state.

        Anything unexpected (not the lease's loss) ends the run ``failed`` with
        ``internal_error: <Type>: <message>`` committed before this returns.
        """
        try:
            return self._drive()
        except PASS_THROUGH:
            raise
        except Exception as exc:
            return self._fail_internally(exc)

    def _fail_internally(self, exc: Exception) -> RunState:
        """Record the run as failed by ``exc`` (the store's view first: deferred events
        are dropped, they may be what failed); StoreError when even that fails."""
        try:
            self.refresh()
            if not self.state.status.terminal:
                self.commit(internal_failure(self.state, exc))
        except PASS_THROUGH:
            raise
        except Exception as again:
            raise StoreError(
                f"run {self.run_id} stopped on {error_message(exc)}, and recording its failure "
                f"failed too ({error_message(again)}); `keel resume {self.run_id}` tries again"
            ) from exc
        return self.state

    def _drive(self) -> RunState:
        while True:
            self.lease.check(self.run_id)
            if self.should_stop is not None and self.should_stop():
                self.flush()
                return self.state  # stopped between steps: the run stays resumable
            if self.delegation is not None and self.state.children:
                ended = self.delegation.between_steps(self.state)
                if ended:
                    self.commit(ended)
            action = decide(self.state, self._situation())
            if isinstance(action, Halt):
                self.flush()
                return self.state
            if isinstance(action, Commit):
                self.commit(action.events)
            elif isinstance(action, CallModel):
                self._call_model(action)
            elif isinstance(action, RunTool):
                try:
                    self._run_tool(action)
                except StopRequested:
                    self.flush()
                    return self.state  # a foreground child stopped with us: resumable

            elif isinstance(action, ReconcileCall):
                self._reconcile(action)
            elif isinstance(action, SettleProcess):
                self._settle(action)
            else:
                self._verify(action)

    def _situation(self) -> Situation:
        waiting_on_child = (
            self.delegation is not None
            and self.state.pending is not None
            and self.state.pending.kind == "child"
        )
        return Situation(
            catalog=self._catalog,
            gate=TotalGate(self.gate),
            workspace=self.workspace,
            now=datetime.now(UTC),
            child_statuses=self.delegation.child_statuses(self.state) if waiting_on_child else {},
            middleware_points=self._points,
        )

    # --- recording -----------------------------------------------------------------------

    def commit(self, events: Sequence[NewEvent], *, defer: bool = False) -> None:
        """Store ``events`` (with any deferred ones before them) as one step and fold them in.

        ``defer=True`` only folds them into the in-memory state: they are stored with
        the next durable commit, which always comes before any side effect, before the
        driver returns, and before a model call when a model turn is among them (a crash
        loses at most one turn). Only what a resume repairs is deferred: a replay-safe
        turn and the results of reads (losing them just asks again), and the result of
        a write whose start and intent are stored (the resume finds the files as
        intended and records it done). If another writer ended the run meanwhile, the
        results of calls that began are still stored; nothing new is. Events are folded
        once, here, with the store's own ``fold_step``; the store checks the sequence
        and the lease.
        """
        if self.middleware.observer_errors:  # on_event failures, recorded with the next step
            errors, self.middleware.observer_errors[:] = list(self.middleware.observer_errors), []
            events = [*self._asking.decided(errors), *events]
        recorded = [self._for_record(e.data) for e in events]
        clean = [
            NewEvent(type=e.type, data=data) for e, (data, _) in zip(events, recorded, strict=True)
        ]
        if clean:
            encoded = [text for _, text in recorded]
            step = fold_step(self.state, clean, now=datetime.now(UTC), encoded=encoded)
            self._pending = step if self._pending is None else self._pending.then(step)
            self._pending_events.extend(clean)
            self.state = step.state
            self._show(step.events)
        if defer or self._pending is None:
            return
        for attempt in range(2):
            try:
                state, stored = self.store.append_folded(
                    self.run_id, self._pending, lease_token=self.lease.token
                )
            except ConcurrentUpdate:
                if attempt:
                    raise
                # Someone else (approve, answer, cancel) wrote in between: catch up,
                # then store ours if the run still allows them.
                events_again = self._pending_events
                self.refresh()
                try:
                    self._pending = fold_step(self.state, events_again, now=datetime.now(UTC))
                except InvalidTransition:
                    # The run moved on (e.g. cancelled): what calls that began did is still
                    # recorded; nothing new starts, and the loop decides afresh — unless it
                    # moved on because another process took it over, which it must report.
                    events_again = [e for e in events_again if e.type in CALL_OUTCOMES]
                    self._pending = self._fold_or_none(events_again)
                    if self._pending is None:
                        self._confirm_lease()
                        return
                self._pending_events = events_again
                self.state = self._pending.state
                self._show(self._pending.events)
            else:
                self._pending, self._pending_events = None, []
                self._absorb(state, stored, shown=True)
                return

    def _fold_or_none(self, events: Sequence[NewEvent]) -> FoldedStep | None:
        if not events:
            return None
        try:
            return fold_step(self.state, events, now=datetime.now(UTC))
        except InvalidTransition:
            return None

    def _for_record(self, data: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
        """``data`` made valid (no lone surrogates) and redacted, for the log, and its
        stored text when that is the text looked at (None: the store encodes it).

        One look at its JSON text (C speed) decides whether the data needs walking at
        all; most events hold no secret and no surrogate, and come back as they are.
        """
        try:
            text = dump_json(data)
        except (TypeError, ValueError):
            text = None
        if text is not None and not has_lone_surrogate(text) and not self.redactor.might_hold(text):
            return data, text
        cleaned: dict[str, Any] = self.redactor.scrub(valid_data(data))
        return cleaned, None

    def flush(self) -> None:
        """Store what was deferred."""
        self.commit([])

    def refresh(self) -> None:
        """Catch up with events other processes stored (dropping anything deferred: the
        transcript, which showed it, is rebuilt from the log)."""
        shown = self._pending is not None
        self._pending, self._pending_events = None, []
        self.state = self._stored
        new = list(self.store.read_events(self.run_id, after=self._stored.last_seq))
        if shown:
            upto = new[-1].seq if new else self._stored.last_seq
            self.transcript = recent_transcript(self.store, self._stored, upto=upto)
        for event in new:
            self._absorb(self._stored.apply(event), [event], shown=shown)

    def _show(self, events: Sequence[Event]) -> None:
        """Events folded (stored or not yet) join the conversation at once: the next
        request shows every result, whether or not its commit has happened yet."""
        for event in events:
            self.transcript.apply(event)

    def _absorb(self, state: RunState, stored: list[Event], *, shown: bool = False) -> None:
        self.state = state
        self._stored = state
        observing = Point.ON_EVENT in self.middleware.points
        for event in stored:
            if not shown:
                self.transcript.apply(event)
            if observing:
                self.middleware.observe(event)
            if self.on_event is not None:
                self.on_event(event, state)

    # --- model ---------------------------------------------------------------------------

    def _call_model(self, action: CallModel) -> None:
        # The log holds every earlier model turn before the next is asked for: a crash
        # loses at most one turn. What else may still wait (a read's or a repairable
        # write's result) is stored with this turn's first durable commit.
        if any(e.type is EventType.MODEL_RESPONDED for e in self._pending_events):
            self.flush()
        self.lease.check(self.run_id)
        self._fit_context(action, overflow=False)
        if self.state.status.terminal:
            return  # the compacted context would have been unfaithful: the run failed
        request = self._request(action)
        if action.consult:
            asked = self._asking.before_model(self.state, request)
            if asked:  # recorded; the loop decides again with these decisions
                self.commit(asked)
                return
        answer = None
        if action.decisions:
            request, answer = self._asking.apply_before_model(request, action.decisions)
        started = time.monotonic()
        try:
            if answer is None:
                request, turn = self._complete(action, request)
            else:
                turn = answer
        except ModelError as exc:
            if not self.state.status.terminal:
                self.commit([model_failed(self.state, exc)])
            return
        elapsed = time.monotonic() - started
        fault_point("mid_model_step")
        valid, _ = valid_turn(turn)  # after_model records what was made valid
        decided: list[NewEvent] = []
        if Point.AFTER_MODEL in self.middleware.points:
            valid, decided = self._asking.after_model(self.state, action.step + 1, valid)
            turn = valid
        requested = NewEvent(
            type=EventType.MODEL_REQUESTED,
            data={
                "step": action.step + 1,
                "model": self.model.spec,
                "messages": len(request.messages),
                **({"answered_by": answer.model} if answer is not None else {}),
            },
        )
        self._learn_written_secrets(valid.tool_calls)
        self.commit(
            [requested, *after_model(self.state, turn, elapsed_s=elapsed), *decided],
            defer=not decided and replay_safe(valid, self._committed_first),
        )

    def _system_prompt(self) -> str:
        """``system_prompt`` of the current state, made once per state (a step asks for it
        to fit the context and again to build the request)."""
        made = self._system
        if made is None or made[0] is not self.state:
            made = self._system = (self.state, system_prompt(self.state))
        return made[1]

    def _request(self, action: CallModel) -> ModelRequest:
        return ModelRequest(
            messages=build_messages(self.state, self.transcript, system=self._system_prompt()),
            tools=self._specs,
            step=action.step,
            on_retry=self._record_retry,
            on_delta=self.on_delta,
        )

    def _complete(self, action: CallModel, request: ModelRequest) -> tuple[ModelRequest, ModelTurn]:
        """The model's answer; a context overflow compacts the transcript once (reason
        ``overflow``) and asks again (with the same recorded before_model patches); a
        second overflow, or one with nothing left to drop, is the ModelError it was."""
        try:
            return request, self.model.complete(request)
        except ModelError as exc:
            if exc.reason != "context_overflow" or not self._fit_context(action, overflow=True):
                raise
        request = self._request(action)
        if action.decisions:
            request, _ = self._asking.apply_before_model(request, action.decisions)
        return request, self.model.complete(request)

    def _fit_context(self, action: CallModel, *, overflow: bool) -> bool:
        """Commit the compaction the next request needs (``keel.loop.compaction``); True
        when the transcript was compacted and the run goes on."""
        events = self._window.compact(
            self.state,
            self.transcript,
            system=self._system_prompt(),
            step=action.step,
            overflow=overflow,
            model=self.model,
            on_retry=self._record_retry,
        )
        if events:
            self.commit(events)
        return bool(events) and not self.state.status.terminal

    def _learn_written_secrets(self, calls: Sequence[ToolCall]) -> None:
        """Values the model is about to write into a secret file are secrets from now on,
        so neither its turn nor the call's record stores them."""
        if self.secrets is None:
            return
        for call in calls:
            if call.name not in ("write_file", "edit_file"):
                continue  # a command writing .env is caught by the refresh after it
            args = loose_arguments(call.arguments)
            if not isinstance(args, dict):
                continue
            path, text = args.get("path"), args.get("content", args.get("new_text"))
            if isinstance(path, str) and isinstance(text, str) and self.guard.is_secret(path):
                self.redactor = self.secrets.learn(self.redactor, path, text)

    def _record_retry(self, notice: RetryNotice) -> None:
        self.commit([retry_event(notice)])

    # --- tools ---------------------------------------------------------------------------

    def _context(
        self, call_id: str, action: RunTool | None = None, deadline: float | None = None
    ) -> ToolContext:
        return ToolContext(
            workspace=self.workspace,
            run_id=self.run_id,
            call_id=call_id,
            owner=self.owner,
            store=self.store,
            state=self.state,
            guard=self.guard,
            sandbox=self.sandbox,
            git_writable=action is not None and action.git_writable,
            on_spawn=(
                (lambda pgid: self._spawned(action, pgid, deadline)) if action is not None else None
            ),
            deadline=deadline,
            delegation=self.delegation,
            record=self._record_mid_call,
            should_stop=self.should_stop,
            fsync=self.store.fsyncs_commits,
        )

    def _record_mid_call(self, events: Sequence[NewEvent]) -> None:
        """Commit events a call makes on the way (a spawn is on record before its child
        runs)."""
        self.commit(list(events))

    def _deadline(self, limit_s: float) -> float:
        """When a call must stop: its own limit, never past the run's remaining wall time."""
        budget = self.state.options.budget.max_wall_seconds
        left = None if budget is None else budget - self.state.usage.wall_seconds
        return call_deadline(limit_s, left, now=time.monotonic())

    def _spawned(self, action: RunTool, pgid: int, deadline: float | None) -> None:
        """Record where a command runs before waiting for it, so a resume can find it."""
        timeout = action.arguments.get("timeout_seconds")
        seconds = float(timeout) if isinstance(timeout, int | float) and timeout else None
        limit, _ = effective_timeout(seconds, deadline, now=time.monotonic())
        self.commit(
            [
                NewEvent(
                    type=EventType.PROCESS_STARTED,
                    data={
                        "call_id": action.call_id,
                        **orphans.identify(pgid),
                        "timeout_s": limit,
                        "sandbox": self._sandbox_kind(),
                    },
                )
            ]
        )

    def _sandbox_kind(self) -> str:
        return self.sandbox.kind if self.sandbox is not None else "none"

    def _isolation(self) -> dict[str, Any]:
        """What confines programs, as recorded with every call and verification."""
        if self.sandbox is None:
            return {"kind": "none"}
        return self.sandbox.describe()

    def _run_tool(self, action: RunTool) -> None:
        started = time.monotonic()
        try:
            tool = self.registry.get(action.tool)
            args = tool.parse_arguments(action.arguments)
            ctx = self._context(action.call_id, deadline=self._deadline(tool.time_limit_s))
            intent = (
                tool.intent(ctx, args)
                if action.effect in SIDE_EFFECTS and action.record_start
                else {}
            )
        except PASS_THROUGH:
            raise
        except Exception as exc:
            # The call cannot work as asked (bad arguments, no unique match, a path no
            # file can have, a bug): nothing happened yet, so the model is told.
            self._failed(action, error_kind(exc), error_message(exc), started, None)
            return
        if action.consult:
            asked = self._asking.before_tool(self.state, action)
            if asked:  # recorded before anything ran; the loop decides again with them
                self.commit(asked)
                return
        if action.effect in SIDE_EFFECTS:
            if action.record_start:
                isolation = self._isolation() if action.effect == Effect.EXECUTE.value else None
                self.commit([call_started(self.run_id, action, intent, isolation)])
                fault_point("after_tool_started")
            else:
                self.commit([reconciled_event(action.call_id, "rerun", "replaying the call")])
        # A write whose intended change can be checked (file hashes) is repairable: a
        # crash before its result is stored is reconciled from the workspace on resume.
        self._execute(action, args, repairable=action.effect == Effect.WRITE.value and bool(intent))

    def _execute(self, action: RunTool, args: Any, *, repairable: bool = False) -> None:
        if self.state.status.terminal:
            # Another writer ended the run (``keel cancel``) just before the call's start
            # was stored: its tool_started was refused (``fold_step``), so it never runs.
            return
        tool = self.registry.get(action.tool)
        if action.effect in SIDE_EFFECTS:
            self._confirm_lease()
        before = fingerprint(self.workspace) if action.effect == Effect.EXECUTE.value else None
        started = time.monotonic()
        ctx = self._context(action.call_id, action, self._deadline(tool.time_limit_s))
        try:
            result = tool.run(ctx, args)
        except PASS_THROUGH:
            raise
        except KeyboardInterrupt:
            # Ctrl-C stopped a command (run_command kills its process group): the
            # outcome is known, so record it and a resume asks the model, not a person.
            if before is not None:
                message = (
                    f"interrupted by the user (Ctrl-C) after {time.monotonic() - started:.1f} s: "
                    "the command was stopped before it finished and its effects may be "
                    "partial; check the workspace before running it again"
                )
                self._failed(action, "interrupted", message, started, before)
            raise
        except Exception as exc:  # a tool's refusal or bug is the model's observation
            fault_point("after_effect")
            self._failed(action, error_kind(exc), error_message(exc), started, before)
            return
        fault_point("after_effect")
        changed = dict(result.changed_files)
        if before is not None:
            changed.update(shown_changes(self.workspace, before))
        if self.secrets is not None and any(self.guard.is_secret(path) for path in changed):
            self.redactor = self.secrets.refresh(self.redactor)
        output = self._inline_output(action.call_id, result)
        events = call_finished(action, output, changed, time.monotonic() - started, result.data)
        decided: list[NewEvent] = []
        if action.notes or Point.AFTER_TOOL in self.middleware.points:
            events, decided = self._asking.after_tool(self.state, action, events, changed)
        # A read's result may wait for the next durable commit (replaying a read is safe),
        # and so may a repairable write's: its start and intent are stored, so a resume
        # that finds no result checks the files and records the call done (or runs it).
        read = action.effect == Effect.READ.value and not changed
        self.commit([*events, *decided], defer=(read or repairable) and not decided)
        fault_point("after_tool_finished")

    def _confirm_lease(self) -> None:
        """LeaseLost unless this process still holds the run, asked of the store itself.

        Store writes are fenced, but an effect is not a store write: a process frozen
        between ``tool_started`` and the effect must not perform it after another
        process took the run over.
        """
        if self.lease.token is None:
            return
        current = self.store.current_run_lease(self.run_id)
        if current is None or current.token != self.lease.token:
            detail = f"now held by {current.owner}" if current else "the lease expired"
            self.lease.lost = detail
            raise LeaseLost(self.run_id, detail)

    def _failed(
        self,
        action: RunTool,
        kind: str,
        message: str,
        started: float,
        before: dict[str, tuple[int, int]] | None,
    ) -> None:
        changed = shown_changes(self.workspace, before) if before is not None else {}
        self.commit([call_failed(action, kind, message, changed, time.monotonic() - started)])

    def _inline_output(self, call_id: str, result: ToolResult) -> str:
        if len(result.output) <= MAX_EVENT_OUTPUT:
            return result.output
        output = self.redactor.scrub_text(result.output)  # artifacts are on record too
        artifact = self.store.put_artifact(
            self.run_id, f"output-{call_id}.txt", output.encode("utf-8", "replace")
        )
        return (
            output[:MAX_EVENT_OUTPUT]
            + f"\n[output truncated here: full text in artifact:{artifact.id}]"
        )

    def _reconcile(self, action: ReconcileCall) -> None:
        tool = self.registry.get(action.tool)
        ctx = self._context(action.call_id)
        if action.intent and _effect_happened(tool, ctx, action.intent):
            self.commit(
                [
                    reconciled_event(
                        action.call_id, "done", "file hashes match the intended change"
                    ),
                    NewEvent(
                        type=EventType.TOOL_FINISHED,
                        data={
                            "call_id": action.call_id,
                            "tool": action.tool,
                            "arguments": action.arguments,
                            "output": "done (the change was made before the interruption; "
                            "verified by file hash)",
                            "changed_files": dict(action.intent),
                        },
                    ),
                    *replayed_records(action.tool, action.arguments),
                ]
            )
            return
        self.commit([reconciled_event(action.call_id, "rerun", "the change is not there yet")])
        run = RunTool(
            call_id=action.call_id,
            tool=action.tool,
            arguments=action.arguments,
            effect=tool.effect.value,
            recovery=tool.recovery.value,
            record_start=False,
        )
        self._execute(run, tool.parse_arguments(action.arguments))

    def _settle(self, action: SettleProcess) -> None:
        """Deal with a command a dead process left running, before anyone is asked about it:
        wait for it or kill it, per ``[sandbox] orphans`` (``orphans.settle``)."""
        outcome = orphans.settle(action.process, self.settings.orphans)
        self.commit(
            [
                NewEvent(
                    type=EventType.PROCESS_SETTLED,
                    data={
                        "call_id": action.call_id,
                        "outcome": outcome,
                        "pgid": action.process.get("pgid"),
                    },
                )
            ]
        )

    # --- verification --------------------------------------------------------------------

    def _verify(self, action: RunVerifiers) -> None:
        if self.secrets is not None:  # the run may have written .env files since
            self.redactor = self.secrets.refresh(self.redactor)
        revision = self.state.mutation_revision
        self.commit(
            [
                NewEvent(
                    type=EventType.VERIFICATION_STARTED,
                    data={
                        "commands": list(action.commands),
                        "mutation_revision": revision,
                        "sandbox": self._isolation(),
                    },
                )
            ]
        )
        if self.state.status.terminal:
            return  # cancelled before verification_started was stored: nothing runs
        started = time.monotonic()
        records, diff_artifact = check_workspace(
            action.commands,
            state=self.state,
            store=self.store,
            redactor=self.redactor,
            sandbox=self.sandbox,
            guard=self.guard,
            timeout_s=self.verifier_timeout_s,
        )
        if self.state.options.reviewers and all(r.passed for r in records):
            records += self._review(records, diff_artifact)
        elapsed = time.monotonic() - started
        gaps, decided = self._asking.before_complete(self.state, records)
        self.commit(
            [
                *decided,
                *after_verification(
                    self.state, records, elapsed_s=elapsed, diff_artifact=diff_artifact, gaps=gaps
                ),
            ]
        )

    def _review(
        self, records: list[ValidationRecord], diff_artifact: str | None
    ) -> list[ValidationRecord]:
        """The reviews of this revision not on record yet (``keel.runtime.reviews``)."""
        revision = self.state.mutation_revision
        evidence = {  # every command's record at this revision: the ones run now, and earlier
            r.command: r
            for r in (*self.state.validations, *records)
            if r.mutation_revision == revision and r.command in self.state.options.verify
        }
        reviewed: list[ValidationRecord] = []
        for name, agent in self.state.options.reviewers:
            done = self.state.latest_validation(review_command(name))
            if done is not None and done.mutation_revision == self.state.mutation_revision:
                continue  # reviewed at this revision already: asking again changes nothing
            if self.reviews is None:
                reviewed.append(no_reviewer(self.state, name, agent))
                continue
            reviewed.append(
                self.reviews.review(
                    state=lambda: self.state,
                    commit=self.commit,
                    should_stop=self.should_stop,
                    name=name,
                    agent=agent,
                    records=list(evidence.values()),
                    diff_artifact=diff_artifact,
                )
            )
        return reviewed


def _effect_happened(tool: Tool, ctx: ToolContext, intent: dict[str, str]) -> bool:
    """Whether a started call's intended change is there; a path that can no longer be
    checked (now a directory, now leading outside) means it is not."""
    try:
        return tool.effect_happened(ctx, intent)
    except ToolError:
        return False
