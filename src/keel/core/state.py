"""A run's state is a fold of its events.

``RunState.apply(event)`` is the only way state changes; the store keeps the
fold's result as a snapshot in the same transaction as the events, and any
process can rebuild the identical state from the events alone. The snapshot's
size depends on todos, changed files and validations, never on the number of
steps, so persisting a step costs O(new events).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from keel.core import children as kids
from keel.core.budget import Usage
from keel.core.children import ChildRecord
from keel.core.events import Event, EventType, NewEvent
from keel.core.guard import PLAN_FILE
from keel.core.records import (
    Grant,
    PendingRequest,
    RunOptions,
    Todo,
    ValidationRecord,
    canonical_json,
    in_plan_paths,
)
from keel.core.snapshot import snapshot_of, state_from_snapshot
from keel.core.status import RunStatus, check_transition
from keel.core.verifiers import cannot_run, review_command, signoff_command

RECENT_WINDOW = 3  # how many recent calls / errors the no-progress check looks at
NOTES_KEPT = 20
OUTSIDE_SHOWN = 20  # files named in an out-of-plan gap


@dataclass(frozen=True, kw_only=True)  # no slots: the fold copies its __dict__ (see _evolve)
class RunState:
    """Everything the next step of a run needs; a pure fold of the run's events."""

    run_id: str
    parent_id: str | None = None
    goal: str = ""
    workspace: str = ""
    options: RunOptions = field(default_factory=RunOptions)
    status: RunStatus = RunStatus.RUNNING
    reason: str | None = None  # stop reason, or what a waiting run waits for
    usage: Usage = field(default_factory=Usage)
    warned: tuple[str, ...] = ()  # budget dimensions already warned about
    todos: tuple[Todo, ...] = ()
    changed_files: dict[str, str] = field(default_factory=dict)  # path -> sha256
    mutation_revision: int = 0
    validations: tuple[ValidationRecord, ...] = ()
    pending: PendingRequest | None = None
    turn_calls: tuple[dict[str, Any], ...] = ()  # latest model turn's calls without outcome
    open_calls: dict[str, dict[str, Any]] = field(default_factory=dict)  # started, unfinished
    grants: dict[str, Grant] = field(default_factory=dict)  # unused approvals by call digest
    mode: str = "edit"
    plan: str | None = None
    approved_plan_sha256: str | None = None  # the plan a person approved; changing it asks
    plan_paths: tuple[str, ...] | None = None  # paths the approved plan names; None: any
    notes: tuple[str, ...] = ()
    recent_calls: tuple[str, ...] = ()  # signatures of the latest tool calls
    recent_errors: tuple[str, ...] = ()  # latest tool error messages, "" after a success
    failed_attempts: int = 0
    no_progress_step: int | None = None  # step at which no progress was detected
    truncated_turns: int = 0  # model turns running cut at the output length limit
    task_id: str | None = None
    result: dict[str, Any] | None = None
    # --- delegation (keel.core.children) ---
    children: dict[str, ChildRecord] = field(default_factory=dict)  # by child run id
    child_failure: dict[str, Any] | None = None  # a fail_fast child failed: the run fails
    escalation: dict[str, Any] | None = None  # a child failed: a person decides what next
    handoff: dict[str, Any] | None = None  # the run that took over (the run then completes)
    # --- steering (keel.runtime.steering) ---
    pause_requested: dict[str, Any] | None = None  # by, reason: pause at the next step boundary
    # --- middleware (keel.core.middleware) ---
    # Recorded decisions still to act on: "model" (before the next model call) and
    # "call:ID" (before a tool call), each the point's middleware_decided data in order.
    decisions: dict[str, tuple[dict[str, Any], ...]] = field(default_factory=dict)
    middleware_block: dict[str, Any] | None = None  # a deny around the model: the run stops
    last_seq: int = 0
    last_hash: str = ""  # chain hash of event last_seq (keel.core.chain); "" before any
    updated_at: str | None = None

    # --- folding -------------------------------------------------------------------

    @classmethod
    def from_events(cls, events: list[Event]) -> RunState:
        if not events:
            raise ValueError("a run has at least its run_created event")
        state = cls(run_id=events[0].run_id)
        for event in events:
            state = state.apply(event)
        return state

    def apply(self, event: Event) -> RunState:
        """The state after ``event``. Events must arrive in sequence order."""
        if event.seq != self.last_seq + 1:
            raise ValueError(f"event {event.seq} applied after {self.last_seq} on {self.run_id}")
        s = _APPLY[event.type](self, event.data)
        elapsed = float(event.data.get("elapsed_s", 0.0))
        usage = s.usage.add(wall_seconds=elapsed) if elapsed else s.usage
        stamp = event.recorded_at.isoformat()
        if s is self:
            return _evolve(
                s, usage=usage, last_seq=event.seq, last_hash=event.hash, updated_at=stamp
            )
        # ``s`` is a new object no one else has seen yet: finish it in place rather than
        # copying all fields a second time (the fold runs for every stored event).
        fields = s.__dict__
        fields["usage"] = usage
        fields["last_seq"] = event.seq
        fields["last_hash"] = event.hash
        fields["updated_at"] = stamp
        return s

    # --- derived views -------------------------------------------------------------

    def latest_validation(self, command: str) -> ValidationRecord | None:
        for record in reversed(self.validations):
            if record.command == command:
                return record
        return None

    def verification_gaps(self) -> list[str]:
        """Required verifiers without a pass at the current mutation revision: commands,
        then people's sign-offs (``keel.core.verifiers``)."""
        gaps = []
        for command in self.options.verify:
            record = self.latest_validation(command)
            name = self.options.verifier_name(command)
            shown = command if name == command else f"{name} ({command})"
            if record is None:
                gaps.append(f"{shown}: not run")
            elif record.mutation_revision != self.mutation_revision:
                gaps.append(
                    f"{shown}: last run at revision {record.mutation_revision}, "
                    f"files changed since (now {self.mutation_revision})"
                )
            elif not record.passed:
                why = cannot_run(record.exit_code)
                detail = f" (the command {why}: no change to the workspace fixes it)" if why else ""
                gaps.append(f"{shown}: failed with exit code {record.exit_code}{detail}")
        outside = self.changes_outside_plan()
        if outside:
            named = ", ".join(outside[:OUTSIDE_SHOWN])
            extra = len(outside) - OUTSIDE_SHOWN
            more = f" and {extra} more" if extra > 0 else ""
            gaps.append(
                f"changes outside the approved plan's paths: {named}{more} (the plan names "
                f"{', '.join(self.plan_paths or ()) or 'no paths'}); if they belong to the "
                "task, name them under Paths: with plan_write (a person approves the new plan)"
            )
        gaps += self.review_gaps()
        for name in self.options.signoffs:
            record = self.latest_validation(signoff_command(name))
            if record is None or record.mutation_revision != self.mutation_revision:
                gaps.append(f"{name}: needs a person's sign-off (keel approve --verifier {name})")
            elif not record.passed:
                gaps.append(f"{name}: {record.note or 'a person declined to sign off'}")
        return gaps

    def review_gaps(self) -> list[str]:
        """Reviewer agents without a review listing no blocking issue at this revision."""
        gaps = []
        for name, agent in self.options.reviewers:
            record = self.latest_validation(review_command(name))
            shown = f"{name} (reviewer agent {agent})"
            if record is None:
                gaps.append(f"{shown}: not reviewed yet (it reviews once the commands pass)")
            elif record.mutation_revision != self.mutation_revision:
                gaps.append(
                    f"{shown}: reviewed revision {record.mutation_revision}, files changed "
                    f"since (now {self.mutation_revision})"
                )
            elif not record.passed:
                gaps.append(f"{shown}: {record.unfixable or record.note or 'not passed'}")
        return gaps

    def unsigned(self) -> list[str]:
        """Sign-offs without a person's approval at the current revision (declined ones
        included: the agent works on, then asks again)."""
        unsigned = []
        for name in self.options.signoffs:
            record = self.latest_validation(signoff_command(name))
            if (
                record is None
                or record.mutation_revision != self.mutation_revision
                or not record.passed
            ):
                unsigned.append(name)
        return unsigned

    def unfixable_gaps(self) -> list[str]:
        """Command verifiers that could not run at all at this revision (126, 127), and
        reviewers that could not give a review."""
        found = []
        for command in self.options.verify:
            record = self.latest_validation(command)
            if record is not None and record.mutation_revision == self.mutation_revision:
                why = cannot_run(record.exit_code)
                if why and not record.passed:
                    found.append(f"{self.options.verifier_name(command)}: the command {why}")
        for name, _ in self.options.reviewers:
            record = self.latest_validation(review_command(name))
            current = record is not None and record.mutation_revision == self.mutation_revision
            if current and record is not None and record.unfixable:
                found.append(f"{name}: {record.unfixable}")
        return found

    def changes_outside_plan(self) -> list[str]:
        """Changed files the approved plan's ``Paths`` do not name (none without paths)."""
        if self.plan_paths is None:
            return []
        return sorted(
            path
            for path in self.changed_files
            if path != PLAN_FILE and not in_plan_paths(path, self.plan_paths)
        )

    def unfinished_todos(self) -> list[str]:
        return [t.content for t in self.todos if t.status != "completed"]

    # --- snapshot ------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return snapshot_of(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunState:
        return state_from_snapshot(d)


def _evolve(state: RunState, **changes: Any) -> RunState:
    """A copy of ``state`` with ``changes``: what ``dataclasses.replace`` does, without
    re-running ``__init__`` (the fold runs once per stored event, so this is hot)."""
    new = object.__new__(RunState)
    fields = new.__dict__
    fields.update(state.__dict__)
    fields.update(changes)
    return new


def transition(state: RunState, to: RunStatus, reason: str | None, **extra: Any) -> NewEvent:
    """The ``status_changed`` event that moves ``state`` to ``to``; raises InvalidTransition."""
    stored = check_transition(state.status, to, reason)
    return NewEvent(
        type=EventType.STATUS_CHANGED,
        data={"from": state.status.value, "to": to.value, "reason": stored, **extra},
    )


def call_signature(tool: str, arguments: Any) -> str:
    return f"{tool}:{canonical_json(arguments)}"


# --- one function per event type -------------------------------------------------------


def _push(items: tuple[str, ...], item: str, keep: int) -> tuple[str, ...]:
    return (*items, item)[-keep:]


def _run_created(s: RunState, d: dict[str, Any]) -> RunState:
    options = RunOptions.from_dict(d.get("options", {}))
    return _evolve(
        s,
        parent_id=d.get("parent_id"),
        goal=d.get("goal", ""),
        workspace=d.get("workspace", ""),
        options=options,
        status=RunStatus(d.get("status", RunStatus.RUNNING.value)),
        mode=options.mode,
        task_id=d.get("task_id"),
    )


def _status_changed(s: RunState, d: dict[str, Any]) -> RunState:
    to = RunStatus(d["to"])
    pending = s.pending if to is RunStatus.WAITING else None
    result = d.get("result", s.result)
    return _evolve(
        s,
        status=to,
        reason=d.get("reason"),
        pending=pending,
        result=result,
        pause_requested=s.pause_requested if to in PAUSE_KEPT_THROUGH else None,
    )


# A pause request outlives only these moves: the model asking to finish (verifiers run,
# and a run sent back to work pauses then). Pausing, waiting for a person or ending
# answers it: the run stopped, and a person's next decision (resume, approve, answer)
# means go on.
PAUSE_KEPT_THROUGH = frozenset({RunStatus.VERIFYING, RunStatus.RUNNING})


def _model_responded(s: RunState, d: dict[str, Any]) -> RunState:
    """A turn: its usage by kind, and its calls to run — none when the turn was cut at
    the length limit (they are incomplete) or refused. Consecutive cut turns are
    counted here, so a resumed run counts them exactly as the original process did."""
    finish = d.get("finish_reason")
    calls = (
        tuple(
            {"id": c["id"], "name": c["name"], "arguments": c["arguments"]}
            for c in d.get("tool_calls", ())
        )
        if calls_run(finish)
        else ()
    )
    return _evolve(
        s,
        usage=s.usage.add_turn(d.get("usage") or {}, float(d.get("cost", 0.0))),
        turn_calls=calls,
        truncated_turns=s.truncated_turns + 1 if finish == "length" else 0,
        decisions=_without(s.decisions, "model"),
    )


UNRUN_FINISH_REASONS = frozenset({"length", "content_filter", "refusal"})


def calls_run(finish_reason: str | None) -> bool:
    """Whether the tool calls of a turn that ended with ``finish_reason`` are run: not
    when it was cut at the length limit (their arguments are incomplete) or refused.
    A log written before finish reasons were recorded has none: its calls run."""
    return finish_reason not in UNRUN_FINISH_REASONS


def _answered(s: RunState, call_id: str | None) -> tuple[dict[str, Any], ...]:
    return tuple(c for c in s.turn_calls if c["id"] != call_id)


def _tool_started(s: RunState, d: dict[str, Any]) -> RunState:
    open_calls = {**s.open_calls, d["call_id"]: {k: d.get(k) for k in _OPEN_CALL_KEYS}}
    return _evolve(s, open_calls=open_calls, grants=_spend(s, d))


def _spend(s: RunState, d: dict[str, Any]) -> dict[str, Grant]:
    """The grants left once the attempt of call ``d["call_id"]`` began or ended.

    An attempt uses up the grant it names (``"grant"``) and any grant given to its
    own call id, whatever its outcome: a granted call that fails (its pre-check,
    the policy, the tool) leaves no approval behind for a later call.
    """
    if not s.grants:
        return s.grants
    spent, call_id = d.get("grant"), d.get("call_id")
    if spent not in s.grants and all(g.call_id != call_id for g in s.grants.values()):
        return s.grants
    return {k: g for k, g in s.grants.items() if k != spent and g.call_id != call_id}


_OPEN_CALL_KEYS = ("call_id", "key", "tool", "arguments", "effect", "recovery", "intent")


def _process_started(s: RunState, d: dict[str, Any]) -> RunState:
    """The open call's program started: remember where, so a resume can find it running."""
    call = s.open_calls.get(d.get("call_id", ""))
    if call is None:
        return s
    process = {k: d.get(k) for k in ("pgid", "host", "boot_id", "start_ticks", "timeout_s")}
    return _evolve(s, open_calls={**s.open_calls, d["call_id"]: {**call, "process": process}})


def _process_settled(s: RunState, d: dict[str, Any]) -> RunState:
    """A resume dealt with the call's program (gone, waited for, killed, or elsewhere)."""
    call = s.open_calls.get(d.get("call_id", ""))
    if call is None:
        return s
    settled = {**call, "settled": str(d.get("outcome", ""))}
    return _evolve(s, open_calls={**s.open_calls, d["call_id"]: settled})


def _with_files(files: dict[str, str], changed: dict[str, str]) -> dict[str, str]:
    """``files`` with ``changed``'s hashes set: a new dict (states are never changed in
    place), or ``files`` itself when nothing changed. A copy then an update, not
    ``{**files, **changed}``: copying a dict clones its table at once, so a write step of
    a run with a thousand changed files copies them in half the time."""
    if not changed:
        return files
    merged = files.copy()
    merged.update(changed)
    return merged


def _tool_finished(s: RunState, d: dict[str, Any]) -> RunState:
    if s.escalation is not None and d.get("call_id") == s.escalation.get("retry_call"):
        s = _evolve(s, escalation=None)  # the retry a person asked for was made
    changed: dict[str, str] = d.get("changed_files") or {}
    open_calls = {k: v for k, v in s.open_calls.items() if k != d.get("call_id")}
    signature = call_signature(d.get("tool", ""), d.get("arguments"))
    return _evolve(
        s,
        grants=_spend(s, d),
        usage=s.usage.add(tool_calls=1),
        turn_calls=_answered(s, d.get("call_id")),
        open_calls=open_calls,
        decisions=_without(s.decisions, f"call:{d.get('call_id')}"),
        changed_files=_with_files(s.changed_files, changed),
        mutation_revision=s.mutation_revision + 1 if changed else s.mutation_revision,
        recent_calls=_push(s.recent_calls, signature, RECENT_WINDOW),
        recent_errors=_push(s.recent_errors, "", RECENT_WINDOW),
        no_progress_step=_still_stuck(s, signature, ""),
    )


def _tool_failed(s: RunState, d: dict[str, Any]) -> RunState:
    if s.escalation is not None and d.get("call_id") == s.escalation.get("retry_call"):
        s = _evolve(s, escalation=None)  # the retry was tried; its failure is the model's
    open_calls = {k: v for k, v in s.open_calls.items() if k != d.get("call_id")}
    changed: dict[str, str] = d.get("changed_files") or {}
    signature = call_signature(d.get("tool", ""), d.get("arguments"))
    message = str(d.get("message", ""))
    return _evolve(
        s,
        grants=_spend(s, d),
        usage=s.usage.add(tool_calls=1),
        turn_calls=_answered(s, d.get("call_id")),
        open_calls=open_calls,
        decisions=_without(s.decisions, f"call:{d.get('call_id')}"),
        changed_files=_with_files(s.changed_files, changed),
        mutation_revision=s.mutation_revision + 1 if changed else s.mutation_revision,
        recent_calls=_push(s.recent_calls, signature, RECENT_WINDOW),
        recent_errors=_push(s.recent_errors, message, RECENT_WINDOW),
        failed_attempts=s.failed_attempts + 1,
        no_progress_step=_still_stuck(s, signature, message),
    )


def _still_stuck(s: RunState, signature: str, error: str) -> int | None:
    """Keep the no-progress mark only while the repetition goes on.

    A call that continues neither the streak of identical calls nor the streak of
    identical errors is a change of course: a later repetition then earns its own
    replan note instead of failing the run at once.
    """
    if s.no_progress_step is None:
        return None
    same_call = bool(s.recent_calls) and s.recent_calls[-1] == signature
    same_error = bool(error) and bool(s.recent_errors) and s.recent_errors[-1] == error
    return s.no_progress_step if same_call or same_error else None


def _call_reconciled(s: RunState, d: dict[str, Any]) -> RunState:
    changed: dict[str, str] = d.get("changed_files") or {}
    keep_open = d.get("outcome") == "rerun"
    open_calls = (
        s.open_calls
        if keep_open
        else {k: v for k, v in s.open_calls.items() if k != d.get("call_id")}
    )
    return _evolve(
        s,
        open_calls=open_calls,
        changed_files=_with_files(s.changed_files, changed),
        mutation_revision=s.mutation_revision + 1 if changed else s.mutation_revision,
    )


def _approval_requested(s: RunState, d: dict[str, Any]) -> RunState:
    kind = d.get("kind", "approval")
    digest = d.get("digest")
    # Asking again for a call supersedes its old (expired) grant.
    grants = {k: g for k, g in s.grants.items() if k != digest} if digest in s.grants else s.grants
    return _evolve(
        s,
        grants=grants,
        pending=PendingRequest(
            kind=kind,
            call_id=d["call_id"],
            tool=d.get("tool"),
            arguments=d.get("arguments"),
            digest=d.get("digest"),
            risk=d.get("risk"),
            expires_at=d.get("expires_at"),
        ),
    )


def _approval_granted(s: RunState, d: dict[str, Any]) -> RunState:
    if d.get("kind") == "child_failure" and s.escalation is not None:
        return _evolve(s, pending=None, escalation={**s.escalation, "decision": "retry"})
    grants = s.grants
    if d.get("digest"):
        grant = Grant(call_id=d["call_id"], tool=d.get("tool"), expires_at=d.get("expires_at"))
        grants = {**s.grants, d["digest"]: grant}
    return _evolve(s, pending=None, grants=grants)


def _approval_denied(s: RunState, d: dict[str, Any]) -> RunState:
    if d.get("kind") == "child_failure" and s.escalation is not None:
        decision = {
            **s.escalation,
            "decision": "give_up",
            "by": d.get("by"),
            "why": d.get("reason"),
        }
        return _evolve(s, pending=None, escalation=decision)
    return _evolve(s, pending=None)


def _input_requested(s: RunState, d: dict[str, Any]) -> RunState:
    return _evolve(
        s, pending=PendingRequest(kind="question", call_id=d["call_id"], question=d["question"])
    )


def _input_received(s: RunState, d: dict[str, Any]) -> RunState:
    escalation = s.escalation
    if escalation is not None and d.get("call_id") == escalation.get("call_id"):
        escalation = None  # a person's instruction about a failed child: the model has it
    return _evolve(
        s, pending=None, turn_calls=_answered(s, d.get("call_id")), escalation=escalation
    )


def _budget_warning(s: RunState, d: dict[str, Any]) -> RunState:
    dim = str(d["dimension"])
    return s if dim in s.warned else _evolve(s, warned=(*s.warned, dim))


def _todo_updated(s: RunState, d: dict[str, Any]) -> RunState:
    return _evolve(s, todos=tuple(Todo(**t) for t in d.get("todos", ())))


def _plan_written(s: RunState, d: dict[str, Any]) -> RunState:
    return _evolve(s, plan=d.get("content"))


def _plan_approved(s: RunState, d: dict[str, Any]) -> RunState:
    paths = d.get("paths")
    return _evolve(
        s,
        approved_plan_sha256=d.get("plan_sha256"),
        plan_paths=None if paths is None else tuple(str(p) for p in paths),
    )


def _mode_changed(s: RunState, d: dict[str, Any]) -> RunState:
    return _evolve(s, mode=d["to"])


def _note_added(s: RunState, d: dict[str, Any]) -> RunState:
    return _evolve(s, notes=_push(s.notes, str(d.get("text", "")), NOTES_KEPT))


def _verification_done(s: RunState, d: dict[str, Any]) -> RunState:
    records = tuple(ValidationRecord.from_dict(r) for r in d.get("records", ()))
    return _evolve(s, validations=s.validations + records)


def _signoff_requested(s: RunState, d: dict[str, Any]) -> RunState:
    """The commands passed and a person must sign off: the verification's records, and
    the run waits for ``keel approve --verifier NAME``."""
    records = tuple(ValidationRecord.from_dict(r) for r in d.get("records", ()))
    name = str(d["verifier"])
    pending = PendingRequest(kind="signoff", call_id=f"signoff:{name}", question=name)
    return _evolve(s, validations=s.validations + records, pending=pending)


def _signoff_recorded(s: RunState, d: dict[str, Any]) -> RunState:
    """A person's sign-off (or refusal), bound to the revision they looked at."""
    record = ValidationRecord(
        command=signoff_command(str(d["verifier"])),
        exit_code=0 if d.get("passed") else 1,
        duration_s=0.0,
        artifact=d.get("artifact"),
        mutation_revision=int(d["mutation_revision"]),
        file_hashes=dict(s.changed_files),
        passed=bool(d.get("passed")),
        note=d.get("note"),
    )
    return _evolve(s, validations=(*s.validations, record), pending=None)


def _no_progress(s: RunState, d: dict[str, Any]) -> RunState:
    return _evolve(s, no_progress_step=s.usage.steps)


def _task_linked(s: RunState, d: dict[str, Any]) -> RunState:
    return _evolve(s, task_id=d.get("task_id"))


def _workspace_changed(s: RunState, d: dict[str, Any]) -> RunState:
    """Files changed while the run was stopped: their hashes now, and a new revision (so
    verifications made before no longer count)."""
    changed = _with_files(s.changed_files, d["changed_files"])
    return _evolve(s, changed_files=changed, mutation_revision=s.mutation_revision + 1)


def _policy_changed(s: RunState, d: dict[str, Any]) -> RunState:
    """The policy read again on resume governs every later decision (and every process)."""
    return _evolve(s, options=replace(s.options, policy=d.get("policy")))


def _subagent_spawned(s: RunState, d: dict[str, Any]) -> RunState:
    return _evolve(s, children=kids.spawned(s.children, d))


def _subagent_finished(s: RunState, d: dict[str, Any]) -> RunState:
    """A child ended: its reservation goes, its tokens and cost count as the parent's, and
    a failure under fail_fast or escalate marks what the decision must do next."""
    children, usage, news = kids.finished(s.children, s.usage, d)
    if not news:
        return s
    policy, child = d.get("policy"), str(d.get("child_run_id"))
    failure = {"child_run_id": child, "status": d.get("status"), "reason": d.get("reason")}
    if policy == "fail_fast":
        return _evolve(s, children=children, usage=usage, child_failure=failure)
    if policy == "escalate":
        escalation = {
            **failure,
            "call_id": f"escalate:{child}",
            "retry_call": f"retry:{child}",
            "agent": d.get("agent"),
            "task": d.get("task"),
            "inputs": d.get("inputs"),
            "decision": None,
        }
        return _evolve(s, children=children, usage=usage, escalation=escalation)
    return _evolve(s, children=children, usage=usage)


def _waiting_on_child(s: RunState, d: dict[str, Any]) -> RunState:
    pending = PendingRequest(
        kind="child",
        call_id=str(d.get("call_id", "")),
        tool=d.get("tool"),
        arguments={"child_run_id": d.get("child_run_id"), "what": d.get("what")},
    )
    return _evolve(s, pending=pending)


def _pause_requested(s: RunState, d: dict[str, Any]) -> RunState:
    return _evolve(s, pause_requested={"by": d.get("by"), "reason": d.get("reason")})


def _handed_off(s: RunState, d: dict[str, Any]) -> RunState:
    return _evolve(s, handoff={"run_id": d.get("run_id"), "agent": d.get("agent")})


def _middleware_decided(s: RunState, d: dict[str, Any]) -> RunState:
    """A middleware's decision the loop acts on next: before the model or a tool call it
    waits in ``decisions`` (so a resume replays it); a deny around the model stops the
    run (``middleware_block``). Other points' decisions were applied where they were
    made; their events are the record."""
    point, kind = d.get("point"), d.get("decision")
    if kind in ("deny",) and point in ("before_model", "after_model"):
        s = _evolve(s, middleware_block=dict(d))
    key = {"before_model": "model", "before_tool": f"call:{d.get('call_id')}"}.get(str(point))
    if key is None:
        return s  # an "error" record is kept too: the point was asked, and answered
    return _evolve(s, decisions={**s.decisions, key: (*s.decisions.get(key, ()), dict(d))})


def _without(decisions: dict[str, tuple[dict[str, Any], ...]], key: str) -> dict[str, Any]:
    if key not in decisions:
        return decisions
    return {k: v for k, v in decisions.items() if k != key}


def _context_compacted(s: RunState, d: dict[str, Any]) -> RunState:
    """A compaction: a model-written summary's tokens and cost count as the run's (its
    call is not a step); a compaction without one changes nothing here."""
    summary = d.get("summary")
    if not isinstance(summary, dict):
        return s
    reported = summary.get("usage")
    usage: dict[str, Any] = reported if isinstance(reported, dict) else {}
    tokens: int = sum(_whole(usage.get(kind)) for kind in ("input_tokens", "output_tokens"))
    return _evolve(
        s, usage=s.usage.absorb({**usage, "tokens": tokens, "cost": summary.get("cost", 0.0)})
    )


def _whole(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _unchanged(s: RunState, d: dict[str, Any]) -> RunState:
    return s


_APPLY = {
    EventType.RUN_CREATED: _run_created,
    EventType.STATUS_CHANGED: _status_changed,
    EventType.RUN_RESUMED: _unchanged,
    EventType.MODEL_REQUESTED: _unchanged,
    EventType.MODEL_RESPONDED: _model_responded,
    EventType.TOOL_STARTED: _tool_started,
    EventType.TOOL_FINISHED: _tool_finished,
    EventType.TOOL_FAILED: _tool_failed,
    EventType.CALL_RECONCILED: _call_reconciled,
    EventType.APPROVAL_REQUESTED: _approval_requested,
    EventType.APPROVAL_GRANTED: _approval_granted,
    EventType.APPROVAL_DENIED: _approval_denied,
    EventType.INPUT_REQUESTED: _input_requested,
    EventType.INPUT_RECEIVED: _input_received,
    EventType.BUDGET_WARNING: _budget_warning,
    EventType.BUDGET_EXHAUSTED: _unchanged,
    EventType.TODO_UPDATED: _todo_updated,
    EventType.PLAN_WRITTEN: _plan_written,
    EventType.PLAN_APPROVED: _plan_approved,
    EventType.MODE_CHANGED: _mode_changed,
    EventType.NOTE_ADDED: _note_added,
    EventType.VERIFICATION_STARTED: _unchanged,
    EventType.VERIFICATION_PASSED: _verification_done,
    EventType.VERIFICATION_FAILED: _verification_done,
    EventType.SUBAGENT_SPAWNED: _subagent_spawned,
    EventType.SUBAGENT_FINISHED: _subagent_finished,
    EventType.NO_PROGRESS_DETECTED: _no_progress,
    EventType.RETRY_SCHEDULED: _unchanged,
    EventType.CONTEXT_COMPACTED: _context_compacted,
    EventType.TASK_LINKED: _task_linked,
    EventType.PROCESS_STARTED: _process_started,
    EventType.PROCESS_SETTLED: _process_settled,
    EventType.LEASE_TAKEN_OVER: _unchanged,
    EventType.WORKSPACE_CHANGED: _workspace_changed,
    EventType.POLICY_CHANGED: _policy_changed,
    EventType.WAITING_ON_CHILD: _waiting_on_child,
    EventType.HANDED_OFF: _handed_off,
    EventType.PAUSE_REQUESTED: _pause_requested,
    EventType.MESSAGE_RECEIVED: _unchanged,  # the transcript shows it to the model
    EventType.FOLLOW_UP_CREATED: _unchanged,
    EventType.MIDDLEWARE_DECIDED: _middleware_decided,
    EventType.TRACE_STARTED: _unchanged,
    EventType.SIGNOFF_REQUESTED: _signoff_requested,
    EventType.SIGNOFF_RECORDED: _signoff_recorded,
}

__all__ = ["UNRUN_FINISH_REASONS", "RunState", "call_signature", "calls_run", "transition"]
