"""Event type strings are stored forever: this pins them. Add new ones; never rename."""

from __future__ import annotations

from keel.core.events import EventType
from keel.core.state import _APPLY

PINNED = {
    "RUN_CREATED": "run_created",
    "STATUS_CHANGED": "status_changed",
    "RUN_RESUMED": "run_resumed",
    "MODEL_REQUESTED": "model_requested",
    "MODEL_RESPONDED": "model_responded",
    "TOOL_STARTED": "tool_started",
    "TOOL_FINISHED": "tool_finished",
    "TOOL_FAILED": "tool_failed",
    "CALL_RECONCILED": "call_reconciled",
    "APPROVAL_REQUESTED": "approval_requested",
    "APPROVAL_GRANTED": "approval_granted",
    "APPROVAL_DENIED": "approval_denied",
    "INPUT_REQUESTED": "input_requested",
    "INPUT_RECEIVED": "input_received",
    "BUDGET_WARNING": "budget_warning",
    "BUDGET_EXHAUSTED": "budget_exhausted",
    "TODO_UPDATED": "todo_updated",
    "PLAN_WRITTEN": "plan_written",
    "PLAN_APPROVED": "plan_approved",
    "MODE_CHANGED": "mode_changed",
    "NOTE_ADDED": "note_added",
    "VERIFICATION_STARTED": "verification_started",
    "VERIFICATION_PASSED": "verification_passed",
    "VERIFICATION_FAILED": "verification_failed",
    "SUBAGENT_SPAWNED": "subagent_spawned",
    "SUBAGENT_FINISHED": "subagent_finished",
    "NO_PROGRESS_DETECTED": "no_progress_detected",
    "RETRY_SCHEDULED": "retry_scheduled",
    "CONTEXT_COMPACTED": "context_compacted",
    "TASK_LINKED": "task_linked",
    "PROCESS_STARTED": "process_started",
    "PROCESS_SETTLED": "process_settled",
    "LEASE_TAKEN_OVER": "lease_taken_over",
    "WORKSPACE_CHANGED": "workspace_changed",
    "POLICY_CHANGED": "policy_changed",
    "WAITING_ON_CHILD": "waiting_on_child",
    "HANDED_OFF": "handed_off",
    "PAUSE_REQUESTED": "pause_requested",
    "MESSAGE_RECEIVED": "message_received",
    "FOLLOW_UP_CREATED": "follow_up_created",
    "MIDDLEWARE_DECIDED": "middleware_decided",
    "SIGNOFF_REQUESTED": "signoff_requested",
    "SIGNOFF_RECORDED": "signoff_recorded",
    "TRACE_STARTED": "trace_started",
}


def test_pinned_event_types_keep_their_stored_strings() -> None:
    current = {member.name: member.value for member in EventType}
    for name, value in PINNED.items():
        assert current.get(name) == value, f"{name} must stay {value!r}"


def test_new_event_types_are_added_to_the_pin_list() -> None:
    unpinned = sorted(set(EventType.__members__) - set(PINNED))
    assert not unpinned, f"pin these in PINNED once their string is final: {unpinned}"


def test_spec_event_types_all_exist() -> None:
    spec = [
        "run_created",
        "status_changed",
        "model_requested",
        "model_responded",
        "tool_started",
        "tool_finished",
        "tool_failed",
        "approval_requested",
        "approval_granted",
        "approval_denied",
        "input_requested",
        "input_received",
        "budget_warning",
        "budget_exhausted",
        "todo_updated",
        "plan_written",
        "verification_started",
        "verification_passed",
        "verification_failed",
        "subagent_spawned",
        "subagent_finished",
        "no_progress_detected",
        "retry_scheduled",
        "context_compacted",
    ]
    assert set(spec) <= {t.value for t in EventType}


def test_event_type_strings_are_unique_and_snake_case() -> None:
    values = [t.value for t in EventType]
    assert len(values) == len(set(values))
    assert all(v == v.lower() and " " not in v for v in values)


def test_every_event_type_has_a_fold_rule() -> None:
    assert set(_APPLY) == set(EventType)
