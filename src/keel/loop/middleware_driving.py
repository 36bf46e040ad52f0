"""The driver's side of middleware: build each point's context, ask, turn answers into events.

``Driver`` calls these at its lifecycle points. Nothing here changes a run: the
decisions come back as ``middleware_decided`` events (and notes) for the driver to
store; what they mean before a model call or a tool call is decided from the stored
events (``keel.loop.middleware_rules``), and what they mean after one (a changed turn,
a changed result, a gap) is applied to the events being stored with them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from keel.core.errors import ConfigError
from keel.core.events import EventType, NewEvent
from keel.core.middleware import Decision, Point, ShortCircuit, combine
from keel.core.records import ValidationRecord
from keel.core.state import RunState
from keel.loop.actions import RunTool
from keel.loop.middleware import (
    CompletionContext,
    MiddlewareChain,
    ModelContext,
    ToolCallContext,
    ToolResultContext,
    TurnContext,
    as_messages,
    message_data,
    with_arguments,
    with_output,
    with_request,
    with_turn,
)
from keel.loop.middleware_rules import with_notes
from keel.loop.outcomes import note_event
from keel.loop.turns import valid_turn
from keel.models.base import ModelRequest, ModelTurn, TokenUsage, ToolCall, ToolSpec


class MiddlewareDriving:
    """One run's middleware, asked at the driver's points."""

    def __init__(self, chain: MiddlewareChain) -> None:
        self.chain = chain
        self._offered: tuple[tuple[ToolSpec, ...], tuple[str, ...]] = ((), ())

    @staticmethod
    def decided(records: Iterable[Mapping[str, Any]]) -> list[NewEvent]:
        return [NewEvent(type=EventType.MIDDLEWARE_DECIDED, data=dict(r)) for r in records]

    def _events(self, records: list[dict[str, Any]]) -> list[NewEvent]:
        """The records as events, each ``append`` followed by its note for the model."""
        events: list[NewEvent] = []
        for record in records:
            events.append(NewEvent(type=EventType.MIDDLEWARE_DECIDED, data=record))
            if record["decision"] == "append":
                events.append(note_event(f"[middleware {record['middleware']}] {record['note']}"))
        return events

    # --- before and after the model ----------------------------------------------------

    def before_model(self, state: RunState, request: ModelRequest) -> list[NewEvent]:
        step = request.step + 1
        ctx = ModelContext(
            state=state,
            step=step,
            messages=request.messages,
            tools=self._names(request.tools),
        )
        records = self.chain.consult(
            Point.BEFORE_MODEL,
            ctx,
            where={"step": step},
            apply=with_request,
            validate=lambda d: _turn_of(d, "check", step),
        )
        for record in records:
            patch = record.get("patch")
            if patch and "messages" in patch:  # stored as data, replayed as messages
                record["patch"] = {
                    **patch,
                    "messages": [message_data(m) for m in as_messages(patch["messages"])],
                }
        return self._events(records)

    def _names(self, specs: tuple[ToolSpec, ...]) -> tuple[str, ...]:
        """The offered tools' names (the same tuple step after step: made once)."""
        if self._offered[0] is not specs:
            self._offered = (specs, tuple(spec.name for spec in specs))
        return self._offered[1]

    def apply_before_model(
        self, request: ModelRequest, decisions: Sequence[Mapping[str, Any]]
    ) -> tuple[ModelRequest, ModelTurn | None]:
        """The request as the recorded decisions changed it, and the turn a middleware
        gave in the model's place (None: ask the model)."""
        combined = combine(decisions)
        if combined.kind == "short_circuit":
            by = combined.by or "middleware"
            return request, _turn_of(ShortCircuit(value=combined.value), by, request.step + 1)
        patch = combined.patch
        if "messages" in patch:
            request = replace(request, messages=tuple(as_messages(patch["messages"])))
        if "tools" in patch:
            names = {str(name) for name in patch["tools"]}
            request = replace(request, tools=tuple(t for t in request.tools if t.name in names))
        return request, None

    def after_model(
        self, state: RunState, step: int, turn: ModelTurn
    ) -> tuple[ModelTurn, list[NewEvent]]:
        ctx = TurnContext(
            state=state,
            step=step,
            content=turn.content,
            tool_calls=tuple(
                {"id": c.id, "name": c.name, "arguments": c.arguments} for c in turn.tool_calls
            ),
        )
        records = self.chain.consult(
            Point.AFTER_MODEL,
            ctx,
            where={"step": step},
            apply=with_turn,
            validate=_valid_turn_patch,
        )
        if not records:
            return turn, []
        combined = combine(records)
        if combined.patch:
            changed = with_turn(ctx, combined.patch)
            turn, _ = valid_turn(
                replace(turn, content=changed.content, tool_calls=_calls(changed.tool_calls))
            )
        return turn, self._events(records)

    # --- around a tool call ------------------------------------------------------------

    def before_tool(self, state: RunState, action: RunTool) -> list[NewEvent]:
        ctx = ToolCallContext(
            state=state,
            call_id=action.call_id,
            tool=action.tool,
            effect=action.effect,
            arguments=dict(action.arguments),
        )
        where = {"call_id": action.call_id, "tool": action.tool}
        records = self.chain.consult(Point.BEFORE_TOOL, ctx, where=where, apply=with_arguments)
        return self.decided(records)  # its notes follow the result (RunTool.notes)

    def after_tool(
        self,
        state: RunState,
        action: RunTool,
        events: list[NewEvent],
        changed: Mapping[str, str],
    ) -> tuple[list[NewEvent], list[NewEvent]]:
        """``events`` with the result the model is shown (``shown`` in ``tool_finished``
        when it differs from the output), and the decisions to store after them."""
        finished = next(i for i, e in enumerate(events) if e.type is EventType.TOOL_FINISHED)
        data = events[finished].data
        output = str(data.get("output", ""))
        records: list[dict[str, Any]] = []
        if Point.AFTER_TOOL in self.chain.points:
            ctx = ToolResultContext(
                state=state,
                call_id=action.call_id,
                tool=action.tool,
                arguments=dict(action.arguments),
                output=output,
                changed_files=dict(changed),
            )
            where = {"call_id": action.call_id, "tool": action.tool}
            records = self.chain.consult(
                Point.AFTER_TOOL, ctx, where=where, apply=with_output, validate=_valid_output
            )
        if not records and not action.notes:
            return events, []
        combined = combine(records)
        shown = str(combined.patch.get("output", output))
        if combined.kind == "deny":
            shown = f"[result withheld by middleware {combined.by}: {combined.reason}]"
        shown = with_notes(shown, (*action.notes, *combined.notes))
        if shown != output:
            events = list(events)
            events[finished] = NewEvent(type=EventType.TOOL_FINISHED, data={**data, "shown": shown})
        return events, self.decided(records)

    # --- before completion -------------------------------------------------------------

    def before_complete(
        self, state: RunState, records: Sequence[ValidationRecord]
    ) -> tuple[list[str], list[NewEvent]]:
        """Gaps middleware add (each blocks completion) and the decisions to store."""
        if Point.BEFORE_COMPLETE not in self.chain.points:
            return [], []
        ctx = CompletionContext(
            state=state,
            summary=str((state.result or {}).get("summary", "")),
            records=tuple(records),
        )
        decided = self.chain.consult(Point.BEFORE_COMPLETE, ctx)
        gaps = [
            f"middleware {r['middleware']}: {r['reason']}"
            for r in decided
            if r["decision"] == "deny"
        ]
        return gaps, self._events(decided)


def _turn_of(decision: Decision, by: str, step: int) -> ModelTurn:
    """The turn a ``short_circuit`` before the model stands for: its ``value`` is the
    turn's text, or ``{content, tool_calls: [{name, arguments, id?}]}``."""
    if not isinstance(decision, ShortCircuit):
        return _EMPTY
    value = decision.value
    if isinstance(value, str):
        value = {"content": value}
    if not isinstance(value, dict) or set(value) - {"content", "tool_calls"}:
        raise ConfigError("a model's turn is text or {content, tool_calls}")
    content = value.get("content")
    if content is not None and not isinstance(content, str):
        raise ConfigError("a turn's content is text")
    calls = value.get("tool_calls") or []
    if not isinstance(calls, list) or not all(
        isinstance(c, dict) and isinstance(c.get("name"), str) for c in calls
    ):
        raise ConfigError("a turn's tool_calls are [{name, arguments, id?}]")
    tool_calls = tuple(
        {"id": c.get("id") or f"mw_{step}_{i}", "name": c["name"], "arguments": c.get("arguments")}
        for i, c in enumerate(calls)
    )
    return ModelTurn(
        content=content,
        tool_calls=_calls(tool_calls),
        usage=TokenUsage(input_tokens=0, output_tokens=0),
        cost=0.0,
        model=f"middleware:{by}",
        finish_reason="tool_calls" if tool_calls else "stop",
    )


_EMPTY = ModelTurn(
    content=None,
    tool_calls=(),
    usage=TokenUsage(input_tokens=0, output_tokens=0),
    cost=0.0,
    model="",
)


def _calls(calls: Iterable[Mapping[str, Any]]) -> tuple[ToolCall, ...]:
    return tuple(
        ToolCall(
            id=str(c["id"]),
            name=str(c["name"]),
            arguments=a if isinstance(a := c.get("arguments"), str) else json.dumps(a or {}),
        )
        for c in calls
    )


def _valid_turn_patch(decision: Decision) -> None:
    patch = getattr(decision, "patch", None)
    if not patch:
        return
    content = patch.get("content")
    if content is not None and not isinstance(content, str):
        raise ConfigError("a turn's content is text")
    calls = patch.get("tool_calls")
    if calls is not None and (
        not isinstance(calls, list | tuple)
        or not all(
            isinstance(c, dict) and isinstance(c.get("id"), str) and isinstance(c.get("name"), str)
            for c in calls
        )
    ):
        raise ConfigError("a turn's tool_calls are [{id, name, arguments}]")


def _valid_output(decision: Decision) -> None:
    patch = getattr(decision, "patch", None)
    if patch and not isinstance(patch.get("output"), str):
        raise ConfigError("an after_tool patch's output is text")


__all__ = ["MiddlewareDriving"]
