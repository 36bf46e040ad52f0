"""Middleware: capabilities that plug into the loop at declared points.

A middleware subclasses ``Middleware`` and overrides the points it cares about; each
returns a decision (``keel.core.middleware``). ``MiddlewareChain`` asks them in their
declared order (``order``, then the order given) and returns what they decided as
``middleware_decided`` records; the driver stores those and the loop acts on the
stored records, so a middleware never changes a run itself and a resumed run replays
its decisions instead of asking again.

Each middleware declares what its raising means (``on_error``): ``"closed"`` (the
default) turns the error into a ``deny`` at its point, ``"open"`` records it and goes
on as if it had said ``continue``. A decision a point does not accept, or a patch of
fields the point does not have, is such an error too.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from keel.core.errors import ConfigError
from keel.core.events import Event
from keel.core.middleware import (
    CONTINUE,
    Continue,
    Decision,
    Deny,
    Modify,
    Point,
    check_decision,
    decision_record,
)
from keel.core.records import ValidationRecord
from keel.core.state import RunState
from keel.models.base import Message, ToolCall

ON_ERROR = ("closed", "open")
ROLES = ("system", "user", "assistant", "tool")


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelContext:
    """``before_model``: the request about to be sent (patch ``messages`` or ``tools``)."""

    state: RunState
    step: int
    messages: tuple[Message, ...]
    tools: tuple[str, ...]  # the names of the tools offered


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnContext:
    """``after_model``: the model's turn (patch ``content`` or ``tool_calls``)."""

    state: RunState
    step: int
    content: str | None
    tool_calls: tuple[dict[str, Any], ...]  # id, name, arguments (as the model sent them)


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCallContext:
    """``before_tool``: a validated call the policy allows (patch ``arguments``)."""

    state: RunState
    call_id: str
    tool: str
    effect: str
    arguments: dict[str, Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolResultContext:
    """``after_tool``: a call's result before the model sees it (patch ``output``)."""

    state: RunState
    call_id: str
    tool: str
    arguments: dict[str, Any]
    output: str
    changed_files: dict[str, str]


@dataclass(frozen=True, slots=True, kw_only=True)
class CompletionContext:
    """``before_complete``: the verifiers ran; a ``deny`` adds a gap (the run goes on)."""

    state: RunState
    summary: str
    records: tuple[ValidationRecord, ...]


Context = ModelContext | TurnContext | ToolCallContext | ToolResultContext | CompletionContext


class Middleware:
    """Override the points you need; the rest say ``continue`` (and are never called).

    ``name`` names it in events (default: the class name), ``order`` places it (lower
    first; equal orders keep the order given), ``on_error`` is ``"closed"`` or
    ``"open"``. ``on_event`` sees every stored event and its return value is ignored.
    """

    name: str = ""
    order: int = 0
    on_error: str = "closed"

    def points(self) -> frozenset[Point]:
        """The points this middleware is asked at: those its class overrides."""
        return frozenset(
            p for p in Point if getattr(type(self), p.value) is not getattr(Middleware, p.value)
        )

    def before_model(self, ctx: ModelContext) -> Decision:
        return CONTINUE

    def after_model(self, ctx: TurnContext) -> Decision:
        return CONTINUE

    def before_tool(self, ctx: ToolCallContext) -> Decision:
        return CONTINUE

    def after_tool(self, ctx: ToolResultContext) -> Decision:
        return CONTINUE

    def before_complete(self, ctx: CompletionContext) -> Decision:
        return CONTINUE

    def on_event(self, event: Event) -> None:
        return None


def middleware_name(middleware: Middleware) -> str:
    return middleware.name or type(middleware).__name__


@dataclass(slots=True)
class MiddlewareChain:
    """The run's middleware in order, asked point by point."""

    middleware: Sequence[Middleware] = ()
    points: frozenset[Point] = field(init=False)
    observer_errors: list[dict[str, Any]] = field(init=False)  # on_event failures to record
    _at: dict[Point, tuple[tuple[str, Middleware], ...]] = field(init=False)
    _asks: dict[Point, tuple[tuple[str, Middleware, Callable[[Any], Any]], ...]] = field(init=False)
    _failed_observers: set[str] = field(init=False)

    def __post_init__(self) -> None:
        ordered = [m for _, m in sorted(enumerate(self.middleware), key=_order_key)]
        names: set[str] = set()
        for mw in ordered:
            name = middleware_name(mw)
            if name in names:
                raise ConfigError(f"two middleware are named {name!r}; give each its own name")
            if mw.on_error not in ON_ERROR:
                raise ConfigError(f"middleware {name}: on_error is 'closed' or 'open'")
            names.add(name)
        self._at = {
            p: tuple((middleware_name(m), m) for m in ordered if p in m.points()) for p in Point
        }
        self._asks = {
            p: tuple((name, m, getattr(m, p.value)) for name, m in found)
            for p, found in self._at.items()
        }
        self.points = frozenset(p for p, found in self._at.items() if found)
        self.observer_errors = []
        self._failed_observers = set()

    def __bool__(self) -> bool:
        return bool(self.points)

    def names(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(name for found in self._at.values() for name, _ in found).keys())

    def consult(
        self,
        point: Point,
        ctx: Context,
        *,
        where: Mapping[str, Any] | None = None,
        apply: Callable[[Any, Mapping[str, Any]], Any] | None = None,
        validate: Callable[[Decision], object] | None = None,
    ) -> list[dict[str, Any]]:
        """Each middleware's decision at ``point`` but ``continue``, as event data (with
        ``where``'s fields, e.g. the call id). A later middleware sees the context its
        predecessors modified (``apply(ctx, patch)``); a deny ends the asking (nothing
        beats it). A patch ``apply`` cannot apply, or a decision ``validate`` refuses, is
        the middleware's error (its ``on_error`` decides)."""
        records: list[dict[str, Any]] = []
        for name, mw, asked in self._asks[point]:
            failure: Exception | None = None
            try:
                answer = asked(ctx)
            except Exception as exc:
                answer, failure = None, exc
            if failure is None and (answer is CONTINUE or type(answer) is Continue):
                continue  # the common case: nothing to check or record
            decision, changed, error = _judge(mw, point, ctx, apply, validate, answer, failure)
            if error is not None and mw.on_error == "open":
                record = {"middleware": name, "point": point.value, "decision": "error"}
                records.append({**record, "error": error, "failed": "open", **(where or {})})
                continue
            if isinstance(decision, Continue):
                continue
            record = decision_record(name, point, decision, error=error)
            if error is not None:
                record["failed"] = "closed"
            records.append({**record, **(where or {})})
            if isinstance(decision, Deny):
                break
            ctx = changed
        return records

    def observe(self, event: Event) -> None:
        """Show ``event`` to each ``on_event`` middleware. A failure is kept (once per
        middleware, in ``observer_errors``) for the driver to record, and ignored."""
        for name, mw in self._at[Point.ON_EVENT]:
            try:
                mw.on_event(event)
            except Exception as exc:
                if name not in self._failed_observers:
                    self._failed_observers.add(name)
                    self.observer_errors.append(
                        {
                            "middleware": name,
                            "point": Point.ON_EVENT.value,
                            "decision": "error",
                            "error": _describe(exc),
                            "failed": "open",
                            "seq": event.seq,
                        }
                    )


def _order_key(item: tuple[int, Middleware]) -> tuple[int, int]:
    position, mw = item
    return (mw.order, position)


def _judge(
    mw: Middleware,
    point: Point,
    ctx: Any,
    apply: Callable[[Any, Mapping[str, Any]], Any] | None,
    validate: Callable[[Decision], object] | None,
    answer: object,
    failure: Exception | None,
) -> tuple[Decision, Any, str | None]:
    """The middleware's ``answer`` as a checked decision and the context it leaves, or
    (when it raised, or answered what the point does not take) a deny naming the error
    with the context unchanged."""
    try:
        if failure is not None:
            raise failure
        decision = check_decision(point, answer)
        if validate is not None:
            validate(decision)
        if isinstance(decision, Modify) and apply is not None:
            return decision, apply(ctx, decision.patch), None
        return decision, ctx, None
    except Exception as exc:
        error = _describe(exc)
        return Deny(reason=f"middleware {middleware_name(mw)} failed: {error}"), ctx, error


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}"[:2000] if text else type(exc).__name__


def with_arguments(ctx: ToolCallContext, patch: Mapping[str, Any]) -> ToolCallContext:
    return replace(ctx, arguments={**ctx.arguments, **dict(patch.get("arguments") or {})})


def with_output(ctx: ToolResultContext, patch: Mapping[str, Any]) -> ToolResultContext:
    return replace(ctx, output=str(patch.get("output", ctx.output)))


def with_turn(ctx: TurnContext, patch: Mapping[str, Any]) -> TurnContext:
    content = patch.get("content", ctx.content)
    calls = patch.get("tool_calls", ctx.tool_calls)
    return replace(ctx, content=content, tool_calls=tuple(calls))


def with_request(ctx: ModelContext, patch: Mapping[str, Any]) -> ModelContext:
    messages = patch.get("messages")
    tools = patch.get("tools")
    return replace(
        ctx,
        messages=ctx.messages if messages is None else tuple(as_messages(messages)),
        tools=ctx.tools if tools is None else tuple(str(t) for t in tools),
    )


def as_messages(value: Any) -> list[Message]:
    """Messages from a patch: ``Message`` objects or their data (``message_data``)."""
    if not isinstance(value, list | tuple):
        raise ConfigError("a messages patch is a list of messages")
    found: list[Message] = []
    for item in value:
        if isinstance(item, Message):
            found.append(item)
            continue
        if not isinstance(item, dict) or item.get("role") not in ROLES:
            raise ConfigError(
                "a patched message is a keel Message or {role: system|user|assistant|tool, "
                "content, tool_calls?, tool_call_id?}"
            )
        calls = item.get("tool_calls") or ()
        if not isinstance(calls, list | tuple) or not all(
            isinstance(c, dict) and isinstance(c.get("id"), str) and isinstance(c.get("name"), str)
            for c in calls
        ):
            raise ConfigError("a patched message's tool_calls are {id, name, arguments}")
        content = item.get("content")
        found.append(
            Message(
                role=item["role"],
                content=None if content is None else str(content),
                tool_calls=tuple(
                    ToolCall(id=c["id"], name=c["name"], arguments=_text(c.get("arguments")))
                    for c in calls
                ),
                tool_call_id=item.get("tool_call_id"),
            )
        )
    return found


def _text(arguments: Any) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments or {})


def message_data(message: Message) -> dict[str, Any]:
    """A message as JSON-ready data (for a command hook, or a recorded patch)."""
    data: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        data["tool_calls"] = [
            {"id": c.id, "name": c.name, "arguments": c.arguments} for c in message.tool_calls
        ]
    if message.tool_call_id:
        data["tool_call_id"] = message.tool_call_id
    return data


__all__ = [
    "CompletionContext",
    "Context",
    "Middleware",
    "MiddlewareChain",
    "ModelContext",
    "ToolCallContext",
    "ToolResultContext",
    "TurnContext",
    "as_messages",
    "message_data",
    "middleware_name",
]
