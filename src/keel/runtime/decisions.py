"""What people do to a run from any process: approve, deny, answer, cancel.

Each is one optimistic append: it checks what the run is waiting for, writes the
decision and the move back to ``running`` atomically, and fails with a precise
error (and nothing written) when there is nothing to decide. Every decision records
who took it (``by``: a person's name, or ``token:NAME`` through the API).
"""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime

from keel.core.errors import NothingPending, PendingCallChanged, UsageError
from keel.core.events import EventType, NewEvent
from keel.core.state import RunState, transition
from keel.core.status import RunStatus
from keel.policy.approvals import APPROVAL_KINDS, is_expired
from keel.policy.approvals import decide_approval as approval_decision
from keel.runtime.cancel_tree import cancel_tree
from keel.store.base import Store

DEFAULT_BY = "cli user"  # who decided, when a caller names no one


def decide_approval(
    store: Store,
    run_id: str,
    *,
    deny: bool,
    reason: str | None,
    by: str,
    digest: str | None = None,
) -> RunState:
    """Approve or deny what the run waits for. With ``digest``, only if the pending call
    is still the one with that digest (``PendingCallChanged`` otherwise): the check and
    the decision are made on one read of the run and appended with its sequence number,
    so a call that changes in between makes the append fail instead of being decided."""
    state = store.load_run(run_id)
    pending = state.pending
    if (
        state.status is not RunStatus.WAITING
        or pending is None
        or pending.kind not in APPROVAL_KINDS
    ):
        raise NothingPending(run_id, f"an approval (it is {_describe(state)})")
    if digest is not None and pending.digest != digest:
        now = f"{pending.tool or '?'} (call {pending.call_id}, digest {pending.digest})"
        raise PendingCallChanged(run_id, digest, now)
    if deny and not (reason and reason.strip()):
        raise UsageError("a denial needs a reason: --deny --reason TEXT (the model is told it)")
    if pending.expires_at and is_expired(pending.expires_at, datetime.now(UTC)):
        store.append_events(
            run_id,
            [transition(state, RunStatus.FAILED, "approval_timeout")],
            expected_seq=state.last_seq,
        )
        raise UsageError(
            f"the approval request of run {run_id} expired at {pending.expires_at}; "
            "the run is now failed with approval_timeout"
        )
    events = [
        approval_decision(state, approve=not deny, by=by, reason=reason, now=datetime.now(UTC))
    ]
    if deny and pending.kind == "child_failure":
        pass  # giving up on a failed child: the decision fails the run with it
    elif deny:
        if pending.kind == "unknown_outcome":
            events.append(
                NewEvent(
                    type=EventType.CALL_RECONCILED,
                    data={
                        "call_id": pending.call_id,
                        "outcome": "not_done",
                        "detail": f"recorded as not done by {by}: {reason}",
                    },
                )
            )
        what = "recorded as not done" if pending.kind == "unknown_outcome" else "denied"
        events.append(
            NewEvent(
                type=EventType.TOOL_FAILED,
                data={
                    "call_id": pending.call_id,
                    "tool": pending.tool,
                    "arguments": pending.arguments,
                    "error_kind": "approval_denied",
                    "message": f"{what} by {by}: {reason}",
                },
            )
        )
    events.append(transition(state, RunStatus.RUNNING, None))
    new_state, _ = store.append_events(run_id, events, expected_seq=state.last_seq)
    return new_state


def answer_question(store: Store, run_id: str, text: str, *, by: str = DEFAULT_BY) -> RunState:
    """Answer the question a waiting run asked (or instruct it about a failed child);
    ``by`` (who answered) is recorded with the answer."""
    state = store.load_run(run_id)
    pending = state.pending
    if (
        state.status is not RunStatus.WAITING
        or pending is None
        or pending.kind not in ("question", "child_failure")
    ):
        raise NothingPending(run_id, f"an answer (it is {_describe(state)})")
    if not text.strip():
        raise UsageError("the answer is blank: say something the model can act on")
    events = [
        NewEvent(
            type=EventType.INPUT_RECEIVED,
            data={
                "call_id": pending.call_id,
                "question": pending.question,
                "answer": text,
                "by": by,
            },
        ),
    ]
    if pending.kind == "child_failure":  # an instruction instead of a retry: the model reads it
        child = (pending.arguments or {}).get("child_run_id")
        events.append(
            NewEvent(
                type=EventType.NOTE_ADDED,
                data={"text": f"A person's instruction about failed child {child}: {text}"},
            )
        )
    events.append(transition(state, RunStatus.RUNNING, None))
    new_state, _ = store.append_events(run_id, events, expected_seq=state.last_seq)
    return new_state


def sign_off(
    store: Store,
    run_id: str,
    verifier: str,
    *,
    by: str = DEFAULT_BY,
    deny: bool = False,
    reason: str | None = None,
) -> RunState:
    """A person's sign-off as verifier ``verifier`` of a run waiting for it (``keel approve
    RUN --verifier NAME``), bound to the revision they looked at.

    Signed: the record (and an artifact saying who, when, at which revision) is the
    verifier's evidence, and the run goes back to verifying — its commands passed at this
    revision already, so it completes unless something else is missing. Declined (a
    reason is required): the run goes back to work with the person's reason, a gap the
    agent can act on. ``NothingPending`` when the run does not wait for this sign-off."""
    state = store.load_run(run_id)
    pending = state.pending
    if state.status is not RunStatus.WAITING or pending is None or pending.kind != "signoff":
        raise NothingPending(run_id, f"a sign-off (it is {_describe(state)})")
    if pending.question != verifier:
        raise UsageError(
            f"run {run_id} waits for the sign-off of {pending.question!r}, not {verifier!r}"
        )
    if deny and not (reason and reason.strip()):
        raise UsageError("declining needs a reason: --deny --reason TEXT (the model is told it)")
    revision = state.mutation_revision
    now = datetime.now(UTC).isoformat()
    said = f": {reason.strip()}" if reason and reason.strip() else ""
    note = f"{'declined' if deny else 'signed off'} by {by}{said}"
    content = json.dumps(
        {
            "verifier": verifier,
            "signed": not deny,
            "by": by,
            "at": now,
            "mutation_revision": revision,
            "reason": reason,
            "changed_files": dict(state.changed_files),
        },
        indent=2,
    ).encode("utf-8")
    artifact = store.put_artifact(run_id, f"signoff-{verifier}.json", content)
    events = [
        NewEvent(
            type=EventType.SIGNOFF_RECORDED,
            data={
                "verifier": verifier,
                "passed": not deny,
                "by": by,
                "note": note,
                "artifact": artifact.id,
                "mutation_revision": revision,
            },
        ),
        transition(state, RunStatus.RUNNING, None),
    ]
    running = replace(state, status=RunStatus.RUNNING)
    if deny:
        events.append(
            NewEvent(
                type=EventType.NOTE_ADDED,
                data={
                    "text": f"{verifier} did not sign off ({note}). Address it, then "
                    "request completion again."
                },
            )
        )
    else:
        events.append(transition(running, RunStatus.VERIFYING, f"signed off by {by}"))
    new_state, _ = store.append_events(run_id, events, expected_seq=state.last_seq)
    return new_state


def cancel_run(store: Store, run_id: str, reason: str, *, by: str = DEFAULT_BY) -> RunState:
    """Cancel the run and every live descendant (``keel.runtime.cancel_tree``); the
    claims of each go back now. Returns the run's new state; ``by`` is recorded on its
    ``status_changed``."""
    return cancel_tree(store, run_id, reason, by=by).state


def _describe(state: RunState) -> str:
    if state.status is RunStatus.WAITING and state.pending is not None:
        return f"waiting for {state.pending.kind.replace('_', ' ')}"
    return state.status.value
