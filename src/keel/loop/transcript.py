"""The conversation, derived from the event log (pure).

The model's view is never kept only in memory: ``Transcript`` folds the same
events the store holds, so a resumed run shows the model exactly what the
original process would have. The view is every message since the latest
``context_compacted`` event, after that event's continuation (``keel.loop.context``
decides when to compact and what the continuation says; this module only applies
what the log records). The running token total is kept as messages come and go,
so measuring the view costs the same at step 10 and at step 10 000.
"""

from __future__ import annotations

import json
import re
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from keel.core.events import Event, EventType
from keel.core.state import RunState, calls_run
from keel.loop.token_estimate import message_tokens
from keel.models.base import Message, ToolCall
from keel.store.base import Store

TRANSCRIPT_TAIL_EVENTS = 256  # first window of events read back to rebuild the conversation

# A user message between a turn's calls and their results is invalid on the wire.
HELD_UNTIL_ANSWERED = frozenset({EventType.MESSAGE_RECEIVED, EventType.NOTE_ADDED})
MAX_TOOL_TEXT = 12_000  # characters of one tool result shown to the model
ARTIFACT_REFERENCE = re.compile(r"artifact:([A-Za-z0-9_-]+)")


@dataclass(frozen=True, slots=True, kw_only=True)
class Entry:
    """One message of the view with what compaction needs to know of it: the event it
    came from (``seq``), its estimated tokens, the failed call it reports (tool,
    arguments, error) and the artifacts its event names."""

    seq: int
    message: Message
    tokens: int
    failure: dict[str, Any] | None = None
    artifacts: tuple[str, ...] = ()


class Transcript:
    """Messages after the goal, in order; apply events as they are stored.

    A person's message (``message_received``) is shown as a user message at the model's
    next turn. One that arrives while the latest turn's calls are still being answered
    is placed after their results (a user message between a turn's calls and their
    results is invalid on the wire); log order is kept otherwise.

    A ``context_compacted`` event drops every message whose event is at or before its
    ``through_seq`` and shows its continuation text instead, first. ``tokens`` is the
    estimated size of ``view()``, kept as a running total (never recounted).
    """

    def __init__(self, events: Iterable[Event] = ()) -> None:
        self.entries: deque[Entry] = deque()
        self._messages: list[Message] = []  # entries' messages, kept beside them: view()
        # copies one list of references per step instead of walking every entry
        self.compaction: dict[str, Any] | None = None  # the latest context_compacted data
        self.continuation: Message | None = None
        self.tokens = 0  # of view(): the continuation and every entry
        self._unanswered: set[str] = set()  # call ids of the latest turn without a result
        self._held: list[Entry] = []  # people's messages waiting for those results
        for event in events:
            self.apply(event)

    @property
    def messages(self) -> list[Message]:
        """The messages after the continuation, in order."""
        return list(self._messages)

    @property
    def holding(self) -> bool:
        """Whether a person's message waits for the latest turn's results."""
        return bool(self._held)

    def apply(self, event: Event) -> None:
        if event.type is EventType.CONTEXT_COMPACTED:
            self._compact(event.data)
            return
        message = _message_for(event.type, event.data)
        if message is None:
            return
        entry = Entry(
            seq=event.seq,
            message=message,
            tokens=message_tokens(message),
            failure=_failure(event),
            artifacts=_artifacts(event),
        )
        if self._unanswered and event.type in HELD_UNTIL_ANSWERED:
            self._held.append(entry)
            return
        if message.role == "assistant":
            self._unanswered = {call.id for call in message.tool_calls}
        elif message.role == "tool":
            self._unanswered.discard(message.tool_call_id or "")
        self._append(entry)
        if self._held and not self._unanswered:
            held, self._held = self._held, []
            for waiting in held:
                self._append(waiting)

    def _append(self, entry: Entry) -> None:
        self.entries.append(entry)
        self._messages.append(entry.message)
        self.tokens += entry.tokens

    def _compact(self, d: dict[str, Any]) -> None:
        """Drop what the compaction covers and show its continuation. Counting the kept
        entries again happens once per compaction, never per step."""
        through = int(d["through_seq"])
        self.entries = deque(entry for entry in self.entries if entry.seq > through)
        self._messages = [entry.message for entry in self.entries]
        self.compaction = d
        self.continuation = Message(role="user", content=str(d.get("text", "")))
        kept = sum(entry.tokens for entry in self.entries)
        self.tokens = kept + message_tokens(self.continuation)

    def view(self) -> list[Message]:
        """The continuation (after a compaction), then every message since; never
        starting with an orphaned tool result (compaction cuts only before a turn)."""
        if self.continuation is None:
            return list(self._messages)
        return [self.continuation, *self._messages]

    def __iter__(self) -> Iterator[Entry]:
        return iter(self.entries)


def _message_for(kind: EventType, d: dict[str, Any]) -> Message | None:
    if kind is EventType.MODEL_RESPONDED:
        return _assistant(d)
    if kind is EventType.TOOL_FINISHED:
        shown = d.get("shown", d.get("output", ""))  # what middleware left of the output
        return Message(role="tool", tool_call_id=d["call_id"], content=_clip(str(shown)))
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


def _failure(event: Event) -> dict[str, Any] | None:
    if event.type is not EventType.TOOL_FAILED:
        return None
    d = event.data
    return {
        "tool": str(d.get("tool", "")),
        "arguments": d.get("arguments"),
        "error": str(d.get("message", "")),
        "seq": event.seq,
    }


def _artifacts(event: Event) -> tuple[str, ...]:
    """Artifact ids the event's full output names (the shown text may be clipped)."""
    if event.type is not EventType.TOOL_FINISHED:
        return ()
    output = event.data.get("output")
    if not isinstance(output, str) or "artifact:" not in output:
        return ()
    return tuple(dict.fromkeys(ARTIFACT_REFERENCE.findall(output)))


def recent_transcript(store: Store, state: RunState, *, upto: int | None = None) -> Transcript:
    """The model's conversation rebuilt from the log back to its latest compaction only
    (through event ``upto`` when given, else everything stored).

    Windows of events are read backwards (growing fourfold) until one holds a
    ``context_compacted`` event or reaches the run's first event; the transcript is
    then folded from just after that compaction's ``through_seq``. So resuming a long
    run costs what the kept context costs, while the model sees exactly what the
    original process would have.
    """
    window = TRANSCRIPT_TAIL_EVENTS
    while True:
        after = max(0, state.last_seq - window)
        events = list(store.read_events(state.run_id, after=after))
        if upto is not None:
            events = [e for e in events if e.seq <= upto]
        latest = next((e for e in reversed(events) if e.type is EventType.CONTEXT_COMPACTED), None)
        if latest is not None:
            through = int(latest.data["through_seq"])
            if through < after:  # the kept part starts before this window: read just that
                earlier = store.read_events(state.run_id, after=through, limit=after - through)
                events = [*earlier, *events]
            return Transcript(e for e in events if e.seq > through)
        if after == 0:
            return Transcript(events)
        window *= 4
