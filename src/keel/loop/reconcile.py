"""Recovery of a call that started but never finished, decided without I/O.

Reads and idempotent calls run again; a write whose intent names file hashes is
checked against the workspace; anything else — a command — is first settled (a
program the dead process left running is waited for or killed) and then put to
a person, unless a person already approved running it again.
"""

from __future__ import annotations

from typing import Any

from keel.core.events import EventType, NewEvent
from keel.core.state import RunState, transition
from keel.core.status import RunStatus
from keel.loop.actions import Action, Commit, ReconcileCall, RunTool, SettleProcess
from keel.loop.situation import Situation
from keel.policy.approvals import approval_digest, grant_usable
from keel.policy.modes import Mode


def reconcile(state: RunState, sit: Situation, call: dict[str, Any]) -> Action:
    call_id, name = str(call["call_id"]), str(call["tool"])
    args: dict[str, Any] = call.get("arguments") or {}
    recovery = call.get("recovery") or "manual"
    if recovery in ("replay_safe", "idempotent"):
        return RunTool(
            call_id=call_id,
            tool=name,
            arguments=args,
            effect=str(call.get("effect") or "execute"),
            recovery=recovery,
            record_start=False,
        )
    if recovery == "verify_then_continue":
        return ReconcileCall(
            call_id=call_id, tool=name, arguments=args, intent=dict(call.get("intent") or {})
        )
    process = call.get("process")
    if isinstance(process, dict) and not call.get("settled"):
        return SettleProcess(call_id=call_id, process=dict(process))
    digest = approval_digest(name, args, str(sit.workspace))
    if grant_usable(state, digest, sit.now):  # a person said: run it again
        effect = str(call.get("effect") or "execute")
        verdict = sit.gate.decide(
            name, effect, args, mode=Mode(state.mode), workspace=sit.workspace
        )
        return RunTool(
            call_id=call_id,
            tool=name,
            arguments=args,
            effect=effect,
            recovery=recovery,
            grant=digest,
            record_start=True,
            git_writable=verdict.writes_git,
        )
    return Commit(
        events=(
            NewEvent(
                type=EventType.APPROVAL_REQUESTED,
                data={
                    "kind": "unknown_outcome",
                    "call_id": call_id,
                    "tool": name,
                    "arguments": args,
                    "digest": digest,
                    "risk": "high",
                    "why": "the process stopped while this call ran; it may or may not have "
                    "taken effect. Approve to run it again once, or deny to record it as not done."
                    + _settled_note(call),
                    "expires_at": None,
                },
            ),
            transition(state, RunStatus.WAITING, f"unknown_outcome:{call_id}"),
        )
    )


def _settled_note(call: dict[str, Any]) -> str:
    outcome = call.get("settled")
    notes = {
        "gone": " Its program was no longer running when the run resumed.",
        "waited": " Its program was still running; the resume waited until it ended.",
        "killed": " Its program was still running; the resume killed it (policy: kill).",
        "elsewhere": " Its program ran on another host; whether it still runs is unknown.",
    }
    return notes.get(str(outcome), "")


__all__ = ["reconcile"]
