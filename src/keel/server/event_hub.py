"""One process's fan-out of committed events to the SSE clients following a run.

One ``EventHub`` per server process. However many clients follow a run, ONE watcher
thread reads its new events from the store: it blocks in the store's
``wait_for_events`` (LISTEN/NOTIFY on PostgreSQL, so an event committed by any replica
or worker wakes it) or, on SQLite, polls the run's last sequence every few
milliseconds (one primary-key lookup); then it reads the new events once, turns each
into its SSE frame once, and hands the batch to the event loop with
``call_soon_threadsafe``, which appends it to every subscriber's queue. The watcher
stops when the run's last subscriber leaves.

Guarantees:
- a subscriber receives every event the watcher reads after it subscribed, in order;
  what was read before is in the store, where the subscriber's backlog read finds it
  (``keel.server.routes_events`` reads the backlog after subscribing, then drops any
  sequence number it already sent: no gap, no duplicate);
- memory is bounded: a subscriber more than ``queue_limit`` events behind is closed
  (``Subscription.closed`` says why) and dropped, never waited for; its client
  reconnects with ``Last-Event-ID`` and resumes from the store;
- subscribing and unsubscribing happen on the event loop's thread only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from keel.core.errors import KeelError
from keel.core.events import Event, EventType
from keel.core.status import RunStatus
from keel.store.base import Store

SQLITE_POLL_S: Final = 0.005  # a last_seq lookup every 5 ms per followed run
WAIT_SLICE_S: Final = 1.0  # a PostgreSQL watcher re-checks its stop flag this often
READ_PAGE: Final = 500  # events read (and fanned out) at once
QUEUE_LIMIT: Final = 4096  # events a subscriber may lag before it is closed
RETRY_S: Final = 0.5  # a watcher whose store read failed tries again after this

SETTLED: Final = frozenset({RunStatus.WAITING, RunStatus.PAUSED})


def event_json(event: Event) -> dict[str, Any]:
    """The API's view of one event: {run_id, seq, event_id, type, recorded_at, data}."""
    return {
        "run_id": event.run_id,
        "seq": event.seq,
        "event_id": event.event_id,
        "type": event.type.value,
        "recorded_at": event.recorded_at.isoformat(),
        "data": event.data,
    }


def status_after(event: Event) -> RunStatus | None:
    """The status ``event`` moves its run to, or None if it changes no status."""
    if event.type is not EventType.STATUS_CHANGED:
        return None
    try:
        return RunStatus(str(event.data.get("to")))
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class Frame:
    """One event as the SSE stream sends it (encoded once, shared by every client)."""

    seq: int
    status: RunStatus | None  # the status the event moves the run to, if any
    data: bytes  # "id: SEQ\nevent: TYPE\ndata: JSON\n\n"


def sse_frame(event: Event) -> Frame:
    body = json.dumps(event_json(event), separators=(",", ":"), ensure_ascii=False, default=str)
    text = f"id: {event.seq}\nevent: {event.type.value}\ndata: {body}\n\n"
    return Frame(seq=event.seq, status=status_after(event), data=text.encode())


@dataclass(frozen=True, slots=True)
class Batch:
    """Frames read together; ``caught_up``: the watcher saw no more events after them."""

    frames: tuple[Frame, ...]
    caught_up: bool


class Subscription:
    """One client's queue of batches for one run. Read it on the event loop only."""

    def __init__(self, run_id: str, *, limit: int) -> None:
        self.run_id = run_id
        self.closed: str | None = None  # why the hub dropped it (None: live)
        self._limit = limit
        self._queued = 0
        self._batches: deque[Batch] = deque()
        # A bare future, not an asyncio.Event + wait_for: wait_for makes a Task per wait,
        # and a subscriber waits once per batch.
        self._waiter: asyncio.Future[None] | None = None

    def offer(self, batch: Batch) -> bool:
        """Queue ``batch``; False (and closed) when that would exceed the limit."""
        if self.closed is not None:
            return False
        if self._queued + len(batch.frames) > self._limit:
            self.close(f"more than {self._limit} events behind")
            return False
        self._batches.append(batch)
        self._queued += len(batch.frames)
        self._wake()
        return True

    def close(self, why: str) -> None:
        if self.closed is None:
            self.closed = why
        self._batches.clear()
        self._queued = 0
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def next_batch(self, timeout: float) -> Batch | None:
        """The oldest queued batch; None after ``timeout`` seconds without one or once
        closed (check ``closed``)."""
        if not self._batches and self.closed is None:
            loop = asyncio.get_running_loop()
            waiter = self._waiter = loop.create_future()
            timer = loop.call_later(timeout, self._wake)
            try:
                await waiter
            finally:
                timer.cancel()
                self._waiter = None
        if not self._batches:
            return None
        batch = self._batches.popleft()
        self._queued -= len(batch.frames)
        return batch


@dataclass(slots=True, eq=False)
class _Watcher:
    run_id: str
    cursor: int
    loop: asyncio.AbstractEventLoop
    subscribers: set[Subscription] = field(default_factory=set)
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None


def _on_loop(loop: asyncio.AbstractEventLoop, function: Any, *args: Any) -> None:
    """Call ``function(*args)`` on ``loop``'s thread (now, when that is this thread)."""
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        function(*args)
        return
    with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits on it any more
        loop.call_soon_threadsafe(function, *args)


class EventHub:
    """Per-process fan-out of one store's new events (see the module docstring).

    ``poll_interval``: seconds between last-sequence checks; None waits in the store's
    own ``wait_for_events`` (right for PostgreSQL, where NOTIFY wakes it). The default
    picks 5 ms polls for SQLite and NOTIFY for anything else.
    """

    def __init__(
        self,
        store: Store,
        *,
        poll_interval: float | Literal["auto"] | None = "auto",
        queue_limit: int = QUEUE_LIMIT,
        page: int = READ_PAGE,
    ) -> None:
        self.store = store
        self.poll_interval: float | None = (
            (SQLITE_POLL_S if store.url.startswith("sqlite") else None)
            if poll_interval == "auto"
            else poll_interval
        )
        self.queue_limit = queue_limit
        self.page = page
        self._watchers: dict[str, _Watcher] = {}
        self._closed = False
        self.overflows = 0  # subscribers closed for lagging (a metric)

    # --- the event loop's side ----------------------------------------------------------

    def subscribe(self, run_id: str, *, after: int) -> Subscription:
        """A queue of the events of ``run_id`` read after this call. A new watcher starts
        reading after ``after`` (the store's last sequence as the caller last saw it)."""
        loop = asyncio.get_running_loop()
        subscription = Subscription(run_id, limit=self.queue_limit)
        if self._closed:
            subscription.close("the server is stopping")
            return subscription
        watcher = self._watchers.get(run_id)
        if watcher is None:
            watcher = self._watchers[run_id] = _Watcher(run_id=run_id, cursor=after, loop=loop)
            watcher.thread = threading.Thread(
                target=self._watch, args=(watcher,), name=f"keel-events-{run_id}", daemon=True
            )
            watcher.subscribers.add(subscription)
            watcher.thread.start()
        else:
            watcher.subscribers.add(subscription)
        return subscription

    def unsubscribe(self, subscription: Subscription) -> None:
        """Forget ``subscription``; the run's watcher stops with its last subscriber."""
        watcher = self._watchers.get(subscription.run_id)
        if watcher is None:
            return
        watcher.subscribers.discard(subscription)
        if not watcher.subscribers:
            watcher.stop.set()
            del self._watchers[subscription.run_id]

    def subscriber_count(self, run_id: str | None = None) -> int:
        if run_id is not None:
            watcher = self._watchers.get(run_id)
            return len(watcher.subscribers) if watcher else 0
        return sum(len(w.subscribers) for w in self._watchers.values())

    def watcher_count(self) -> int:
        return len(self._watchers)

    def close(self) -> None:
        """Stop every watcher and close every subscription (the server is stopping).
        Safe from any thread: subscriptions are closed on their event loop."""
        self._closed = True
        for watcher in list(self._watchers.values()):
            watcher.stop.set()
            for subscription in list(watcher.subscribers):
                _on_loop(watcher.loop, subscription.close, "the server is stopping")
        self._watchers.clear()

    def _fan_out(self, watcher: _Watcher, batch: Batch) -> None:
        for subscription in list(watcher.subscribers):
            if not subscription.offer(batch):
                self.overflows += 1
                watcher.subscribers.discard(subscription)
        if not watcher.subscribers and self._watchers.get(watcher.run_id) is watcher:
            watcher.stop.set()
            del self._watchers[watcher.run_id]

    # --- the watcher thread ---------------------------------------------------------------

    def _watch(self, watcher: _Watcher) -> None:
        after = watcher.cursor
        while not watcher.stop.is_set():
            try:
                if not self._wait(watcher, after):
                    continue
                events = self.store.read_events(watcher.run_id, after=after, limit=self.page)
            except KeelError:
                # A store that is down (a PostgreSQL restart) only delays the stream.
                watcher.stop.wait(RETRY_S)
                continue
            if not events:
                continue
            after = events[-1].seq
            batch = Batch(
                frames=tuple(sse_frame(event) for event in events),
                caught_up=len(events) < self.page,
            )
            try:
                watcher.loop.call_soon_threadsafe(self._fan_out, watcher, batch)
            except RuntimeError:  # the loop is closed: the server is gone
                return

    def _wait(self, watcher: _Watcher, after: int) -> bool:
        """Whether the run has events after ``after`` (waiting a slice for them)."""
        if self.poll_interval is None:
            return self.store.wait_for_events(watcher.run_id, after=after, timeout=WAIT_SLICE_S)
        if self.store.wait_for_events(watcher.run_id, after=after, timeout=0):
            return True
        watcher.stop.wait(self.poll_interval)
        return False
