"""Turning what I/O produced into events (pure): a model turn, a tool call, a verification.

``after_model`` records a turn and what it implies (a final answer asks for
completion; a turn cut at the length limit a note, or the run's end; a refusal the
run's end); ``model_failed`` and ``retry_event`` record a model that could not
answer; ``call_started``/``call_finished``/``call_failed`` record a tool call;
``after_verification`` grants completion only on evidence. The small builders here
are shared with ``keel.loop.decide``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from keel.core.errors import ModelError
from keel.core.events import EventType, NewEvent
from keel.core.records import ValidationRecord
from keel.core.state import RunState, calls_run, transition
from keel.core.status import RunStatus
from keel.core.text import MAX_DEPTH
from keel.core.verifiers import DEFAULT_OUTCOME, DIFF_EVIDENCE, review_command, signoff_command
from keel.loop.actions import RunTool
from keel.loop.turns import valid_turn
from keel.models.base import ModelTurn, RetryNotice

MAX_TRUNCATION_NOTES = 2  # cut turns running the model is told about; the next fails the run
TRUNCATED_REASON = "model_output_truncated"
REFUSED_PREFIX = "provider_refused"
TRUNCATION_NOTE = (
    "Your last reply was cut off at the output length limit{calls}. Continue from where it "
    "stopped, or shorten your replies: take smaller steps, and write large files in parts "
    "(a smaller write_file, then edit_file) instead of all at once. This happened {count} "
    "time(s) running; {fail_at} times running end the run."
)


def after_model(state: RunState, turn: ModelTurn, *, elapsed_s: float) -> tuple[NewEvent, ...]:
    """The events that record a model turn: the turn itself, and what it implies.

    The turn is made valid first (``keel.loop.turns``); what that changed is listed
    in the event's ``sanitized``. Its finish reason decides what follows: a turn cut
    at the length limit is never final and its calls never run (the fold drops them):
    the model is told, at most ``MAX_TRUNCATION_NOTES`` times running, and the next cut
    turn fails the run ``model_output_truncated``. A refused turn (``content_filter``,
    ``refusal``) fails the run ``provider_refused:<reason>``, never asked again.
    """
    turn, fixes = valid_turn(turn)
    calls = [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in turn.tool_calls]
    refused = refusal_of(turn)
    responded = NewEvent(
        type=EventType.MODEL_RESPONDED,
        data={
            "step": state.usage.steps + 1,
            "model": turn.model,
            "content": turn.content,
            "reasoning": turn.reasoning,
            "tool_calls": calls,
            "usage": turn.usage.to_dict(),
            "cost": turn.cost,
            "finish_reason": turn.finish_reason,
            **(
                {"provider_finish_reason": turn.provider_finish_reason}
                if turn.provider_finish_reason is not None
                else {}
            ),
            **({"refusal": turn.refusal} if turn.refusal is not None else {}),
            "elapsed_s": elapsed_s,
            **({"sanitized": fixes} if fixes else {}),
        },
    )
    if refused is not None:
        return (responded, _refused(state, turn, refused))
    if turn.finish_reason == "length":
        return (responded, _truncated(state, len(calls)))
    if calls:
        return (responded,)
    if turn.content and turn.content.strip():
        # A final answer is a request for completion; the harness verifies it.
        return (
            responded,
            transition(
                state,
                RunStatus.VERIFYING,
                "final answer given",
                result={"summary": turn.content.strip()},
            ),
        )
    return (
        responded,
        note_event("Your last reply was empty. Call a tool, or give your final answer."),
    )


def model_failed(state: RunState, exc: ModelError) -> NewEvent:
    """The run's end when the model could not answer. The reason's first word says what
    to do: ``model_error``, ``out_of_credit`` (add credit), ``context_overflow`` (the
    conversation is too long), ``authentication`` (check the key)."""
    return transition(
        state,
        RunStatus.FAILED,
        f"{exc.reason}: {exc}",
        result={"unfinished": state.unfinished_todos()},
    )


def retry_event(notice: RetryNotice) -> NewEvent:
    """``retry_scheduled``: an attempt failed transiently, the next comes after the wait."""
    return NewEvent(
        type=EventType.RETRY_SCHEDULED,
        data={
            "attempt": notice.attempt,
            "wait_seconds": notice.wait_seconds,
            "error": notice.error,
            "status_code": notice.status_code,
        },
    )


def replay_safe(turn: ModelTurn, committed_first: Callable[[str], bool]) -> bool:
    """Whether recording ``turn`` may wait for the next durable commit: only when its
    calls all run and each is one the driver commits before anything happens —
    a read (nothing happens), or a call whose ``tool_started`` is committed before its
    effect (a write, a command, an external call). So the turn is stored, at the
    latest, in the same transaction as the first call's start; a crash before that loses
    only the turn, and the resume asks the model again (nothing was done)."""
    return (
        calls_run(turn.finish_reason)
        and bool(turn.tool_calls)
        and all(committed_first(call.name) for call in turn.tool_calls)
    )


def refusal_of(turn: ModelTurn) -> str | None:
    """``content_filter`` or ``refusal`` when the provider declined the turn, else None.

    A refusal text with an ordinary finish reason (OpenAI sends ``message.refusal`` with
    ``stop``) is a refusal too."""
    if turn.finish_reason in ("content_filter", "refusal"):
        return turn.finish_reason
    if turn.refusal and turn.refusal.strip():
        return "refusal"
    return None


def _refused(state: RunState, turn: ModelTurn, reason: str) -> NewEvent:
    result: dict[str, Any] = {"unfinished": state.unfinished_todos()}
    if turn.refusal:
        result["refusal"] = turn.refusal
    if turn.provider_finish_reason:
        result["provider_finish_reason"] = turn.provider_finish_reason
    return transition(state, RunStatus.FAILED, f"{REFUSED_PREFIX}:{reason}", result=result)


def _truncated(state: RunState, calls: int) -> NewEvent:
    """The note after a cut turn, or the run's failure once the model was told enough."""
    count = state.truncated_turns + 1
    if count > MAX_TRUNCATION_NOTES:
        return transition(
            state,
            RunStatus.FAILED,
            TRUNCATED_REASON,
            result={
                "unfinished": state.unfinished_todos(),
                "truncated_turns": count,
                "detail": (
                    f"the model's reply was cut at the output length limit {count} times "
                    "running; no call of those turns was run"
                ),
            },
        )
    unrun = f", so its {calls} tool call(s) were incomplete and none of them ran" if calls else ""
    return note_event(
        TRUNCATION_NOTE.format(calls=unrun, count=count, fail_at=MAX_TRUNCATION_NOTES + 1)
    )


def after_verification(
    state: RunState,
    records: list[ValidationRecord],
    *,
    elapsed_s: float,
    diff_artifact: str | None = None,
    gaps: Sequence[str] = (),
) -> tuple[NewEvent, ...]:
    """Completion only on evidence: every required verifier passed at this revision, no
    file changed outside the paths an approved plan names (``outside_plan``), no
    middleware added a gap (``gaps``, from ``before_complete``), and every person who
    must sign off did, at this revision.

    What the gaps lead to: a verifier that cannot run at all ends the run ``blocked``
    (no edit fixes it); other gaps go back to the model; when only sign-offs are
    missing the run waits for the first of them. A completed run's result names its
    ``outcome``, its ``evidence`` by verifier (and ``code_diff``, the workspace's diff
    when it is a git work tree) and the ``remaining_actions`` the model listed.
    """
    checked = replace(state, validations=(*state.validations, *records))
    added = list(gaps)
    unsigned = checked.unsigned()
    signoff_gaps = len(unsigned)
    all_gaps = [*checked.verification_gaps(), *added]
    work_gaps = [g for g in all_gaps if not _is_signoff_gap(g, unsigned)]
    data: dict[str, Any] = {"records": [r.to_dict() for r in records], "elapsed_s": elapsed_s}
    if added:
        data["middleware_gaps"] = added
    if diff_artifact:
        data["diff"] = diff_artifact
    unfixable = checked.unfixable_gaps()
    if unfixable:
        return (  # every other gap is one the agent could fix; these it cannot
            NewEvent(
                type=EventType.VERIFICATION_FAILED,
                data={**data, "gaps": all_gaps, "unfixable": unfixable},
            ),
            transition(checked, RunStatus.RUNNING, None),
            transition(
                replace(checked, status=RunStatus.RUNNING),
                RunStatus.BLOCKED,
                f"unfixable_gap: {unfixable[0]}",
                result={**(state.result or {}), "gaps": all_gaps, "unfixable": unfixable},
            ),
        )
    if work_gaps:
        note = "Verification failed; the run is not complete. Gaps:\n" + "\n".join(
            f"- {g}" for g in work_gaps
        )
        outside = state.changes_outside_plan()
        if outside:  # the approved plan named its paths; these files are not among them
            data["outside_plan"] = outside
        return (
            NewEvent(type=EventType.VERIFICATION_FAILED, data={**data, "gaps": all_gaps}),
            note_event(note),
            transition(checked, RunStatus.RUNNING, None),
        )
    if signoff_gaps:
        name = unsigned[0]
        return (  # running first: leaving verifying clears what the run waits for
            transition(checked, RunStatus.RUNNING, None),
            NewEvent(
                type=EventType.SIGNOFF_REQUESTED,
                data={**data, "verifier": name, "mutation_revision": state.mutation_revision},
            ),
            transition(
                replace(checked, status=RunStatus.RUNNING),
                RunStatus.WAITING,
                f"signoff:{name}",
            ),
        )
    return _completed(checked, state, records, data, diff_artifact)


def _completed(
    checked: RunState,
    state: RunState,
    records: list[ValidationRecord],
    data: dict[str, Any],
    diff_artifact: str | None,
) -> tuple[NewEvent, ...]:
    options = state.options
    evidence: dict[str, str] = {}
    for command in options.verify:
        record = checked.latest_validation(command)
        if record is not None and record.artifact:
            evidence[options.verifier_name(command)] = f"artifact:{record.artifact}"
    named = [
        *((name, review_command(name)) for name, _ in options.reviewers),
        *((name, signoff_command(name)) for name in options.signoffs),
    ]
    for name, command in named:
        record = checked.latest_validation(command)
        if record is not None and record.artifact:
            evidence[name] = f"artifact:{record.artifact}"
    if diff_artifact:
        evidence[DIFF_EVIDENCE] = f"artifact:{diff_artifact}"
    verified = bool(options.verify or options.signoffs or options.reviewers)
    if not verified:
        evidence_note = "no verifier was configured: completion rests on the model's word"
    else:
        reviewed = f", {len(options.reviewers)} review(s)" if options.reviewers else ""
        signed = f" and {len(options.signoffs)} sign-off(s)" if options.signoffs else ""
        evidence_note = (
            f"{len(options.verify)} verifier(s){reviewed}{signed} passed at mutation "
            f"revision {state.mutation_revision}"
        )
    previous = state.result or {}
    output = previous.get("output")  # a child's structured result
    result: dict[str, Any] = {
        "outcome": options.outcome or DEFAULT_OUTCOME,
        "summary": previous.get("summary", ""),
        "evidence": evidence,
        "evidence_note": evidence_note,
        "remaining_actions": list(previous.get("remaining_actions") or ()),
        "mutation_revision": state.mutation_revision,
        "changed_files": dict(state.changed_files),
        **({"output": output} if output is not None else {}),
    }
    return (
        NewEvent(type=EventType.VERIFICATION_PASSED, data={**data, "note": evidence_note}),
        transition(
            checked,
            RunStatus.COMPLETED,
            "verified" if verified else "completed without verifiers",
            result=result,
        ),
    )


def _is_signoff_gap(gap: str, unsigned: Sequence[str]) -> bool:
    return any(gap.startswith(f"{name}: ") for name in unsigned)


# --- small event builders ------------------------------------------------------------------


def note_event(text: str) -> NewEvent:
    return NewEvent(type=EventType.NOTE_ADDED, data={"text": text})


def failed_event(call_id: str, tool: str, arguments: Any, kind: str, message: str) -> NewEvent:
    return NewEvent(
        type=EventType.TOOL_FAILED,
        data={
            "call_id": call_id,
            "tool": tool,
            "arguments": arguments,
            "error_kind": kind,
            "message": message,
        },
    )


def finished_event(
    call_id: str, tool: str, arguments: Any, output: str, grant: str | None = None
) -> NewEvent:
    data = {"call_id": call_id, "tool": tool, "arguments": arguments, "output": output}
    if grant is not None:
        data["grant"] = grant  # the fold removes a spent grant
    return NewEvent(type=EventType.TOOL_FINISHED, data=data)


def call_started(
    run_id: str, action: RunTool, intent: Mapping[str, str], isolation: dict[str, Any] | None
) -> NewEvent:
    """``tool_started``: the call, its idempotency key and intended hashes, before any effect."""
    return NewEvent(
        type=EventType.TOOL_STARTED,
        data={
            "call_id": action.call_id,
            "key": f"{run_id}:{action.call_id}",
            "tool": action.tool,
            "arguments": action.arguments,
            "effect": action.effect,
            "recovery": action.recovery,
            "intent": dict(intent),
            "grant": action.grant,
            **({"sandbox": isolation} if isolation is not None else {}),
        },
    )


def call_finished(
    action: RunTool,
    output: str,
    changed: Mapping[str, str],
    elapsed_s: float,
    data: Mapping[str, Any],
) -> list[NewEvent]:
    """``tool_finished``, and the todo list or plan the call's result carries."""
    events = [
        NewEvent(
            type=EventType.TOOL_FINISHED,
            data={
                "call_id": action.call_id,
                "tool": action.tool,
                "arguments": action.arguments,
                "output": output,
                "changed_files": dict(changed),
                "grant": action.grant,
                "elapsed_s": elapsed_s,
            },
        )
    ]
    if "todos" in data:
        events.append(NewEvent(type=EventType.TODO_UPDATED, data={"todos": data["todos"]}))
    if "plan" in data:
        events.append(NewEvent(type=EventType.PLAN_WRITTEN, data={"content": data["plan"]}))
    # Delegation: children whose results this call took, a child that now waits for a
    # person (the run waits too), a run that took over this one.
    for child in data.get("children_finished", ()):
        events.append(NewEvent(type=EventType.SUBAGENT_FINISHED, data=dict(child)))
    if "waiting_on_child" in data:
        events.append(
            NewEvent(type=EventType.WAITING_ON_CHILD, data=dict(data["waiting_on_child"]))
        )
    if "handed_off" in data:
        events.append(NewEvent(type=EventType.HANDED_OFF, data=dict(data["handed_off"])))
    return events


def call_failed(
    action: RunTool, kind: str, message: str, changed: Mapping[str, str], elapsed_s: float
) -> NewEvent:
    """``tool_failed`` of a call that ran (or was refused before it could)."""
    return NewEvent(
        type=EventType.TOOL_FAILED,
        data={
            "call_id": action.call_id,
            "tool": action.tool,
            "arguments": action.arguments,
            "error_kind": kind,
            "message": message,
            "changed_files": dict(changed),
            "grant": action.grant,
            "elapsed_s": elapsed_s,
        },
    )


def reconciled_event(call_id: str, outcome: str, detail: str) -> NewEvent:
    """``call_reconciled``: what resume found of a call that started but never finished."""
    return NewEvent(
        type=EventType.CALL_RECONCILED,
        data={"call_id": call_id, "outcome": outcome, "detail": detail},
    )


def replayed_records(tool: str, arguments: Mapping[str, Any]) -> list[NewEvent]:
    """What a call found done on resume would have recorded beside its tool_finished."""
    if tool == "plan_write" and isinstance(arguments.get("content"), str):
        return [NewEvent(type=EventType.PLAN_WRITTEN, data={"content": arguments["content"]})]
    return []


def loose_arguments(raw: Any) -> Any:
    """Arguments as well as they parse, for the record (malformed text stays text).

    Text stays text too when its parse would not store as standard JSON: numbers
    that are not finite (``NaN``, ``1e999``) or nesting deeper than ``MAX_DEPTH``.
    """
    if not isinstance(raw, str):
        return raw
    try:
        parsed = json.loads(raw, parse_constant=_refuse, parse_float=_finite)
    except (ValueError, RecursionError):
        return raw
    return raw if _deeper_than(parsed, MAX_DEPTH // 2) else parsed


def _refuse(constant: str) -> Any:
    raise ValueError(f"{constant} is not standard JSON")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is not a finite number")
    return value


def _deeper_than(value: Any, depth: int) -> bool:
    todo = [(value, 0)]
    while todo:
        item, level = todo.pop()
        if level > depth:
            return True
        if isinstance(item, dict):
            todo.extend((child, level + 1) for child in item.values())
        elif isinstance(item, list):
            todo.extend((child, level + 1) for child in item)
    return False
