"""Approvals as data: the digest a grant is bound to, risk, expiry, and the events.

A person approves one exact call: the grant is keyed by the sha256 of the
canonical JSON of (tool, arguments, workspace), so a changed argument, another
tool or another workspace needs a new approval. ``RunState.grants`` holds the
unused grants (digest -> ``Grant``); the attempt of the approved call uses its
grant up whatever the outcome — ``"grant": digest`` in its ``tool_started``, or
its ``tool_finished`` / ``tool_failed`` (a failed pre-check included) — so a
grant is used at most once, and never by a later call with the same arguments.

Both sides expire: a request after ``approval_timeout_s`` (default 24 h; the run
then fails with ``approval_timeout``), and a grant ``grant_ttl_s`` after it was
given (default 24 h; the call then asks again). The grant's expiry is recorded
in its ``approval_granted`` event. Everything here is pure: the time is always a
parameter.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

from keel.core.budget import MAX_SECONDS
from keel.core.errors import NothingPending, UsageError
from keel.core.events import EventType, NewEvent
from keel.core.records import canonical_json
from keel.core.state import RunState
from keel.policy.modes import PLAN_WRITE
from keel.policy.plans import plan_digest

Risk = Literal["low", "medium", "high"]

DEFAULT_REQUEST_TTL_S = 24 * 3600.0  # an unanswered request fails the run after this
DEFAULT_GRANT_TTL_S = 24 * 3600.0  # an unused grant no longer lets its call through after this

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


def usable_ttl(seconds: float | None, default: float) -> float:
    """``seconds`` when it is a usable time to live, else ``default``.

    New runs are checked when they are created; this keeps a run stored before
    that check (``--approval-timeout -5`` or ``0``) resumable instead of failing
    at every approval.
    """
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        return default
    return float(seconds) if 0 < seconds <= MAX_SECONDS else default


# --- events ----------------------------------------------------------------------------

# What a person can approve: a gated call, a plan, or re-running an interrupted call.
APPROVAL_KINDS = frozenset({"approval", "plan", "unknown_outcome", "child_failure"})


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

    A grant expires ``grant_ttl_s`` (default 24 h) after ``now``; the expiry is in
    the event. Approving a plan (``plan_exit``) or a change of an approved plan
    (``plan_write``) records the sha256 of the plan approved. Raises NothingPending
    when the run waits for no approval, and UsageError when the request has
    expired (the run then fails with ``approval_timeout``).
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
    data: dict[str, Any] = {
        "kind": pending.kind,
        "call_id": pending.call_id,
        "tool": pending.tool,
        "digest": pending.digest,
        "by": by,
        "reason": text or None,
    }
    plan = _plan_in(pending.kind, pending.tool, pending.arguments or {})
    if plan is not None:
        data["plan_sha256"] = plan_digest(plan)
    if approve:
        ttl = usable_ttl(state.options.grant_ttl_s, DEFAULT_GRANT_TTL_S)
        data["expires_at"] = expires_at(now, ttl)
    return NewEvent(
        type=EventType.APPROVAL_GRANTED if approve else EventType.APPROVAL_DENIED, data=data
    )


def _plan_in(kind: str, tool: str | None, arguments: Mapping[str, Any]) -> str | None:
    """The plan text an approval is about, if it is about one."""
    text = arguments.get("plan") if kind == "plan" else None
    if tool == PLAN_WRITE:
        text = arguments.get("content")
    return text if isinstance(text, str) else None


def grant_usable(state: RunState, digest: str, now: datetime) -> bool:
    """Is there an unused grant for ``digest`` that has not expired at ``now``?"""
    grant = state.grants.get(digest)
    return grant is not None and not is_expired(grant.expires_at, now)


def grant_matches(
    state: RunState,
    tool: str,
    arguments: Mapping[str, Any],
    workspace: Path | str,
    *,
    now: datetime | None = None,
) -> str | None:
    """The digest of an unused grant for exactly this call, or None (then ask again).

    With ``now``, a grant that expired by then does not match. The loop passes the
    returned digest as ``"grant"`` in the call's ``tool_started`` event, which
    consumes it.
    """
    digest = approval_digest(tool, arguments, workspace)
    if digest not in state.grants:
        return None
    return digest if now is None or grant_usable(state, digest, now) else None


__all__ = [
    "APPROVAL_KINDS",
    "DEFAULT_GRANT_TTL_S",
    "DEFAULT_REQUEST_TTL_S",
    "Risk",
    "approval_digest",
    "approval_request",
    "decide_approval",
    "expires_at",
    "grant_matches",
    "grant_usable",
    "is_expired",
    "risk_of",
    "usable_ttl",
]
