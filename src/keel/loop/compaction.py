"""The compaction step the driver takes before a model request (``keel.loop.context``).

Everything is decided by the pure functions there; the one effect here is the optional
model-written summary (``RunOptions.context_summary``), a model call of its own whose
text, tokens and cost go into the ``context_compacted`` event. The driver commits what
`compact_context` returns: nothing, the compaction, or the run's failure when the
continuation would be unfaithful.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from keel.core.errors import ContextUnfaithful, ModelError
from keel.core.events import NewEvent
from keel.core.state import RunState, transition
from keel.core.status import RunStatus
from keel.loop.context import (
    CompactionPlan,
    ContextBudget,
    compaction_event,
    plan_compaction,
    summary_messages,
)
from keel.loop.prepare import system_prompt
from keel.loop.transcript import Transcript
from keel.models.base import Model, ModelRequest, RetryNotice


@dataclass(frozen=True, slots=True, kw_only=True)
class ContextKeeper:
    """One run's context settings: its budget and the offered tools' tokens (both fixed
    for the life of a driver), and the redaction the log applies to what is stored."""

    budget: ContextBudget
    specs_tokens: int
    scrub: Callable[[str], str]

    def compact(
        self,
        state: RunState,
        transcript: Transcript,
        *,
        step: int,
        overflow: bool,
        model: Model,
        on_retry: Callable[[RetryNotice], None] | None = None,
        system: str | None = None,
    ) -> list[NewEvent]:
        """The events to commit before request ``step``: none when it fits (or nothing
        can be dropped, or the continuation would be no smaller than the turns it
        replaces), the ``context_compacted`` event, or — when the continuation
        would lose a fidelity item — the run's failure ``context_unfaithful: …``.
        ``system`` is ``system_prompt(state)`` when the caller already made it."""
        if system is None:
            system = system_prompt(state)
        plan = plan_compaction(
            state,
            transcript,
            system=system,
            specs_tokens=self.specs_tokens,
            budget=self.budget,
            overflow=overflow,
        )
        if plan is None:
            return []

        def event_with(summary: dict[str, Any] | None) -> NewEvent:
            return compaction_event(
                state,
                transcript,
                plan,
                system=system,
                specs_tokens=self.specs_tokens,
                step=step,
                summary=summary,
                scrub=self.scrub,
            )

        try:
            event = event_with(None)
            if event.data["tokens_after"] >= plan.tokens_before:
                return []  # the continuation outweighs the turns it replaces: no gain
            if state.options.context_summary:  # asked only for a compaction that is made
                event = event_with(_summary(model, plan, self.budget, step, on_retry))
        except ContextUnfaithful as exc:
            reason = f"context_unfaithful: {exc}"
            failed = transition(
                state, RunStatus.FAILED, reason, result={"unfinished": state.unfinished_todos()}
            )
            return [failed]
        return [event]


def _summary(
    model: Model,
    plan: CompactionPlan,
    budget: ContextBudget,
    step: int,
    on_retry: Callable[[RetryNotice], None] | None,
) -> dict[str, Any]:
    """The model's summary of the dropped turns (asked at the same ``step``, offered no
    tools); a model error leaves the summary empty with the error, and the
    continuation stands on the run's state alone."""
    request = ModelRequest(
        messages=summary_messages(plan, budget),
        tools=(),
        step=step,
        on_retry=on_retry,
        purpose="summary",
    )
    try:
        turn = model.complete(request)
    except ModelError as exc:
        return {"text": "", "error": f"{exc.reason}: {exc}", "model": model.spec}
    return {
        "text": turn.content or "",
        "usage": turn.usage.to_dict(),
        "cost": turn.cost,
        "model": model.spec,
    }


__all__ = ["ContextKeeper"]
