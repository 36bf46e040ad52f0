"""A run state's snapshot: what the store keeps beside the events, and how it is read back.

``snapshot_of(state)`` is JSON-ready data; ``state_from_snapshot`` reverses it exactly
(``RunState.to_dict``/``from_dict`` call these). Pure.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from keel.core.budget import Usage
from keel.core.children import ChildRecord
from keel.core.records import Grant, PendingRequest, RunOptions, Todo, ValidationRecord
from keel.core.status import RunStatus

if TYPE_CHECKING:
    from keel.core.state import RunState


def snapshot_of(self: RunState) -> dict[str, Any]:
    """The snapshot the store keeps: the state as JSON-ready data (only the delegation
    fields that are set)."""
    return {
        "run_id": self.run_id,
        "parent_id": self.parent_id,
        "goal": self.goal,
        "workspace": self.workspace,
        "options": self.options.to_dict(),
        "status": self.status.value,
        "reason": self.reason,
        "usage": self.usage.to_dict(),
        "warned": list(self.warned),
        "todos": [t.to_dict() for t in self.todos],
        "changed_files": dict(self.changed_files),
        "mutation_revision": self.mutation_revision,
        "validations": [v.to_dict() for v in self.validations],
        "pending": self.pending.to_dict() if self.pending else None,
        "turn_calls": [dict(c) for c in self.turn_calls],
        "open_calls": dict(self.open_calls),
        "grants": {digest: g.to_dict() for digest, g in self.grants.items()},
        "mode": self.mode,
        "plan": self.plan,
        "approved_plan_sha256": self.approved_plan_sha256,
        "plan_paths": None if self.plan_paths is None else list(self.plan_paths),
        "notes": list(self.notes),
        "recent_calls": list(self.recent_calls),
        "recent_errors": list(self.recent_errors),
        "failed_attempts": self.failed_attempts,
        "no_progress_step": self.no_progress_step,
        "truncated_turns": self.truncated_turns,
        "task_id": self.task_id,
        "result": self.result,
        **_delegation_dict(self),
        "last_seq": self.last_seq,
        "last_hash": self.last_hash,
        "updated_at": self.updated_at,
    }


def _delegation_dict(self: RunState) -> dict[str, Any]:
    """The delegation and steering fields, only when set (most runs spawn nothing and
    are never paused), so older snapshots and new ones read alike."""
    d: dict[str, Any] = {}
    if self.children:
        d["children"] = {k: r.to_dict() for k, r in self.children.items()}
    if self.decisions:
        d["decisions"] = {k: [dict(r) for r in v] for k, v in self.decisions.items()}
    for key in ("child_failure", "escalation", "handoff", "pause_requested", "middleware_block"):
        value = getattr(self, key)
        if value is not None:
            d[key] = value
    return d


def state_from_snapshot(d: dict[str, Any]) -> RunState:
    """Inverse of ``snapshot_of``: snapshots written before a field existed read its default."""
    from keel.core.state import RunState  # noqa: PLC0415 - state imports this module

    return RunState(
        run_id=d["run_id"],
        parent_id=d.get("parent_id"),
        goal=d.get("goal", ""),
        workspace=d.get("workspace", ""),
        options=RunOptions.from_dict(d.get("options", {})),
        status=RunStatus(d["status"]),
        reason=d.get("reason"),
        usage=Usage.from_dict(d.get("usage", {})),
        warned=tuple(d.get("warned", ())),
        todos=tuple(Todo(**t) for t in d.get("todos", ())),
        changed_files=dict(d.get("changed_files", {})),
        mutation_revision=int(d.get("mutation_revision", 0)),
        validations=tuple(ValidationRecord.from_dict(v) for v in d.get("validations", ())),
        pending=PendingRequest.from_dict(d["pending"]) if d.get("pending") else None,
        turn_calls=tuple(dict(c) for c in d.get("turn_calls", ())),
        open_calls=dict(d.get("open_calls", {})),
        grants={k: Grant.from_value(v) for k, v in (d.get("grants") or {}).items()},
        mode=d.get("mode", "edit"),
        plan=d.get("plan"),
        approved_plan_sha256=d.get("approved_plan_sha256"),
        plan_paths=None if d.get("plan_paths") is None else tuple(d["plan_paths"]),
        notes=tuple(d.get("notes", ())),
        recent_calls=tuple(d.get("recent_calls", ())),
        recent_errors=tuple(d.get("recent_errors", ())),
        failed_attempts=int(d.get("failed_attempts", 0)),
        no_progress_step=d.get("no_progress_step"),
        truncated_turns=int(d.get("truncated_turns", 0)),
        task_id=d.get("task_id"),
        result=d.get("result"),
        children={k: ChildRecord.from_dict(v) for k, v in (d.get("children") or {}).items()},
        child_failure=d.get("child_failure"),
        escalation=d.get("escalation"),
        handoff=d.get("handoff"),
        pause_requested=d.get("pause_requested"),
        decisions={k: tuple(dict(r) for r in v) for k, v in (d.get("decisions") or {}).items()},
        middleware_block=d.get("middleware_block"),
        last_seq=int(d.get("last_seq", 0)),
        last_hash=str(d.get("last_hash") or ""),
        updated_at=d.get("updated_at"),
    )


__all__ = ["snapshot_of", "state_from_snapshot"]
