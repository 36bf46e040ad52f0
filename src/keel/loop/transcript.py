"""The conversation, derived from the event log (pure).

The model's view is never kept only in memory: ``Transcript`` folds the same
events the store holds, so a resumed run shows the model exactly what the
original process would have. It keeps a bounded tail, so building a view costs
the same at step 10 and at step 10 000.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Iterable
from itertools import islice
from typing import Any

from keel.core.events import Event, EventType
from keel.core.state import RunState, calls_run
from keel.models.base import Message, ToolCall
from keel.store.base import Store

TRANSCRIPT_TAIL_EVENTS = 256  # first window of events read back to rebuild the conversation

KEPT_MESSAGES = 400  # how much conversation is kept in memory
VIEW_MESSAGES = 60  # how much of it the model sees each turn
MAX_TOOL_TEXT = 12_000  # characters of one tool result shown to the model


class Transcript:
    """Messages after the goal, in order; apply events as they are stored.

    A person's message (``message_received``) is shown as a user message at the model's
    next turn. One that arrives while the latest turn's calls are still being answered
    is placed after their results (a user message between a turn's calls and their
    results is invalid on the wire); log order is kept otherwise.
    """

    def __init__(self, events: Iterable[Event] = ()) -> None:
        self.messages: deque[Message] = deque(maxlen=KEPT_MESSAGES)
        self.dropped = 0
        self._unanswered: set[str] = set()  # call ids of the latest turn without a result
        self._held: list[Message] = []  # people's messages waiting for those results
        for event in events:
            self.apply(event)

    def apply(self, event: Event) -> None:
        message = _message_for(event.type, event.data)
        if message is None:
            return
        if event.type is EventType.MESSAGE_RECEIVED and self._unanswered:
            self._held.append(message)
            return
        if message.role == "assistant":
            self._unanswered = {call.id for call in message.tool_calls}
        elif message.role == "tool":
            self._unanswered.discard(message.tool_call_id or "")
        self._append(message)
        if self._held and not self._unanswered:
            held, self._held = self._held, []
            for waiting in held:
                self._append(waiting)

    def _append(self, message: Message) -> None:
        if len(self.messages) == self.messages.maxlen:
            self.dropped += 1
        self.messages.append(message)

    def view(self, limit: int = VIEW_MESSAGES) -> list[Message]:
        """The latest ``limit`` messages, never starting with an orphaned tool result."""
        messages = self.messages
        tail = list(islice(messages, max(0, len(messages) - limit), None))
        start = 0
        while start < len(tail) and tail[start].role == "tool":
            start += 1
        return tail[start:] if start else tail

    def covers_view(self) -> bool:
        """True when it holds enough messages that ``view()`` equals a rebuild from seq 1."""
        return len(self.messages) > VIEW_MESSAGES


def _message_for(kind: EventType, d: dict[str, Any]) -> Message | None:
    if kind is EventType.MODEL_RESPONDED:
        return _assistant(d)
    if kind is EventType.TOOL_FINISHED:
        return Message(
            role="tool", tool_call_id=d["call_id"], content=_clip(str(d.get("output", "")))
        )
    if kind is EventType.TOOL_FAILED:
        text = f"error ({d.get('error_kind', 'tool_error')}): {d.get('message', '')}"
        return Message(role="tool", tool_call_id=d["call_id"], content=_clip(text))
    if kind is EventType.INPUT_RECEIVED:
        return Message(
            role="tool", tool_call_id=d["call_id"], content=f"The user answered: {d['answer']}"
        )
    if kind is EventType.NOTE_ADDED:
        return Message(role="user", content=f"[harness] {d.get('text', '')}")
    if kind is EventType.MESSAGE_RECEIVED:
        return Message(role="user", content=message_text(d))
    return None


def message_text(d: dict[str, Any]) -> str:
    """A person's message (``message_received`` data) as the model reads it."""
    return f"[message from {d.get('by') or 'a person'}] {d.get('text', '')}"


def _assistant(d: dict[str, Any]) -> Message:
    """A turn as the model sees it again, with its reasoning (the provider profile decides
    whether that is sent). A turn whose calls were not run (cut at the length limit, or
    refused) is shown without them — an unanswered call is invalid on the wire — and
    its content says so."""
    calls = tuple(
        ToolCall(id=c["id"], name=c["name"], arguments=_as_text(c["arguments"]))
        for c in d.get("tool_calls", ())
    )
    finish = d.get("finish_reason")
    if calls_run(finish):
        return Message(
            role="assistant",
            content=d.get("content"),
            tool_calls=calls,
            reasoning=d.get("reasoning"),
        )
    content = d.get("content") or ""
    why = "was cut at the output length limit" if finish == "length" else f"ended: {finish}"
    unrun = f"; its {len(calls)} unfinished tool call(s) were not run" if calls else ""
    marker = f"[this reply {why}{unrun}]"
    return Message(
        role="assistant",
        content=f"{content}\n{marker}" if content else marker,
        reasoning=d.get("reasoning"),
    )


def _as_text(arguments: Any) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments)


def _clip(text: str) -> str:
    if len(text) <= MAX_TOOL_TEXT:
        return text
    omitted = len(text) - MAX_TOOL_TEXT
    return text[:MAX_TOOL_TEXT] + f"\n[truncated for the model: {omitted} characters omitted]"


def recent_transcript(store: Store, state: RunState) -> Transcript:
    """The model's conversation rebuilt from the tail of the log, not all of it.

    The window of events read grows until the transcript covers the model's view
    (or reaches the run's first event), so resuming a long run costs the same as a
    short one while the model sees exactly what the original process would have.
    """
    window = TRANSCRIPT_TAIL_EVENTS
    while True:
        after = max(0, state.last_seq - window)
        transcript = Transcript(store.read_events(state.run_id, after=after))
        if after == 0 or transcript.covers_view():
            return transcript
        window *= 4
