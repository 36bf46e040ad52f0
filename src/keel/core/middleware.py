"""Middleware decisions, as data (pure).

A middleware plugs in at a declared lifecycle point of the loop and answers with one
typed decision; it never changes the run itself. The loop records every decision but
``continue`` as a ``middleware_decided`` event, and acts on the recorded events, so a
resumed run replays what was decided instead of asking again.

When several middleware answer at one point their decisions meet here, in
``combine``: ``deny`` beats ``ask`` beats ``short_circuit`` beats ``modify``;
modifications compose in the declared order (each middleware already saw the
context its predecessors changed), and every ``append`` note is kept, in order.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from keel.core.errors import ConfigError


class Point(StrEnum):
    """Where a middleware is asked, and what it may answer there (``ALLOWED``)."""

    BEFORE_MODEL = "before_model"  # change the request's messages or tools, or answer
    AFTER_MODEL = "after_model"  # inspect or change the model's turn
    BEFORE_TOOL = "before_tool"  # allow, deny, ask, change arguments, or answer
    AFTER_TOOL = "after_tool"  # change a result, append a note
    BEFORE_COMPLETE = "before_complete"  # add a gap that blocks completion (deny)
    ON_EVENT = "on_event"  # observe only


@dataclass(frozen=True, slots=True)
class Continue:
    """Nothing to change: the loop goes on as it would without this middleware."""

    kind = "continue"


@dataclass(frozen=True, slots=True)
class Modify:
    """Change what the point holds: a patch of its fields (``messages``/``tools`` before
    the model, ``content``/``tool_calls`` after it, ``arguments`` before a tool,
    ``output`` after one)."""

    patch: Mapping[str, Any]
    reason: str = ""
    kind = "modify"


@dataclass(frozen=True, slots=True)
class ShortCircuit:
    """Answer in the model's place (a turn: ``content``, ``tool_calls``) or in the tool's
    place (its output text); the model or tool is not called."""

    value: Any
    reason: str = ""
    kind = "short_circuit"


@dataclass(frozen=True, slots=True)
class Append:
    """Add a note the model reads (after the result, at ``before_tool``/``after_tool``)."""

    note: str
    kind = "append"


@dataclass(frozen=True, slots=True)
class Deny:
    """Refuse: the call fails, the result is withheld, completion gets a gap, or (before
    or after the model) the run stops ``blocked``."""

    reason: str
    kind = "deny"


@dataclass(frozen=True, slots=True)
class Ask:
    """A person must approve the call first (``before_tool`` only)."""

    reason: str
    kind = "ask"


Decision = Continue | Modify | ShortCircuit | Append | Deny | Ask
CONTINUE = Continue()

ALLOWED: Mapping[Point, frozenset[str]] = {
    Point.BEFORE_MODEL: frozenset({"continue", "modify", "short_circuit", "append", "deny"}),
    Point.AFTER_MODEL: frozenset({"continue", "modify", "append", "deny"}),
    Point.BEFORE_TOOL: frozenset({"continue", "modify", "short_circuit", "append", "deny", "ask"}),
    Point.AFTER_TOOL: frozenset({"continue", "modify", "append", "deny"}),
    Point.BEFORE_COMPLETE: frozenset({"continue", "append", "deny"}),
    Point.ON_EVENT: frozenset({"continue"}),
}
PATCH_FIELDS: Mapping[Point, frozenset[str]] = {
    Point.BEFORE_MODEL: frozenset({"messages", "tools"}),
    Point.AFTER_MODEL: frozenset({"content", "tool_calls"}),
    Point.BEFORE_TOOL: frozenset({"arguments"}),
    Point.AFTER_TOOL: frozenset({"output"}),
}
RANK = {"deny": 4, "ask": 3, "short_circuit": 2, "modify": 1, "append": 0, "continue": -1}


def decision_from_json(value: Any) -> Decision:
    """A decision as a command hook prints it: ``{"decision": KIND, ...}``; ``{}`` or no
    output is ``continue``. ConfigError (naming what is wrong) for anything else."""
    if value is None or value == {}:
        return CONTINUE
    if not isinstance(value, dict):
        raise ConfigError(f"a decision is a JSON object, not {type(value).__name__}")
    kind = value.get("decision", "continue")
    reason = value.get("reason", "")
    if not isinstance(reason, str):
        raise ConfigError("a decision's reason is a string")
    if kind == "continue":
        return CONTINUE
    if kind == "modify":
        patch = value.get("patch")
        if not isinstance(patch, dict):
            raise ConfigError("a modify decision needs a patch object")
        return Modify(patch=patch, reason=reason)
    if kind == "short_circuit":
        if "value" not in value:
            raise ConfigError("a short_circuit decision needs a value")
        return ShortCircuit(value=value["value"], reason=reason)
    if kind == "append":
        note = value.get("note")
        if not isinstance(note, str) or not note:
            raise ConfigError("an append decision needs a non-empty note")
        return Append(note=note)
    if kind in ("deny", "ask"):
        if not reason:
            article = "an" if kind == "ask" else "a"
            raise ConfigError(f"{article} {kind} decision needs a reason")
        return Deny(reason=reason) if kind == "deny" else Ask(reason=reason)
    raise ConfigError(
        f"unknown decision {kind!r}: one of continue, modify, short_circuit, append, deny, ask"
    )


def check_decision(point: Point, decision: object) -> Decision:
    """``decision`` if it may be given at ``point``; ConfigError saying why not."""
    if not isinstance(decision, Continue | Modify | ShortCircuit | Append | Deny | Ask):
        raise ConfigError(
            f"a middleware returns a decision (keel.middleware.Continue, Modify, ...), "
            f"not {type(decision).__name__}"
        )
    if decision.kind not in ALLOWED[point]:
        allowed = ", ".join(sorted(ALLOWED[point]))
        raise ConfigError(f"{decision.kind} is not a decision at {point.value} ({allowed})")
    if isinstance(decision, Modify):
        unknown = set(decision.patch) - PATCH_FIELDS[point]
        if unknown or not decision.patch:
            fields = ", ".join(sorted(PATCH_FIELDS[point]))
            raise ConfigError(
                f"a patch at {point.value} changes {fields}; got {sorted(decision.patch)}"
            )
    return decision


def decision_record(
    name: str, point: Point, decision: Decision, *, error: str | None = None
) -> dict[str, Any]:
    """The ``middleware_decided`` event data for one middleware's decision."""
    data: dict[str, Any] = {"middleware": name, "point": point.value, "decision": decision.kind}
    if isinstance(decision, Modify):
        data["patch"] = dict(decision.patch)
        data["reason"] = decision.reason
    elif isinstance(decision, ShortCircuit):
        data["value"] = decision.value
        data["reason"] = decision.reason
    elif isinstance(decision, Append):
        data["note"] = decision.note
    elif isinstance(decision, Deny | Ask):
        data["reason"] = decision.reason
    if error is not None:
        data["error"] = error
    return data


@dataclass(frozen=True, slots=True, kw_only=True)
class Combined:
    """What a point's recorded decisions add up to (``combine``)."""

    kind: str = "continue"  # the strongest decision: deny | ask | short_circuit | modify
    by: str = ""  # the middleware whose decision that is (the first, for deny and ask)
    reason: str = ""
    patch: dict[str, Any] = field(default_factory=dict)  # the modifications, composed
    value: Any = None  # the short-circuit's value
    notes: tuple[str, ...] = ()  # every append, in order, "NAME: note"


def combine(records: Iterable[Mapping[str, Any]]) -> Combined:
    """The outcome of one point's ``middleware_decided`` records, in their order.

    The first ``deny`` wins (then the first ``ask``, then the first ``short_circuit``);
    patches merge in order, a later middleware's field replacing an earlier one's
    (it was given the earlier one's result to change) — except ``arguments``, a patch of
    the call's arguments itself, whose keys merge the same way; ``error`` records (a
    middleware that failed open) count as nothing.
    """
    best: Mapping[str, Any] | None = None
    patch: dict[str, Any] = {}
    notes: list[str] = []
    for record in records:
        kind = record.get("decision")
        if kind == "modify":
            for key, value in (record.get("patch") or {}).items():
                merges = key == "arguments" and isinstance(value, Mapping)
                patch[key] = {**patch.get("arguments", {}), **value} if merges else value
        elif kind == "append":
            notes.append(f"{record.get('middleware')}: {record.get('note')}")
        if kind in RANK and (best is None or RANK[kind] > RANK[best["decision"]]):
            best = record
    if best is None or best["decision"] in ("append", "continue"):
        return Combined(notes=tuple(notes))  # no modify was seen, so there is no patch
    return Combined(
        kind=str(best["decision"]),
        by=str(best.get("middleware", "")),
        reason=str(best.get("reason", "")),
        patch=patch,
        value=best.get("value"),
        notes=tuple(notes),
    )


__all__ = [
    "ALLOWED",
    "CONTINUE",
    "Append",
    "Ask",
    "Combined",
    "Continue",
    "Decision",
    "Deny",
    "Modify",
    "Point",
    "ShortCircuit",
    "check_decision",
    "combine",
    "decision_from_json",
    "decision_record",
]
