"""The loop's decision, as pure code: run state in, next action out.

Nothing here does I/O or reads a clock: the time comes in ``Situation.now``,
tools are known through a ``ToolCatalog`` and permissions through a ``Gate``.
The driver (``keel.loop.driver``) performs the action, stores its events and
asks again, so every rule of the harness — budgets, no-progress, policy,
approvals, completion by evidence — is decided here and tested without I/O.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from keel.core.budget import Dimension
from keel.core.children import output_problems
from keel.core.errors import ToolError
from keel.core.events import EventType, NewEvent
from keel.core.records import canonical_json
from keel.core.state import RunState, transition
from keel.core.status import RunStatus
from keel.loop.actions import (
    Action,
    Commit,
    Halt,
    RunTool,
    RunVerifiers,
)
from keel.loop.middleware_rules import blocked, call_decision, model_call, stricter
from keel.loop.outcomes import failed_event, finished_event, loose_arguments, note_event
from keel.loop.reconcile import reconcile
from keel.loop.situation import Gate, Situation, ToolCatalog, Verdict
from keel.policy.approvals import (
    approval_digest,
    approval_request,
    expires_at,
    grant_usable,
    is_expired,
    usable_ttl,
)
from keel.policy.modes import Mode
from keel.policy.plans import (
    follow_on_mode,
    plan_approved_event,
    plan_approved_events,
    plan_change,
    plan_change_decision,
    plan_digest,
    todos_from_plan,
)

NO_PROGRESS_REPEATS = 3  # same call or same error this many times running
NO_PROGRESS_GRACE_STEPS = 2  # model turns allowed after the replan note
CONVERGE_NOTE = (
    "Budget warning: {dims} at or past 80 % of the limit. Converge now: finish the most "
    "important remaining todo, then request completion."
)
REPLAN_NOTE = (
    "No progress: {what}. Stop repeating it. Re-read the goal and the last results, "
    "write a different plan with todo_write, and take a different next step."
)
PLAN_MODE_REPLAN_NOTE = (
    "No progress: {what}. Stop repeating it: you are in plan mode, and writes and commands "
    "stay refused until a person approves your plan. Write the plan with plan_write, then "
    "call plan_exit with a short summary to ask for approval."
)
CONTROL_TOOLS = frozenset({"request_completion", "ask_user", "plan_exit"})
SIDE_EFFECTS = frozenset({"write", "execute", "external"})
DISPATCH_DIMENSIONS = (Dimension.TOOL_CALLS, Dimension.WALL_TIME)  # what running a call uses


# --- the decision ------------------------------------------------------------------------


def decide(state: RunState, sit: Situation) -> Action:
    """The next thing to do for ``state``. Pure: same input, same action."""
    status = state.status
    if status.terminal:
        return Halt(status=status)
    if status is RunStatus.QUEUED:
        return Commit(events=(transition(state, RunStatus.RUNNING, None),))
    if status is RunStatus.PAUSED:
        # Only a person's resume moves a paused run on (``keel.runtime.steering``); a
        # process that finds one paused under it (a pause landed as it took the run)
        # stops driving it.
        return Halt(status=status)
    if status is RunStatus.WAITING:
        return _decide_waiting(state, sit)
    if status is RunStatus.VERIFYING:
        return RunVerifiers(commands=_to_verify(state))
    # running
    if state.pause_requested is not None and not state.open_calls:
        # A step boundary: nothing started is unfinished, so the run pauses here and
        # starts nothing new (its model's remaining calls run after the resume).
        return Commit(events=(pause_event(state),))
    stopped = blocked(state)
    if stopped is not None:
        return stopped
    delegated = _delegation(state)
    if delegated is not None:
        return delegated
    if state.open_calls:
        return reconcile(state, sit, next(iter(state.open_calls.values())))
    if state.turn_calls:
        # The turn was already paid for: its calls run unless they would overrun
        # the dimensions running them consumes. Steps, tokens and cost stop the
        # next model turn instead.
        exhausted = _exhausted(state, DISPATCH_DIMENSIONS)
        return exhausted if exhausted is not None else _dispatch_next(state, sit)
    exhausted = _exhausted(state, tuple(Dimension))
    if exhausted is not None:
        return exhausted
    return _before_model(state, sit)


def _to_verify(state: RunState) -> tuple[str, ...]:
    """The verifiers to run: each one without a pass at the current revision. One that
    passed at this revision already stands as evidence (a revision changes with every
    change to the workspace, the run's or anyone's), so a run that comes back after a
    person's sign-off does not run its tests again."""
    return tuple(
        command
        for command in state.options.verify
        if not (
            (record := state.latest_validation(command)) is not None
            and record.passed
            and record.mutation_revision == state.mutation_revision
        )
    )


def pause_event(state: RunState) -> NewEvent:
    """The move to ``paused`` a pause request asks of ``state``: reason ``paused by BY``
    (and ``: REASON`` when the request gave one)."""
    request = state.pause_requested or {}
    reason = f"paused by {request.get('by') or 'someone'}"
    if request.get("reason"):
        reason += f": {request['reason']}"
    return transition(state, RunStatus.PAUSED, reason)


def _delegation(state: RunState) -> Action | None:
    """What a child's end, a waiting child or a handoff asks of the parent, if anything.

    Checked before anything else a running parent does: a fail_fast child failed (the
    run fails), a child failed under escalate (a person decides: retry, give up or
    instruct), a child the parent waits for waits for a person (so does the parent), or
    the run handed its work over (it completes, naming who took over).
    """
    if state.child_failure is not None:
        child = state.child_failure["child_run_id"]
        return Commit(
            events=(
                transition(
                    state,
                    RunStatus.FAILED,
                    f"child_failed:{child}",
                    result={
                        "unfinished": state.unfinished_todos(),
                        "child": dict(state.child_failure),
                    },
                ),
            )
        )
    if state.escalation is not None:
        return _escalation(state, state.escalation)
    pending = state.pending
    if pending is not None and pending.kind == "child":
        child = (pending.arguments or {}).get("child_run_id")
        return Commit(events=(transition(state, RunStatus.WAITING, f"child_waiting:{child}"),))
    if state.handoff is not None:
        # Responsibility moved: the run completes without verifiers of its own (the run
        # that took over is verified when it completes), through verifying as the
        # transition table requires.
        target = state.handoff.get("run_id")
        handing = replace(state, status=RunStatus.VERIFYING)
        return Commit(
            events=(
                transition(state, RunStatus.VERIFYING, f"handing off to {target}"),
                transition(
                    handing,
                    RunStatus.COMPLETED,
                    f"handed_off:{target}",
                    result={
                        "outcome": "handed_off",
                        "handed_off_to": target,
                        "agent": state.handoff.get("agent"),
                        "summary": f"handed off to run {target}",
                        "unfinished": state.unfinished_todos(),
                    },
                ),
            )
        )
    return None


def _escalation(state: RunState, escalation: dict[str, Any]) -> Action:
    child = escalation["child_run_id"]
    decision = escalation.get("decision")
    if decision == "give_up":
        return Commit(
            events=(
                transition(
                    state,
                    RunStatus.FAILED,
                    f"child_failed:{child}",
                    result={
                        "unfinished": state.unfinished_todos(),
                        "child": {
                            k: escalation.get(k) for k in ("child_run_id", "status", "reason")
                        },
                        "given_up_by": escalation.get("by"),
                        "why": escalation.get("why"),
                    },
                ),
            )
        )
    if decision == "retry":
        return RunTool(
            call_id=str(escalation["retry_call"]),
            tool="agent_spawn",
            arguments={
                "agent": escalation.get("agent"),
                "task": escalation.get("task") or "",
                "inputs": escalation.get("inputs"),
                "background": True,
                "on_failure": "escalate",
            },
            effect="state",
            recovery="idempotent",
        )
    return Commit(
        events=(
            NewEvent(
                type=EventType.APPROVAL_REQUESTED,
                data={
                    "kind": "child_failure",
                    "call_id": escalation["call_id"],
                    "tool": "agent_spawn",
                    "arguments": {
                        "child_run_id": child,
                        "agent": escalation.get("agent"),
                        "task": escalation.get("task"),
                        "status": escalation.get("status"),
                        "reason": escalation.get("reason"),
                    },
                    "risk": "medium",
                    "why": (
                        f"child {child} ({escalation.get('agent')}) ended "
                        f"{escalation.get('status')}: {escalation.get('reason')}. Approve to "
                        "retry with a fresh child, deny with a reason to give up (the run "
                        "fails), or answer with an instruction for this run"
                    ),
                },
            ),
            transition(state, RunStatus.WAITING, f"child_failure:{child}"),
        )
    )


def _decide_waiting(state: RunState, sit: Situation) -> Action:
    pending = state.pending
    if pending is not None and pending.kind == "child":
        child = str((pending.arguments or {}).get("child_run_id"))
        now = sit.child_statuses.get(child)
        if now is not None and now != RunStatus.WAITING.value:
            note = (
                f"Child run {child} no longer waits for a person (it is {now} now). Collect "
                f'its result with agent_wait(["{child}"]) or agent_result("{child}").'
            )
            return Commit(events=(note_event(note), transition(state, RunStatus.RUNNING, None)))
        return Halt(status=RunStatus.WAITING)
    if pending is not None and pending.expires_at and is_expired(pending.expires_at, sit.now):
        return Commit(
            events=(
                transition(
                    state,
                    RunStatus.FAILED,
                    "approval_timeout",
                    result={"unfinished": state.unfinished_todos(), "expired": pending.to_dict()},
                ),
            )
        )
    return Halt(status=RunStatus.WAITING)


def _exhausted(state: RunState, dimensions: tuple[Dimension, ...]) -> Commit | None:
    budget = state.options.budget
    dim = budget.exhausted(state.usage, dimensions)
    if dim is None:
        return None
    used = state.usage.used(dim)
    return Commit(
        events=(
            NewEvent(
                type=EventType.BUDGET_EXHAUSTED,
                data={"dimension": dim.value, "used": used, "limit": budget.limit(dim)},
            ),
            transition(
                state,
                RunStatus.FAILED,
                f"budget_exhausted:{dim.value}",
                result={"unfinished": state.unfinished_todos(), "usage": state.usage.to_dict()},
            ),
        )
    )


def _before_model(state: RunState, sit: Situation) -> Action:
    budget = state.options.budget
    fresh = [d for d in budget.warnings(state.usage) if d.value not in state.warned]
    if fresh:
        events = [
            NewEvent(
                type=EventType.BUDGET_WARNING,
                data={
                    "dimension": d.value,
                    "used": state.usage.used(d),
                    "limit": budget.limit(d),
                },
            )
            for d in fresh
        ]
        dims = ", ".join(_dimension_label(d) for d in fresh)
        events.append(note_event(CONVERGE_NOTE.format(dims=dims)))
        return Commit(events=tuple(events))
    repeated = _repetition(state)
    if repeated is not None:
        if state.no_progress_step is None:
            # In plan mode the way forward is the plan, not another todo list.
            replan = PLAN_MODE_REPLAN_NOTE if state.mode == Mode.PLAN.value else REPLAN_NOTE
            return Commit(
                events=(
                    NewEvent(
                        type=EventType.NO_PROGRESS_DETECTED,
                        data={"what": repeated, "step": state.usage.steps},
                    ),
                    note_event(replan.format(what=repeated)),
                )
            )
        if state.usage.steps >= state.no_progress_step + NO_PROGRESS_GRACE_STEPS:
            return Commit(
                events=(
                    transition(
                        state,
                        RunStatus.FAILED,
                        "no_progress",
                        result={"unfinished": state.unfinished_todos(), "repeated": repeated},
                    ),
                )
            )
    return model_call(state, sit)


def _dimension_label(dim: Dimension) -> str:
    return dim.value.replace("_", " ")


def _repetition(state: RunState) -> str | None:
    """What the run keeps repeating, if the last calls or errors are all the same."""
    calls = state.recent_calls
    if len(calls) >= NO_PROGRESS_REPEATS and len(set(calls[-NO_PROGRESS_REPEATS:])) == 1:
        return f"the same call {calls[-1][:200]} {NO_PROGRESS_REPEATS} times running"
    errors = state.recent_errors
    if (
        len(errors) >= NO_PROGRESS_REPEATS
        and errors[-1]
        and len(set(errors[-NO_PROGRESS_REPEATS:])) == 1
    ):
        return f"the same error {NO_PROGRESS_REPEATS} times running: {errors[-1][:200]}"
    return None


# --- one tool call -----------------------------------------------------------------------


def _next_call(state: RunState) -> dict[str, Any]:
    """Calls run in the model's order, except that completion waits for the others."""
    for call in state.turn_calls:
        if call["name"] != "request_completion":
            return call
    return state.turn_calls[0]


def _dispatch_next(state: RunState, sit: Situation) -> Action:
    names = {c["name"] for c in state.turn_calls}
    if "ask_user" in names and len(state.turn_calls) > 1:
        mixed = _mixed_with_question(state, sit)
        if mixed is not None:
            return mixed
        extra = _second_question(state)
        if extra is not None:
            return extra
    call = _next_call(state)
    call_id, name, raw = call["id"], call["name"], call["arguments"]
    try:
        info = sit.catalog.describe(name)
    except ToolError as exc:
        return Commit(
            events=(failed_event(call_id, name, loose_arguments(raw), "unknown_tool", str(exc)),)
        )
    try:
        args = sit.catalog.validate(name, raw)
    except ToolError as exc:
        return Commit(
            events=(
                failed_event(call_id, name, loose_arguments(raw), "invalid_arguments", str(exc)),
            )
        )

    decided = call_decision(state, sit, call_id, name, args)
    if decided.done is not None:
        return decided.done
    args = decided.arguments if decided.arguments is not None else args
    mode = Mode(state.mode)
    verdict: Verdict = sit.gate.decide(name, info.effect, args, mode=mode, workspace=sit.workspace)
    verdict = stricter(verdict, decided.ask)
    if verdict.action != "deny":
        # An approved plan is changed only with a person's approval.
        guarded = plan_change_decision(state, name, info.effect, args, workspace=sit.workspace)
        if guarded is not None and (guarded.action == "deny" or verdict.action == "allow"):
            verdict = guarded  # the stricter of the two (the guard only asks or denies)
    if verdict.action == "deny":
        message = f"policy_denied: {verdict.reason} (rule: {verdict.rule})"
        events = [failed_event(call_id, name, args, "policy_denied", message)]
        if verdict.permanent and state.recent_errors[-2:] == (message, message):
            events.append(
                transition(
                    state,
                    RunStatus.BLOCKED,
                    f"policy forbids {name}: {verdict.reason} (rule: {verdict.rule})",
                    result={"unfinished": state.unfinished_todos()},
                )
            )
        return Commit(events=tuple(events))

    if name == "plan_exit":
        return _plan_exit(state, sit, call_id, args)
    # Hashing the call is only needed when an approval can be asked for or used up.
    needs_digest = verdict.action == "ask" or bool(state.grants)
    digest = approval_digest(name, args, str(sit.workspace)) if needs_digest else ""
    usable = needs_digest and grant_usable(state, digest, sit.now)
    if verdict.action == "ask" and not usable:
        return _ask_approval(state, sit, call_id, name, info.effect, args, verdict, digest)
    new_plan = plan_change(state, name, args)
    if new_plan is not None and usable:
        # The person approved this plan: it is the approved one from now on, and the
        # write runs next under the same grant.
        return Commit(events=(plan_approved_event(str(args["content"]), call_id=call_id),))

    grant = digest if usable else None
    if name in CONTROL_TOOLS:
        return Commit(events=_control(state, call_id, name, args, grant))
    return RunTool(
        call_id=call_id,
        tool=name,
        arguments=args,
        effect=info.effect,
        recovery=info.recovery,
        grant=grant,
        git_writable=verdict.writes_git,
        consult=decided.consult,
        notes=decided.notes,
    )


def _mixed_with_question(state: RunState, sit: Situation) -> Commit | None:
    side_effecting = []
    for call in state.turn_calls:
        try:
            effect = sit.catalog.describe(call["name"]).effect
        except ToolError:
            continue
        if effect in SIDE_EFFECTS:
            side_effecting.append(call["name"])
    if not side_effecting:
        return None
    message = (
        "invalid model output: ask_user cannot share a turn with side-effecting calls "
        f"({', '.join(sorted(set(side_effecting)))}); ask alone, then act on the answer"
    )
    return Commit(
        events=tuple(
            failed_event(
                c["id"], c["name"], loose_arguments(c["arguments"]), "invalid_turn", message
            )
            for c in state.turn_calls
        )
    )


def _second_question(state: RunState) -> Commit | None:
    """A run waits for one answer at a time: every ask_user after a turn's first is refused."""
    questions = [c for c in state.turn_calls if c["name"] == "ask_user"]
    if len(questions) < 2:
        return None
    message = (
        "invalid model output: one question at a time; this turn already asks another "
        "question with ask_user. Ask this one after the answer, if it is still needed"
    )
    return Commit(
        events=tuple(
            failed_event(
                c["id"], c["name"], loose_arguments(c["arguments"]), "invalid_turn", message
            )
            for c in questions[1:]
        )
    )


def _ask_approval(
    state: RunState,
    sit: Situation,
    call_id: str,
    name: str,
    effect: str,
    args: dict[str, Any],
    verdict: Verdict,
    digest: str,
) -> Commit:
    request = approval_request(
        call_id=call_id,
        tool=name,
        effect=effect,
        arguments=args,
        workspace=sit.workspace,
        now=sit.now,
        ttl_seconds=_request_ttl(state, sit),
        rule=verdict.rule,
        reason=verdict.reason,
    )
    extra: dict[str, Any] = {}
    expired = state.grants.get(digest)
    if expired is not None:  # asked again: the earlier grant expired unused
        extra["expired_grant"] = {"call_id": expired.call_id, "expires_at": expired.expires_at}
    new_plan = plan_change(state, name, args)
    if new_plan is not None:
        extra["plan_sha256"] = new_plan
        extra["approved_plan_sha256"] = state.approved_plan_sha256
    if extra:
        request = NewEvent(type=request.type, data={**request.data, **extra})
    return Commit(
        events=(request, transition(state, RunStatus.WAITING, f"approval:{call_id} {name}"))
    )


def _request_ttl(state: RunState, sit: Situation) -> float:
    return usable_ttl(state.options.approval_timeout_s, sit.approval_ttl_s)


def _expiry(state: RunState, sit: Situation) -> str:
    return expires_at(sit.now, _request_ttl(state, sit))


def _plan_exit(state: RunState, sit: Situation, call_id: str, args: dict[str, Any]) -> Commit:
    """Leave plan mode once a person approved this exact plan (its sha256 is in the digest).
    No plan, no approval: one is asked for only once a plan is written."""
    if state.mode != Mode.PLAN.value:
        return Commit(
            events=(
                failed_event(
                    call_id, "plan_exit", args, "invalid_call", "plan_exit: not in plan mode"
                ),
            )
        )
    if not state.plan:
        return Commit(
            events=(
                failed_event(
                    call_id,
                    "plan_exit",
                    args,
                    "invalid_call",
                    "plan_exit: write the plan with plan_write first",
                ),
            )
        )
    plan_sha256 = plan_digest(state.plan)
    digest = approval_digest("plan_exit", {**args, "plan_sha256": plan_sha256}, str(sit.workspace))
    if grant_usable(state, digest, sit.now):  # the reviewer approved this plan
        follow_on = follow_on_mode(state).value
        seeded = " The todos were seeded from the plan." if todos_from_plan(state.plan) else ""
        return Commit(
            events=(
                *plan_approved_events(state, call_id=call_id),
                NewEvent(
                    type=EventType.TOOL_FINISHED,
                    data={
                        "call_id": call_id,
                        "tool": "plan_exit",
                        "arguments": args,
                        "grant": digest,
                        "output": f"plan approved; you are now in {follow_on} mode.{seeded}",
                    },
                ),
            )
        )
    return Commit(
        events=(
            NewEvent(
                type=EventType.APPROVAL_REQUESTED,
                data={
                    "kind": "plan",
                    "call_id": call_id,
                    "tool": "plan_exit",
                    "arguments": {"summary": args.get("summary", ""), "plan": state.plan},
                    "digest": digest,
                    "plan_sha256": plan_sha256,
                    "risk": "medium",
                    "why": "leaving plan mode needs the plan approved",
                    "expires_at": _expiry(state, sit),
                },
            ),
            transition(state, RunStatus.WAITING, f"plan_approval:{call_id}"),
        )
    )


def _control(
    state: RunState, call_id: str, name: str, args: dict[str, Any], grant: str | None = None
) -> tuple[NewEvent, ...]:
    """The events of a control tool; a grant it ran under is spent by its ``tool_finished``."""
    if name == "request_completion":
        summary = str(args.get("summary", ""))
        schema = state.options.output_schema
        output = args.get("output")
        if schema is not None:
            problems = output_problems(schema, output) if output is not None else ["missing"]
            if problems:
                return (
                    failed_event(
                        call_id,
                        name,
                        args,
                        "invalid_output",
                        "your structured result (request_completion's `output`) does not "
                        "match the schema your parent asked for: "
                        + "; ".join(problems)
                        + ". Call request_completion again with an `output` matching: "
                        + canonical_json(schema)[:4000],
                    ),
                )
        result: dict[str, Any] = {"summary": summary}
        if output is not None:
            result["output"] = output
        remaining = args.get("remaining_actions")
        if remaining:
            result["remaining_actions"] = [str(action) for action in remaining]
        return (
            finished_event(
                call_id, name, args, "completion requested: the harness runs the verifiers", grant
            ),
            transition(state, RunStatus.VERIFYING, "completion requested", result=result),
        )
    if name == "ask_user":
        question = str(args["question"])
        return (
            NewEvent(
                type=EventType.INPUT_REQUESTED, data={"call_id": call_id, "question": question}
            ),
            transition(state, RunStatus.WAITING, f"question:{call_id}"),
        )
    raise AssertionError(f"not a control tool: {name}")


__all__ = ["Gate", "Situation", "ToolCatalog", "decide", "pause_event"]
