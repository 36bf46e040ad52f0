"""Approval digests, risk, expiry, and grants folded through the run state."""

from __future__ import annotations

import hashlib
import time
import uuid
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from keel.core.budget import MAX_SECONDS
from keel.core.errors import NothingPending, UsageError
from keel.core.events import Event, EventType, NewEvent
from keel.core.records import Grant, RunOptions
from keel.core.state import RunState
from keel.policy import (
    approval_digest,
    approval_request,
    decide_approval,
    expires_at,
    grant_matches,
    is_expired,
    risk_of,
)
from keel.policy.approvals import DEFAULT_GRANT_TTL_S, grant_usable, usable_ttl
from keel.policy.plans import plan_digest

WORKSPACE = Path("/srv/work/project")
NOW = datetime(2025, 3, 1, 12, 0, 0, tzinfo=UTC)
PUSH = {"argv": ["git", "push", "origin", "main"], "timeout_seconds": 60}


def fold(
    *new_events: NewEvent, state: RunState | None = None, options: RunOptions | None = None
) -> RunState:
    """Apply ``new_events`` as the store would: numbered in order, after ``state``."""
    if state is None:
        created = NewEvent(
            type=EventType.RUN_CREATED,
            data={
                "goal": "g",
                "workspace": str(WORKSPACE),
                "options": (options or RunOptions()).to_dict(),
            },
        )
        state, new_events = RunState(run_id="run_1"), (created, *new_events)
    for new in new_events:
        state = state.apply(
            Event(
                run_id=state.run_id,
                seq=state.last_seq + 1,
                event_id=str(uuid.uuid4()),
                type=new.type,
                recorded_at=NOW,
                data=new.data,
            )
        )
    return state


def request(arguments: dict[str, Any] = PUSH, ttl: float | None = 3600) -> NewEvent:
    return approval_request(
        call_id="call_1",
        tool="run_command",
        effect="execute",
        arguments=arguments,
        workspace=WORKSPACE,
        now=NOW,
        ttl_seconds=ttl,
        rule="mode:edit",
        reason="execute calls need approval in edit mode",
    )


# --- digest ------------------------------------------------------------------------------


def test_digest_ignores_key_order_at_every_depth() -> None:
    a = {"path": "a.txt", "opts": {"x": 1, "y": [1, 2]}}
    b = {"opts": {"y": [1, 2], "x": 1}, "path": "a.txt"}

    assert approval_digest("write_file", a, WORKSPACE) == approval_digest(
        "write_file", b, WORKSPACE
    )
    assert len(approval_digest("write_file", a, WORKSPACE)) == 64


@pytest.mark.parametrize(
    ("tool", "arguments", "workspace"),
    [
        ("run_command", {**PUSH, "argv": ["git", "push", "origin", "dev"]}, WORKSPACE),
        ("run_command", {"argv": PUSH["argv"]}, WORKSPACE),
        ("run_command", {**PUSH, "timeout_seconds": "60"}, WORKSPACE),
        ("run_command", PUSH, Path("/srv/work/other")),
        ("other_tool", PUSH, WORKSPACE),
    ],
)
def test_digest_changes_with_any_argument_the_workspace_or_the_tool(
    tool: str, arguments: dict[str, Any], workspace: Path
) -> None:
    assert approval_digest(tool, arguments, workspace) != approval_digest(
        "run_command", PUSH, WORKSPACE
    )


def test_digest_is_the_sha256_of_canonical_tool_arguments_workspace() -> None:
    # Pinned: a digest stored by one version must still match after an upgrade.
    pinned = "fda794eddf854871c0a70715733efc7ec7deb2769a8cebcecb8019d345504971"

    assert hashlib.sha256(b'["read_file",{"path":"a"},"/w"]').hexdigest() == pinned
    assert approval_digest("read_file", {"path": "a"}, "/w") == pinned


# --- risk --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("effect", "tool", "arguments", "risk"),
    [
        ("read", "read_file", {"path": "a"}, "low"),
        ("state", "todo_write", {"todos": []}, "low"),
        ("write", "write_file", {"path": "a", "content": ""}, "medium"),
        ("execute", "run_command", {"argv": ["pytest"]}, "high"),
        ("execute", "run_command", {"argv": ["rm", "-rf", "/"]}, "high"),
        ("external", "web_fetch", {"url": "https://example.com"}, "high"),
        ("teleport", "mystery", {}, "high"),
    ],
)
def test_risk_grows_with_the_reach_of_the_effect(
    effect: str, tool: str, arguments: dict[str, Any], risk: str
) -> None:
    assert risk_of(effect, tool, arguments) == risk


# --- expiry ------------------------------------------------------------------------------


def test_expiry_is_iso_utc_and_reached_at_its_instant() -> None:
    deadline = expires_at(NOW, 90)

    assert deadline == "2025-03-01T12:01:30+00:00"
    assert not is_expired(deadline, NOW + timedelta(seconds=89.999))
    assert is_expired(deadline, NOW + timedelta(seconds=90))
    assert is_expired(deadline, NOW + timedelta(days=3))


def test_expiry_compares_instants_not_wall_clocks() -> None:
    tokyo = timezone(timedelta(hours=9))
    deadline = expires_at(NOW.astimezone(tokyo), 60)

    assert deadline.endswith("+00:00")
    assert not is_expired(deadline, (NOW + timedelta(seconds=30)).astimezone(tokyo))
    assert is_expired(deadline, NOW + timedelta(seconds=61))


def test_no_expiry_never_expires_and_naive_times_are_refused() -> None:
    assert not is_expired(None, NOW + timedelta(days=10_000))
    with pytest.raises(UsageError, match="timezone-aware"):
        expires_at(datetime(2025, 1, 1), 60)
    with pytest.raises(UsageError, match="positive"):
        expires_at(NOW, 0)


# --- grants through the run state --------------------------------------------------------


def test_approval_request_records_the_exact_call_digest_risk_and_expiry() -> None:
    state = fold(request())

    assert state.pending is not None
    assert state.pending.kind == "approval"
    assert state.pending.arguments == PUSH
    assert state.pending.digest == approval_digest("run_command", PUSH, WORKSPACE)
    assert state.pending.risk == "high"
    assert state.pending.expires_at == "2025-03-01T13:00:00+00:00"


def test_granted_call_matches_once_and_only_with_the_same_arguments() -> None:
    waiting = fold(request())
    granted = fold(
        decide_approval(waiting, approve=True, by="ana", reason="ok", now=NOW), state=waiting
    )

    digest = grant_matches(granted, "run_command", dict(reversed(PUSH.items())), WORKSPACE)
    assert waiting.pending is not None
    assert digest == waiting.pending.digest
    assert grant_matches(granted, "run_command", {**PUSH, "timeout_seconds": 5}, WORKSPACE) is None
    assert grant_matches(granted, "run_command", PUSH, Path("/elsewhere")) is None

    used = fold(
        NewEvent(
            type=EventType.TOOL_STARTED,
            data={"call_id": "call_1", "tool": "run_command", "arguments": PUSH, "grant": digest},
        ),
        state=granted,
    )
    assert grant_matches(used, "run_command", PUSH, WORKSPACE) is None


def test_denial_carries_the_reviewers_reason_and_grants_nothing() -> None:
    waiting = fold(request())

    denial = decide_approval(waiting, approve=False, by="ana", reason="  not on main ", now=NOW)
    after = fold(denial, state=waiting)

    assert denial.type is EventType.APPROVAL_DENIED
    assert denial.data["reason"] == "not on main"
    assert denial.data["call_id"] == "call_1"
    assert after.pending is None
    assert grant_matches(after, "run_command", PUSH, WORKSPACE) is None


def test_denial_without_a_reason_still_tells_the_model_who_denied() -> None:
    waiting = fold(request())

    denial = decide_approval(waiting, approve=False, by="ana", reason=None, now=NOW)

    assert denial.data["reason"] == "denied by ana"


def test_deciding_with_nothing_pending_is_refused() -> None:
    with pytest.raises(NothingPending, match="not waiting for an approval"):
        decide_approval(fold(), approve=True, by="ana", reason=None, now=NOW)


def test_expired_request_cannot_be_approved() -> None:
    waiting = fold(request(ttl=60))

    with pytest.raises(UsageError, match="expired at 2025-03-01T12:01:00"):
        decide_approval(
            waiting, approve=True, by="ana", reason=None, now=NOW + timedelta(minutes=2)
        )
    assert decide_approval(waiting, approve=True, by="ana", reason=None, now=NOW).type is (
        EventType.APPROVAL_GRANTED
    )


def test_request_without_timeout_never_expires() -> None:
    waiting = fold(request(ttl=None))

    assert waiting.pending is not None
    assert waiting.pending.expires_at is None
    later = NOW + timedelta(days=365)
    assert decide_approval(waiting, approve=True, by="ana", reason=None, now=later).data["digest"]


# --- grants expire, and any attempt uses them up ----------------------------------------


def test_a_grant_records_its_expiry_24_hours_after_the_approval_by_default() -> None:
    waiting = fold(request())

    granted = decide_approval(waiting, approve=True, by="ana", reason=None, now=NOW)
    state = fold(granted, state=waiting)

    assert granted.data["expires_at"] == "2025-03-02T12:00:00+00:00"
    assert DEFAULT_GRANT_TTL_S == 24 * 3600
    digest = approval_digest("run_command", PUSH, WORKSPACE)
    assert state.grants == {
        digest: Grant(call_id="call_1", tool="run_command", expires_at="2025-03-02T12:00:00+00:00")
    }


def test_the_runs_grant_ttl_sets_the_expiry_and_an_expired_grant_no_longer_matches() -> None:
    waiting = fold(request(), options=RunOptions(grant_ttl_s=90))
    state = fold(
        decide_approval(waiting, approve=True, by="ana", reason=None, now=NOW), state=waiting
    )
    digest = approval_digest("run_command", PUSH, WORKSPACE)

    assert state.grants[digest].expires_at == "2025-03-01T12:01:30+00:00"
    assert grant_usable(state, digest, NOW + timedelta(seconds=89))
    assert not grant_usable(state, digest, NOW + timedelta(seconds=90))
    assert grant_matches(state, "run_command", PUSH, WORKSPACE, now=NOW) == digest
    late = NOW + timedelta(minutes=5)
    assert grant_matches(state, "run_command", PUSH, WORKSPACE, now=late) is None


def test_a_denial_records_no_expiry_and_grants_nothing() -> None:
    waiting = fold(request())

    denial = decide_approval(waiting, approve=False, by="ana", reason="no", now=NOW)

    assert "expires_at" not in denial.data


@pytest.mark.parametrize("outcome", [EventType.TOOL_FAILED, EventType.TOOL_FINISHED])
def test_the_approved_calls_outcome_uses_the_grant_up_even_without_naming_it(
    outcome: EventType,
) -> None:
    """A failure recorded for the granted call (e.g. a policy refusal on resume) spends it."""
    waiting = fold(request())
    granted = fold(
        decide_approval(waiting, approve=True, by="ana", reason=None, now=NOW), state=waiting
    )

    after = fold(
        NewEvent(type=outcome, data={"call_id": "call_1", "tool": "run_command", "message": "x"}),
        state=granted,
    )

    assert after.grants == {}


def test_another_calls_outcome_leaves_the_grant_alone() -> None:
    waiting = fold(request())
    granted = fold(
        decide_approval(waiting, approve=True, by="ana", reason=None, now=NOW), state=waiting
    )

    after = fold(
        NewEvent(type=EventType.TOOL_FAILED, data={"call_id": "call_9", "tool": "read_file"}),
        state=granted,
    )

    assert after.grants == granted.grants


def test_asking_again_for_the_same_call_supersedes_its_expired_grant() -> None:
    waiting = fold(request())
    granted = fold(
        decide_approval(waiting, approve=True, by="ana", reason=None, now=NOW), state=waiting
    )

    again = fold(request(), state=granted)

    assert again.grants == {}
    assert again.pending is not None


@pytest.mark.parametrize(
    ("stored", "used"), [(None, 60.0), (0, 60.0), (-5, 60.0), (float("nan"), 60.0), (30, 30.0)]
)
def test_a_stored_timeout_that_cannot_be_used_falls_back_to_the_default(
    stored: float | None, used: float
) -> None:
    """Runs stored before options were checked (``--approval-timeout -5``) stay resumable."""
    assert usable_ttl(stored, 60.0) == used


def test_approving_a_plan_records_the_sha256_of_the_plan_the_reviewer_read() -> None:
    plan = "1. fix the parser\n"
    waiting = fold(
        NewEvent(
            type=EventType.APPROVAL_REQUESTED,
            data={
                "kind": "plan",
                "call_id": "call_2",
                "tool": "plan_exit",
                "arguments": {"summary": "fix", "plan": plan},
                "digest": "d" * 64,
            },
        )
    )

    granted = decide_approval(waiting, approve=True, by="ana", reason=None, now=NOW)

    assert granted.data["plan_sha256"] == plan_digest(plan)
    assert plan_digest(plan) == hashlib.sha256(plan.encode()).hexdigest()


def test_an_approval_request_holds_the_call_its_effect_risk_and_the_rule_that_asked() -> None:
    assert request().data == {
        "kind": "approval",
        "call_id": "call_1",
        "tool": "run_command",
        "effect": "execute",
        "arguments": PUSH,
        "digest": approval_digest("run_command", PUSH, WORKSPACE),
        "risk": "high",
        "expires_at": "2025-03-01T13:00:00+00:00",
        "rule": "mode:edit",
        "reason": "execute calls need approval in edit mode",
    }
    write = approval_request(
        call_id="c",
        tool="write_file",
        effect="write",
        arguments={"path": "a"},
        workspace=WORKSPACE,
        now=NOW,
        ttl_seconds=None,
        rule="r",
        reason="why",
    )
    assert (write.data["risk"], write.data["expires_at"]) == ("medium", None)


def test_a_decision_records_the_kind_of_request_and_who_decided() -> None:
    waiting = fold(request())
    granted = decide_approval(waiting, approve=True, by="ana", reason=" fine ", now=NOW)
    assert granted.data == {
        "kind": "approval",
        "call_id": "call_1",
        "tool": "run_command",
        "digest": approval_digest("run_command", PUSH, WORKSPACE),
        "by": "ana",
        "reason": "fine",
        "expires_at": "2025-03-02T12:00:00+00:00",
    }


def test_deciding_with_nothing_pending_names_the_run() -> None:
    with pytest.raises(NothingPending, match="run_1"):
        decide_approval(fold(), approve=True, by="ana", reason=None, now=NOW)


def plan_write_request(content: Any, *, arguments: dict[str, Any] | None = None) -> NewEvent:
    return NewEvent(
        type=EventType.APPROVAL_REQUESTED,
        data={
            "kind": "approval",
            "call_id": "call_3",
            "tool": "plan_write",
            "arguments": arguments if arguments is not None else {"content": content},
            "digest": "e" * 64,
        },
    )


def test_approving_a_change_of_the_plan_records_the_sha256_of_the_new_plan() -> None:
    waiting = fold(plan_write_request("1. new plan\n"))
    granted = decide_approval(waiting, approve=True, by="ana", reason=None, now=NOW)
    assert granted.data["plan_sha256"] == plan_digest("1. new plan\n")


def test_an_approval_about_no_plan_records_no_plan_digest() -> None:
    other = NewEvent(
        type=EventType.APPROVAL_REQUESTED,
        data={
            "kind": "approval",
            "call_id": "call_4",
            "tool": "mcp_tracker",
            "arguments": {"plan": "a field that happens to be called plan"},
            "digest": "f" * 64,
        },
    )
    for waiting in (fold(other), fold(plan_write_request(7))):
        granted = decide_approval(waiting, approve=True, by="ana", reason=None, now=NOW)
        assert "plan_sha256" not in granted.data


def test_a_naive_time_is_refused_telling_how_to_make_an_aware_one() -> None:
    with pytest.raises(UsageError) as err:
        is_expired("2025-03-01T12:00:00+00:00", datetime(2025, 1, 1))
    assert str(err.value) == "approval times must be timezone-aware (use datetime.now(UTC))"


def test_expiry_is_written_in_utc_whatever_the_local_time_zone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TZ", "Asia/Tokyo")
    time.tzset()
    try:
        assert expires_at(NOW.astimezone(timezone(timedelta(hours=-5))), 60) == (
            "2025-03-01T12:01:00+00:00"
        )
    finally:
        monkeypatch.undo()
        time.tzset()


def test_a_time_to_live_under_a_second_is_still_a_time_to_live() -> None:
    assert expires_at(NOW, 0.5) == "2025-03-01T12:00:00.500000+00:00"
    assert usable_ttl(0.5, 3600.0) == 0.5
    assert usable_ttl(MAX_SECONDS, 3600.0) == MAX_SECONDS
    assert usable_ttl(MAX_SECONDS + 1, 3600.0) == 3600.0
