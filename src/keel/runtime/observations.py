"""What a parent model is shown of its children: results, statuses, and the JSON they travel in.

Pure formatting of observations already decided by ``keel.runtime.delegation``; the
one read (``recorded_finish``) finds a child's recorded end on its parent's log.
"""

from __future__ import annotations

import json
from typing import Any

from keel.core.events import EventType
from keel.core.state import RunState
from keel.store.base import Store, iter_all_events
from keel.tools.base import ToolContext, ToolResult

MAX_OUTPUT_IN_RESULT = 32_000  # characters of a child's output shown to the parent model


def started_result(child_id: str, task_id: str | None, agent: str, *, again: bool) -> ToolResult:
    word = "already running" if again else "started"
    return ToolResult(
        output=as_json(
            {
                "child_run_id": child_id,
                "task_id": task_id,
                "agent": agent,
                "status": word,
                "collect_with": f'agent_wait(["{task_id or child_id}"])',
            }
        )
    )


def waiting_on(ctx: ToolContext, child: RunState) -> dict[str, Any]:
    return {
        "call_id": ctx.call_id,
        "child_run_id": child.run_id,
        "what": child.reason,
        "tool": "agent_spawn",
    }


def status_only(child: RunState) -> dict[str, Any]:
    return {
        "child_run_id": child.run_id,
        "task_id": child.task_id,
        "status": child.status.value,
        "reason": child.reason,
        "steps": child.usage.steps,
    }


def shown_observation(data: dict[str, Any]) -> dict[str, Any]:
    shown = {
        k: data.get(k)
        for k in (
            "child_run_id",
            "task_id",
            "agent",
            "status",
            "reason",
            "summary",
            "output",
            "evidence",
            "base_revision",
            "base_commit",
            "patch",
            "patch_files",
            "stale",
            "policy",
            "retried_as",
            "retry_refused",
        )
        if data.get(k) not in (None, [], "")
    }
    usage = data.get("usage") or {}
    shown["usage"] = {k: usage.get(k) for k in ("steps", "tool_calls", "tokens", "cost")}
    if data.get("patch"):
        shown["patch_files"] = list(data.get("patch_files") or [])
        shown["stale"] = list(data.get("stale") or [])
        shown["integrate_with"] = f'apply_patch("{data["patch"]}")'
    if data.get("stale"):
        shown["stale_note"] = (
            "you changed these files after the child started: review before applying"
        )
    return shown


def recorded_finish(store: Store, parent_id: str, child_id: str) -> dict[str, Any] | None:
    for event in iter_all_events(store, parent_id):
        if event.type is EventType.SUBAGENT_FINISHED and event.data.get("child_run_id") == child_id:
            return dict(event.data)
    return None


def as_json(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, indent=1, sort_keys=True)
    if len(text) > MAX_OUTPUT_IN_RESULT:
        text = text[:MAX_OUTPUT_IN_RESULT] + "\n[truncated]"
    return text


__all__ = [
    "as_json",
    "recorded_finish",
    "shown_observation",
    "started_result",
    "status_only",
    "waiting_on",
]
