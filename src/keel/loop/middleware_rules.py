"""What recorded middleware decisions mean for the next action (pure, part of ``decide``).

The driver asks the middleware (``keel.loop.middleware``) and stores what they
decided; these rules read the stored decisions from the run state, so the decision
stays a pure function of the log: a resumed run acts on the same decisions without
asking again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from keel.core.errors import ToolError
from keel.core.events import NewEvent
from keel.core.middleware import Combined, Point, combine
from keel.core.state import RunState, transition
from keel.core.status import RunStatus
from keel.loop.actions import CallModel, Commit
from keel.loop.outcomes import failed_event, finished_event
from keel.loop.situation import Situation, Verdict


@dataclass(frozen=True, slots=True, kw_only=True)
class MiddlewareVerdict:
    """A middleware's ``ask``, as the gate's verdict would be (the person decides)."""

    action: str = "ask"
    rule: str
    reason: str
    permanent: bool = False
    writes_git: bool = False


def blocked(state: RunState) -> Commit | None:
    """A middleware denied around the model: the run stops ``blocked``, saying who and why."""
    block = state.middleware_block
    if block is None:
        return None
    name, point = block.get("middleware"), block.get("point")
    return Commit(
        events=(
            transition(
                state,
                RunStatus.BLOCKED,
                f"middleware_denied:{name}: {block.get('reason', '')} (at {point})",
                result={"unfinished": state.unfinished_todos(), "middleware": dict(block)},
            ),
        )
    )


def model_call(state: RunState, sit: Situation) -> CallModel:
    """The next model call: with the decisions recorded for it, or asking the middleware."""
    recorded = state.decisions.get("model")
    if recorded is not None:
        return CallModel(step=state.usage.steps, decisions=recorded)
    return CallModel(
        step=state.usage.steps, consult=Point.BEFORE_MODEL.value in sit.middleware_points
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class CallDecision:
    """What the recorded ``before_tool`` decisions make of a call."""

    done: Commit | None = None  # denied or answered in the tool's place: nothing runs
    arguments: dict[str, Any] | None = None  # the arguments to judge and run
    ask: MiddlewareVerdict | None = None  # a person must approve first
    notes: tuple[str, ...] = ()
    consult: bool = False  # nothing decided yet: the driver asks before running it


def call_decision(
    state: RunState, sit: Situation, call_id: str, name: str, args: dict[str, Any]
) -> CallDecision:
    """Apply the call's recorded decisions: deny fails it (``middleware_denied``), a
    short-circuit finishes it with the middleware's value, a modification changes its
    arguments (validated again, and judged by the policy again), ask needs a person."""
    recorded = state.decisions.get(f"call:{call_id}")
    if recorded is None:
        return CallDecision(
            arguments=args, consult=Point.BEFORE_TOOL.value in sit.middleware_points
        )
    combined = combine(recorded)
    if combined.kind == "deny":
        message = f"middleware_denied: {combined.reason} (middleware: {combined.by})"
        return CallDecision(
            done=Commit(events=(failed_event(call_id, name, args, "middleware_denied", message),))
        )
    if combined.kind == "short_circuit":
        return CallDecision(done=Commit(events=(_answered(call_id, name, args, combined),)))
    changed = combined.patch.get("arguments")
    if isinstance(changed, dict) and changed:
        try:
            args = sit.catalog.validate(name, {**args, **changed})
        except ToolError as exc:
            message = f"middleware_error: the arguments middleware changed are not valid: {exc}"
            return CallDecision(
                done=Commit(
                    events=(failed_event(call_id, name, args, "middleware_error", message),)
                )
            )
    ask = None
    if combined.kind == "ask":
        ask = MiddlewareVerdict(rule=f"middleware:{combined.by}", reason=combined.reason)
    return CallDecision(arguments=args, ask=ask, notes=combined.notes)


def stricter(verdict: Verdict, ask: MiddlewareVerdict | None) -> Verdict:
    """The policy's verdict, raised to ``ask`` when a middleware asks (a deny stays)."""
    if ask is None or verdict.action != "allow":
        return verdict
    return MiddlewareVerdict(rule=ask.rule, reason=ask.reason, writes_git=verdict.writes_git)


def _answered(call_id: str, name: str, args: dict[str, Any], combined: Combined) -> NewEvent:
    value = combined.value
    output = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    event = finished_event(call_id, name, args, output)
    shown = with_notes(output, combined.notes)
    data = {**event.data, "answered_by": f"middleware:{combined.by}"}
    if shown != output:
        data["shown"] = shown
    return NewEvent(type=event.type, data=data)


def with_notes(output: str, notes: tuple[str, ...]) -> str:
    """A result as the model reads it with middleware notes after it."""
    if not notes:
        return output
    return output + "".join(f"\n[note from middleware {note}]" for note in notes)


__all__ = ["blocked", "call_decision", "model_call", "stricter", "with_notes"]
