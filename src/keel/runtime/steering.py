"""Steering a run from any process: pause it, resume it, send it a message.

Each verb is an optimistic append (``expected_seq``), read again and retried when
another writer got in first, so it works from any process on any machine while the
run is being driven elsewhere; when it cannot apply, it raises a precise error and
writes nothing.

- ``request_pause``: a running (or verifying) run records ``pause_requested``; whoever
  drives it finishes the step under way, then ``decide`` moves it to ``paused``
  (reason ``paused by BY[: REASON]``) and starts nothing new, and the executor gives
  its lease back. A running run nobody holds is paused at once.
- ``resume_run``: a paused run goes back to ``running`` with its lease free, so any
  worker's ``claim_next_run`` picks it up (``keel resume RUN`` instead drives it in
  the foreground: ``Harness.resume``). Who resumed it is in the ``status_changed``.
- ``send_message``: on a live run, ``message_received`` — the model reads it as a user
  message at its next turn (``keel.loop.transcript``). On an ended run, a follow-up
  run: same workspace and options, ``options.follows`` naming the first run, which
  records ``follow_up_created``; the follow-up's first step puts the first run's
  outcome and evidence in its context (``follow_up_events``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from keel.core.errors import ConcurrentUpdate, InvalidTransition, RunNotFound, UsageError
from keel.core.events import EventType, NewEvent
from keel.core.records import canonical_json
from keel.core.state import RunState, transition
from keel.core.status import RunStatus
from keel.core.verifiers import evidence_map
from keel.loop.decide import pause_event
from keel.loop.outcomes import note_event
from keel.runtime.secrets import load_redactor
from keel.store.base import Store

APPEND_ATTEMPTS = 8  # optimistic appends before a ConcurrentUpdate is raised
MAX_MESSAGE_CHARS = 32_000
FOLLOW_UP_HEADER = "This run follows run "  # how the follow-up's context note begins
BRIEF_TEXT_CHARS = 2_000  # of the first run's goal and summary, in the follow-up's note
BRIEF_ITEMS = 20  # files, evidence, todos named in the follow-up's note
PAUSABLE = frozenset({RunStatus.RUNNING, RunStatus.VERIFYING})


@dataclass(frozen=True, slots=True, kw_only=True)
class MessageResult:
    """What ``send_message`` did: ``state`` is the messaged run after its new event
    (``message_received``, or ``follow_up_created`` on an ended run); ``follow_up`` the
    follow-up run an ended run got (None for a live run)."""

    state: RunState
    follow_up: RunState | None = None

    @property
    def seq(self) -> int:
        """The sequence number of the event recorded on the messaged run."""
        return self.state.last_seq


# --- pause and resume ----------------------------------------------------------------------


def request_pause(store: Store, run_id: str, *, by: str, reason: str | None = None) -> RunState:
    """Ask ``run_id`` to pause after its current step; its state after the request.

    A running run a live process holds records ``pause_requested`` {by, reason} and
    pauses at its next step boundary; one nobody holds moves to ``paused`` in the same
    append. A second request while one is pending records nothing more (the first
    one's ``by`` and reason stand). RunNotFound for an unknown run; InvalidTransition
    (nothing written) for a queued, waiting, paused or ended run; UsageError for a
    blank ``by``.
    """
    who = _who(by)
    why = reason.strip() if reason and reason.strip() else None

    def events(state: RunState) -> list[NewEvent]:
        _check_pausable(state)
        asked, request = state, []
        if state.pause_requested is None:
            data = {"by": who, "reason": why}
            request = [NewEvent(type=EventType.PAUSE_REQUESTED, data=data)]
            asked = replace(state, pause_requested=data)
        if state.status is RunStatus.RUNNING and store.current_run_lease(run_id) is None:
            return [*request, pause_event(asked)]  # nobody drives it: paused now
        return request

    return _append_retrying(store, run_id, events)


def resume_run(store: Store, run_id: str, *, by: str) -> RunState:
    """Move a paused run back to ``running`` (its ``status_changed`` names ``by``), its
    lease left free for any worker to claim. RunNotFound for an unknown run;
    InvalidTransition (nothing written) for a run that is not paused."""
    who = _who(by)

    def events(state: RunState) -> list[NewEvent]:
        check_resumable(state)
        return [transition(state, RunStatus.RUNNING, None, by=who)]

    return _append_retrying(store, run_id, events)


def check_resumable(state: RunState) -> None:
    """InvalidTransition, saying what to do instead, unless ``state`` is paused."""
    if state.status is RunStatus.PAUSED:
        return
    status = state.status
    if status.terminal:
        detail = (
            f"run {state.run_id} has ended ({status.value}); `keel message "
            f"{state.run_id} TEXT` starts a follow-up run"
        )
    elif status is RunStatus.WAITING:
        detail = (
            f"run {state.run_id} is waiting for a person ({state.reason}), not paused: "
            "approve, deny or answer it"
        )
    elif status is RunStatus.QUEUED:
        detail = f"run {state.run_id} is queued, not paused: a worker starts it"
    else:
        detail = f"run {state.run_id} is {status.value}, not paused: it is already going on"
    raise InvalidTransition(status.value, RunStatus.RUNNING.value, detail)


def _check_pausable(state: RunState) -> None:
    status = state.status
    if status in PAUSABLE:
        return
    if status.terminal:
        detail = f"run {state.run_id} has ended ({status.value}); there is nothing to pause"
    elif status is RunStatus.PAUSED:
        detail = f"run {state.run_id} is already paused ({state.reason}); `keel resume` goes on"
    elif status is RunStatus.WAITING:
        detail = (
            f"run {state.run_id} is waiting for a person ({state.reason}) and does nothing "
            "until then; cancel it to stop it for good"
        )
    else:
        detail = (
            f"run {state.run_id} is queued and has not started; pause it once it runs, or cancel it"
        )
    raise InvalidTransition(status.value, RunStatus.PAUSED.value, detail)


# --- messages ------------------------------------------------------------------------------


def send_message(
    store: Store, run_id: str, text: str, *, by: str, queue: bool = False
) -> MessageResult:
    """Give ``run_id`` a person's message (redacted of the workspace's secrets).

    A live run records ``message_received`` {text, by}: its model reads it at its next
    turn. An ended run gets a follow-up run, created ``queued`` for a worker when
    ``queue`` else ``running`` for the caller to drive (``Harness.resume``, as ``keel
    message`` does without --detach): the message is its goal, its options are the
    first run's (``follows`` = the first run's id, ``creator`` kept), and the first run
    records ``follow_up_created`` {run_id, by} (its status unchanged).
    RunNotFound for an unknown run; UsageError (nothing written) for a blank or
    oversized message or a blank ``by``.
    """
    who = _who(by)
    if not text.strip():
        raise UsageError("the message is blank: say what the run should take into account")
    if len(text) > MAX_MESSAGE_CHARS:
        raise UsageError(
            f"the message has {len(text)} characters; at most {MAX_MESSAGE_CHARS} are "
            "accepted: put long material in a file of the workspace and name it"
        )
    first = store.load_run(run_id)
    clean = load_redactor(Path(first.workspace)).scrub_text(text.strip())
    if not first.status.terminal:

        def message(state: RunState) -> list[NewEvent]:
            if state.status.terminal:
                raise _Ended()
            return [NewEvent(type=EventType.MESSAGE_RECEIVED, data={"text": clean, "by": who})]

        try:
            return MessageResult(state=_append_retrying(store, run_id, message))
        except _Ended:
            first = store.load_run(run_id)  # it ended meanwhile: a follow-up after all
    follow_up = _create_follow_up(store, first, clean, queue=queue)

    def created(state: RunState) -> list[NewEvent]:
        data = {"run_id": follow_up.run_id, "by": who}
        return [NewEvent(type=EventType.FOLLOW_UP_CREATED, data=data)]

    return MessageResult(state=_append_retrying(store, run_id, created), follow_up=follow_up)


class _Ended(Exception):
    """The run ended between reading it and appending a message to it."""


def _create_follow_up(store: Store, first: RunState, goal: str, *, queue: bool) -> RunState:
    if not queue and not first.options.workspace_git and not Path(first.workspace).is_dir():
        raise UsageError(
            f"run {first.run_id}'s workspace {first.workspace} is not on this machine any "
            "more; a follow-up works in the same workspace: start a new run there with "
            "`keel run --cwd DIR`, or queue the follow-up (--detach) for a worker that has it"
        )
    options = replace(
        first.options,
        follows=first.run_id,
        depth=0,  # a follow-up is a top-level run, whatever the first one was
        root_id=None,
        output_schema=None,
    )
    return store.create_run(goal=goal, workspace=first.workspace, options=options, queued=queue)


def follow_up_events(store: Store, state: RunState) -> list[NewEvent]:
    """The note that gives a follow-up run the first run's outcome and evidence, for its
    executor to record before the first model turn; none for any other run, or once
    recorded. A first run no longer in the store is said to be gone."""
    follows = state.options.follows
    if not follows or state.usage.steps or _has_brief(state):
        return []
    try:
        first = store.load_run(follows)
    except RunNotFound:
        return [note_event(f"{FOLLOW_UP_HEADER}{follows}, which is no longer in the store.")]
    return [note_event(outcome_brief(first))]


def _has_brief(state: RunState) -> bool:
    return any(note.startswith(FOLLOW_UP_HEADER) for note in state.notes)


def outcome_brief(first: RunState) -> str:
    """What a follow-up's model is told of the run it follows (pure): its goal, how it
    ended (status and stop reason), its summary, structured result or error, evidence,
    verifications, changed files and unfinished todos."""
    result = first.result or {}
    lines = [
        f"{FOLLOW_UP_HEADER}{first.run_id} in the same workspace; your goal is a person's "
        "message about it.",
        f"Its goal was: {_clip(first.goal)}",
        f"It ended {first.status.value}" + (f" ({first.reason})." if first.reason else "."),
    ]
    summary = result.get("summary")
    if summary:
        lines.append(f"Its summary: {_clip(str(summary))}")
    if result.get("output") is not None:
        lines.append(f"Its structured result: {_clip(canonical_json(result['output']))}")
    error = result.get("error")
    if isinstance(error, dict) and error.get("message"):
        lines.append(f"Its error: {error.get('type', 'Error')}: {_clip(str(error['message']))}")
    evidence = [f"{name}: {ref}" for name, ref in evidence_map(result).items()]
    if evidence:
        lines.append("Its evidence: " + _listed(evidence))
    if result.get("outcome"):
        lines.append(f"Its outcome: {result['outcome']}")
    if result.get("remaining_actions"):
        lines.append("Left for people: " + _listed([str(a) for a in result["remaining_actions"]]))
    if result.get("evidence_note"):
        lines.append(f"({result['evidence_note']})")
    if first.validations:
        lines.append("Its verifications (latest per command):")
        latest = {record.command: record for record in first.validations}
        for command, record in list(latest.items())[:BRIEF_ITEMS]:
            verdict = "passed" if record.passed else f"failed with exit code {record.exit_code}"
            where = f", output artifact:{record.artifact}" if record.artifact else ""
            lines.append(f"  $ {command}: {verdict} at revision {record.mutation_revision}{where}")
    if first.changed_files:
        lines.append("Files it changed: " + _listed(sorted(first.changed_files)))
    unfinished = first.unfinished_todos()
    if unfinished:
        lines.append("Its unfinished todos: " + _listed(unfinished, sep="; "))
    return "\n".join(lines)


def _listed(items: list[str], *, sep: str = ", ") -> str:
    shown = sep.join(items[:BRIEF_ITEMS])
    more = len(items) - BRIEF_ITEMS
    return shown + (f" and {more} more" if more > 0 else "")


def _clip(text: str) -> str:
    if len(text) <= BRIEF_TEXT_CHARS:
        return text
    return text[:BRIEF_TEXT_CHARS] + f" [… {len(text) - BRIEF_TEXT_CHARS} characters more]"


# --- appending ------------------------------------------------------------------------------


def _who(by: str) -> str:
    if not by or not by.strip():
        raise UsageError("who decides is blank: give the person's or token's name")
    return by.strip()


def _append_retrying(
    store: Store, run_id: str, events_for: Callable[[RunState], list[NewEvent]]
) -> RunState:
    """Append ``events_for(state)`` at the run's current sequence, reading the run again
    after a concurrent write (``events_for`` decides afresh each time, and may raise);
    the state comes back unchanged when it returns no events."""
    state = store.load_run(run_id)
    for attempt in range(APPEND_ATTEMPTS):
        events = events_for(state)
        if not events:
            return state
        try:
            new_state, _ = store.append_events(run_id, events, expected_seq=state.last_seq)
        except ConcurrentUpdate:
            if attempt + 1 == APPEND_ATTEMPTS:
                raise
            time.sleep(0.005 * attempt)  # a busy driver: let its step land, then read again
            state = store.load_run(run_id)
            continue
        return new_state
    raise AssertionError("unreachable")  # pragma: no cover


__all__ = [
    "MessageResult",
    "check_resumable",
    "follow_up_events",
    "outcome_brief",
    "request_pause",
    "resume_run",
    "send_message",
]
