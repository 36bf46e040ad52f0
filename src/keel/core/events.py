"""The event-type registry and the event records.

Event type strings are part of the stored format: they never change meaning and
are pinned by ``tests/unit/test_event_registry.py``. Add new ones; never rename.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any


class EventType(StrEnum):
    RUN_CREATED = "run_created"  # goal, workspace, options, parent
    STATUS_CHANGED = "status_changed"  # from, to, reason
    RUN_RESUMED = "run_resumed"  # a process took the run (owner, incarnation)
    MODEL_REQUESTED = "model_requested"  # step number, model spec, message count
    MODEL_RESPONDED = "model_responded"  # content, tool calls, usage by kind, cost, finish reason
    TOOL_STARTED = "tool_started"  # call id, idempotency key, tool, exact arguments
    TOOL_FINISHED = "tool_finished"  # call id, result, changed files
    TOOL_FAILED = "tool_failed"  # call id, error kind, message
    CALL_RECONCILED = "call_reconciled"  # a started call's outcome decided on resume
    APPROVAL_REQUESTED = "approval_requested"  # call, arguments, digest, risk, expiry
    APPROVAL_GRANTED = "approval_granted"  # digest, by, reason
    APPROVAL_DENIED = "approval_denied"  # digest, by, reason
    INPUT_REQUESTED = "input_requested"  # question
    INPUT_RECEIVED = "input_received"  # answer
    BUDGET_WARNING = "budget_warning"  # dimension, used, limit
    BUDGET_EXHAUSTED = "budget_exhausted"  # dimension, used, limit
    TODO_UPDATED = "todo_updated"  # the whole new list
    PLAN_WRITTEN = "plan_written"  # plan content
    PLAN_APPROVED = "plan_approved"  # sha256 of the approved plan, the paths it names
    MODE_CHANGED = "mode_changed"  # from, to
    NOTE_ADDED = "note_added"  # a harness observation for the model (gaps, replan)
    VERIFICATION_STARTED = "verification_started"  # commands, mutation revision
    VERIFICATION_PASSED = "verification_passed"  # validation records
    VERIFICATION_FAILED = "verification_failed"  # validation records, gaps
    SUBAGENT_SPAWNED = "subagent_spawned"  # child run id
    SUBAGENT_FINISHED = "subagent_finished"  # child run id, status
    NO_PROGRESS_DETECTED = "no_progress_detected"  # what repeated
    RETRY_SCHEDULED = "retry_scheduled"  # attempt, wait, error
    CONTEXT_COMPACTED = "context_compacted"  # what was dropped from the view
    TASK_LINKED = "task_linked"  # the task this run executes
    PROCESS_STARTED = "process_started"  # call id, process group, host, boot id, start time
    PROCESS_SETTLED = "process_settled"  # call id, what resume did with a command still running
    LEASE_TAKEN_OVER = "lease_taken_over"  # the dead local holder's owner, host, pid; why
    WORKSPACE_CHANGED = "workspace_changed"  # files changed while stopped: path -> sha256 now
    POLICY_CHANGED = "policy_changed"  # the policy file read again on resume: new rules, summary
    WAITING_ON_CHILD = "waiting_on_child"  # call id, child run id, what the child waits for
    HANDED_OFF = "handed_off"  # the run that takes over (handoff), the agent, the note
    PAUSE_REQUESTED = "pause_requested"  # by, reason: the run pauses after its current step
    MESSAGE_RECEIVED = "message_received"  # text, by: a person's words the model reads next
    FOLLOW_UP_CREATED = "follow_up_created"  # run_id, by: an ended run's follow-up run
    MIDDLEWARE_DECIDED = "middleware_decided"  # middleware, point, decision, reason, patch
    SIGNOFF_REQUESTED = "signoff_requested"  # verifier, records: a person must sign off
    SIGNOFF_RECORDED = "signoff_recorded"  # verifier, passed, by, note, artifact, revision
    TRACE_STARTED = "trace_started"  # trace id, run span id of a drive (OpenTelemetry)


@dataclass(frozen=True, slots=True, kw_only=True)
class NewEvent:
    """An event before the store has given it a sequence number and a time."""

    type: EventType
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    """One stored, immutable change of a run. ``seq`` runs 1, 2, 3 … per run."""

    run_id: str
    seq: int
    event_id: str
    type: EventType
    recorded_at: datetime  # always UTC
    data: dict[str, Any]
    hash: str = ""  # sha256 chained to the previous event's (keel.core.chain); "" unstored

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "seq": self.seq,
            "event_id": self.event_id,
            "type": self.type.value,
            "recorded_at": self.recorded_at.isoformat(),
            "data": self.data,
            "hash": self.hash,
        }
