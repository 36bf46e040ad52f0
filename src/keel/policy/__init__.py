"""Permission modes, user rules and approvals: pure decisions, no tool imports."""

from keel.policy.approvals import (
    Risk,
    approval_digest,
    approval_request,
    decide_approval,
    expires_at,
    grant_matches,
    is_expired,
    risk_of,
)
from keel.policy.modes import DEFAULT_MODE, Action, Decision, Mode, mode_default, parse_mode
from keel.policy.plans import follow_on_mode, plan_approved_events, todos_from_plan
from keel.policy.rules import POLICY_FILE, Policy, Rule, load_policy, workspace_relative

__all__ = [
    "DEFAULT_MODE",
    "POLICY_FILE",
    "Action",
    "Decision",
    "Mode",
    "Policy",
    "Risk",
    "Rule",
    "approval_digest",
    "approval_request",
    "decide_approval",
    "expires_at",
    "follow_on_mode",
    "grant_matches",
    "is_expired",
    "load_policy",
    "mode_default",
    "parse_mode",
    "plan_approved_events",
    "risk_of",
    "todos_from_plan",
    "workspace_relative",
]
