"""Turning what I/O produced into events (pure): a model turn, a verification.

``after_model`` records a turn and what it implies (a final answer asks for
completion); ``after_verification`` grants completion only on evidence. The
small builders here are shared with ``keel.loop.decide``.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from keel.core.events import EventType, NewEvent
from keel.core.state import RunState, ValidationRecord, transition
from keel.core.status import RunStatus
from keel.models.base import ModelTurn


def after_model(state: RunState, turn: ModelTurn, *, elapsed_s: float) -> tuple[NewEvent, ...]:
    """The events that record a model turn: the turn itself, and what it implies."""
    calls = [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in turn.tool_calls]
    responded = NewEvent(
        type=EventType.MODEL_RESPONDED,
        data={
            "step": state.usage.steps + 1,
            "model": turn.model,
            "content": turn.content,
            "reasoning": turn.reasoning,
            "tool_calls": calls,
            "usage": {
                "input_tokens": turn.usage.input_tokens,
                "output_tokens": turn.usage.output_tokens,
            },
            "cost": turn.cost,
            "elapsed_s": elapsed_s,
        },
    )
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


def after_verification(
    state: RunState,
    records: list[ValidationRecord],
    *,
    elapsed_s: float,
    diff_artifact: str | None = None,
) -> tuple[NewEvent, ...]:
    """Completion only on evidence: every required verifier passed at this revision.

    ``diff_artifact`` (the workspace's diff, when it is a git work tree) joins the
    verifiers' outputs in the evidence, so a reader sees what was verified.
    """
    checked = replace(state, validations=(*state.validations, *records))
    gaps = checked.verification_gaps()
    data: dict[str, Any] = {"records": [r.to_dict() for r in records], "elapsed_s": elapsed_s}
    if diff_artifact:
        data["diff"] = diff_artifact
    summary = (state.result or {}).get("summary", "")
    if not gaps:
        evidence = [f"artifact:{r.artifact}" for r in records if r.artifact]
        if diff_artifact:
            evidence.append(f"artifact:{diff_artifact}")
        if not state.options.verify:
            evidence_note = "no verifier was configured: completion rests on the model's word"
        else:
            evidence_note = (
                f"{len(records)} verifier(s) passed at mutation revision {state.mutation_revision}"
            )
        return (
            NewEvent(type=EventType.VERIFICATION_PASSED, data={**data, "note": evidence_note}),
            transition(
                checked,
                RunStatus.COMPLETED,
                "verified" if state.options.verify else "completed without verifiers",
                result={
                    "summary": summary,
                    "evidence": evidence,
                    "evidence_note": evidence_note,
                    "mutation_revision": state.mutation_revision,
                    "changed_files": dict(state.changed_files),
                },
            ),
        )
    note = "Verification failed; the run is not complete. Gaps:\n" + "\n".join(
        f"- {g}" for g in gaps
    )
    return (
        NewEvent(type=EventType.VERIFICATION_FAILED, data={**data, "gaps": gaps}),
        note_event(note),
        transition(checked, RunStatus.RUNNING, None),
    )


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


def loose_arguments(raw: Any) -> Any:
    """Arguments as well as they parse, for the record (malformed text stays text)."""
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except ValueError:
            return raw
    return raw
