"""Approvals as data: the digest a grant is bound to, risk, expiry, and the events.

A person approves one exact call: the grant is keyed by the sha256 of the
canonical JSON of (tool, arguments, workspace), so a changed argument, another
tool or another workspace needs a new approval. ``RunState.grants`` holds the
unused grants (digest -> call id); the loop consumes one by putting
``"grant": digest`` in the call's ``tool_started`` event, which removes it from
the fold, so a grant is used at most once. Everything here is pure: the time
is always a parameter.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

from keel.core.errors import NothingPending, UsageError
from keel.core.events import EventType, NewEvent
from keel.core.state import RunState, canonical_json

Risk = Literal["low", "medium", "high"]

_RISK_BY_EFFECT: dict[str, Risk] = {
    "read": "low",
    "state": "low",
    "write": "medium",
    # Any command can do anything (`python x.py`, `make`, `sh -c`), so argv cannot
    # prove a command harmless: every command, like every external call, is high.
    "execute": "high",
    "external": "high",
}


def approval_digest(tool: str, arguments: Mapping[str, Any], workspace: Path | str) -> str:
    """sha256 hex of canonical JSON of ``[tool, arguments, str(workspace)]``; key order free."""
    text = canonical_json([tool, dict(arguments), str(workspace)])
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def risk_of(effect: str, tool: str, arguments: Mapping[str, Any]) -> Risk:
    """How much a reviewer should worry: reads and state low, writes medium, the rest high.

    Unknown effects are high: an unfamiliar tool gets the most careful look.
    """
    return _RISK_BY_EFFECT.get(effect, "high")


# --- expiry ----------------------------------------------------------------------------


def _utc(now: datetime) -> datetime:
    if now.tzinfo is None:
        raise UsageError("approval times must be timezone-aware (use datetime.now(UTC))")
    return now.astimezone(UTC)


def expires_at(now: datetime, ttl_seconds: float) -> str:
    """ISO-8601 UTC time ``ttl_seconds`` after ``now``."""
    if ttl_seconds <= 0:
        raise UsageError(f"an approval timeout must be positive, not {ttl_seconds}")
    return (_utc(now) + timedelta(seconds=ttl_seconds)).isoformat()


def is_expired(expires_at: str | None, now: datetime) -> bool:
    """True from the instant ``expires_at`` is reached; None never expires."""
    if expires_at is None:
        return False
    return _utc(now) >= _utc(datetime.fromisoformat(expires_at))


# --- events ----------------------------------------------------------------------------

# What a person can approve: a gated call, a plan, or re-running an interrupted call.
APPROVAL_KINDS = frozenset({"approval", "plan", "unknown_outcome"})


def approval_request(
    *,
    call_id: str,
    tool: str,
    effect: str,
    arguments: Mapping[str, Any],
    workspace: Path | str,
    now: datetime,
    ttl_seconds: float | None,
    rule: str,
    reason: str,
) -> NewEvent:
    """The ``approval_requested`` event for one call (the loop then moves the run to waiting).

    It holds the exact arguments, their digest, the risk, the expiry (None when
    ``ttl_seconds`` is None) and the rule that asked, so ``keel show`` can say why.
    """
    return NewEvent(
        type=EventType.APPROVAL_REQUESTED,
        data={
            "kind": "approval",
            "call_id": call_id,
            "tool": tool,
            "effect": effect,
            "arguments": dict(arguments),
            "digest": approval_digest(tool, arguments, workspace),
            "risk": risk_of(effect, tool, arguments),
            "expires_at": None if ttl_seconds is None else expires_at(now, ttl_seconds),
            "rule": rule,
            "reason": reason,
        },
    )


def decide_approval(
    state: RunState, *, approve: bool, by: str, reason: str | None, now: datetime
) -> NewEvent:
    """The ``approval_granted`` / ``approval_denied`` event answering the pending request.

    Raises NothingPending when the run waits for no approval, and UsageError when
    the request has expired (the run then fails with ``approval_timeout``).
    """
    pending = state.pending
    if pending is None or pending.kind not in APPROVAL_KINDS:
        raise NothingPending(state.run_id, "an approval")
    if is_expired(pending.expires_at, now):
        raise UsageError(
            f"the approval request for {pending.tool} in run {state.run_id} expired at "
            f"{pending.expires_at}; resuming the run ends it failed with approval_timeout"
        )
    text = (reason or "").strip()
    if not approve and not text:
        text = f"denied by {by}"
    return NewEvent(
        type=EventType.APPROVAL_GRANTED if approve else EventType.APPROVAL_DENIED,
        data={
            "kind": pending.kind,
            "call_id": pending.call_id,
            "tool": pending.tool,
            "digest": pending.digest,
            "by": by,
            "reason": text or None,
        },
    )


def grant_matches(
    state: RunState, tool: str, arguments: Mapping[str, Any], workspace: Path | str
) -> str | None:
    """The digest of an unused grant for exactly this call, or None (then ask again).

    The loop passes the returned digest as ``"grant"`` in the call's ``tool_started``
    event, which consumes it.
    """
    digest = approval_digest(tool, arguments, workspace)
    return digest if digest in state.grants else None


__all__ = [
    "APPROVAL_KINDS",
    "Risk",
    "approval_digest",
    "approval_request",
    "decide_approval",
    "expires_at",
    "grant_matches",
    "is_expired",
    "risk_of",
]
