"""A run's events over HTTP: a page after a sequence number, and a live SSE stream.

``GET /runs/{id}/events/stream`` sends ``id: SEQ``, ``event: TYPE``, ``data: JSON`` per
event. It starts after ``Last-Event-ID`` (or ``?after=``), sends the backlog from the
store, then what the process's ``EventHub`` fans out, dropping any sequence number it
already sent, so a client that reconnects with the last id it saw gets every event
exactly once. It subscribes BEFORE it reads the backlog: an event is then either in the
backlog read or in the subscription's queue (or both), never in neither. A ``:
keep-alive`` comment goes out when nothing did for ``keepalive_seconds``. The stream
ends after the event that makes the run terminal (plus whatever the store already holds
after it), and with ``?until=settled`` also once the run waits or is paused with
nothing more to send. A client that lags too far behind is cut off (it reconnects
with ``Last-Event-ID``); one that goes away frees its subscription at once.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from enum import StrEnum
from typing import Annotated, Any, Final

from fastapi import APIRouter, Header, Query, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from keel.core.errors import UsageError
from keel.core.status import RunStatus
from keel.server.config import ServeConfig
from keel.server.context import context_of
from keel.server.event_hub import SETTLED, EventHub, Frame, Subscription, event_json, sse_frame
from keel.store.base import Store

PAGE_MAX: Final = 1000
MAX_SEQ: Final = 2**63 - 1  # the largest sequence number a store can hold (a BIGINT)
SEQ_PATTERN: Final = re.compile(r"[0-9]{1,19}")
BACKLOG_PAGE: Final = 500
KEEPALIVE: Final = b": keep-alive\n\n"
SSE_HEADERS: Final = {
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",  # a proxy in front must not hold the stream back
}

router = APIRouter(tags=["events"])


class Until(StrEnum):
    TERMINAL = "terminal"  # the run completed, failed, was blocked or cancelled
    SETTLED = "settled"  # ... or waits for a person, or is paused


def hub_of(request: Request) -> EventHub:
    """The process's one hub, made at its first use and closed with the server."""
    hub: EventHub | None = getattr(request.app.state, "event_hub", None)
    if hub is None:
        context = context_of(request)
        hub = request.app.state.event_hub = EventHub(context.store)
        context.add_closer(hub.close)
    return hub


@router.get("/runs/{run_id}/events")
async def run_events(
    request: Request,
    run_id: str,
    after: Annotated[
        int, Query(ge=0, le=MAX_SEQ, description="return events with seq > after")
    ] = 0,
    limit: Annotated[int, Query(ge=1, le=PAGE_MAX)] = PAGE_MAX,
) -> dict[str, Any]:
    """A page of the run's events after ``after``, in order, and the run's last
    sequence number (more to read while ``events[-1].seq < last_seq``)."""
    context = context_of(request)
    events = await context.read(context.store.read_events, run_id, after=after, limit=limit)
    state = await context.read(context.store.load_run, run_id)
    return {"events": [event_json(event) for event in events], "last_seq": state.last_seq}


@router.get(
    "/runs/{run_id}/events/stream",
    response_class=StreamingResponse,
    responses={200: {"content": {"text/event-stream": {}}, "description": "SSE events"}},
)
async def stream_run_events(
    request: Request,
    run_id: str,
    after: Annotated[int, Query(ge=0, le=MAX_SEQ, description="start after this seq")] = 0,
    until: Until = Until.TERMINAL,
    last_event_id: Annotated[str | None, Header()] = None,
) -> StreamingResponse:
    """The run's events as Server-Sent Events (see the module docstring)."""
    start = parse_last_event_id(last_event_id) if last_event_id is not None else after
    store = context_of(request).store
    state = await run_in_threadpool(store.load_run, run_id)  # RunNotFound: 404 before streaming
    config: ServeConfig | None = getattr(request.app.state, "config", None)
    keepalive = config.keepalive_seconds if config is not None else 15.0
    hub = hub_of(request)
    follow = EventFollower(
        store, hub, run_id, after=start, status=state.status, seen=state.last_seq, until=until
    )
    return EventStreamResponse(follow.frames(keepalive), headers=SSE_HEADERS)


def parse_last_event_id(value: str) -> int:
    """The sequence number a ``Last-Event-ID`` header names; UsageError (422) if none."""
    text = value.strip()
    if SEQ_PATTERN.fullmatch(text) is None or int(text) > MAX_SEQ:
        raise UsageError(
            f"Last-Event-ID {value[:40]!r} is not an event sequence number (0, 1, 2, ...)"
        )
    return int(text)


class EventStreamResponse(StreamingResponse):
    """``text/event-stream`` whose generator is always closed when the response ends,
    however it ends (done, client gone, server stopping): its subscription goes too."""

    media_type = "text/event-stream"

    def __init__(self, content: AsyncIterator[bytes], headers: dict[str, str]) -> None:
        super().__init__(content, headers=headers)
        self._frames = content

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            aclose = getattr(self._frames, "aclose", None)
            if aclose is not None:
                await aclose()


class EventFollower:
    """One client's stream: backlog from the store, then the hub's batches."""

    def __init__(
        self,
        store: Store,
        hub: EventHub,
        run_id: str,
        *,
        after: int,
        status: RunStatus,
        seen: int,
        until: Until,
    ) -> None:
        self.store = store
        self.hub = hub
        self.run_id = run_id
        self.sent = after  # the last seq this client has
        self.status = status  # the run's status as of seq ``seen``
        self.seen = seen
        self.until = until
        self.done = False

    async def frames(self, keepalive: float) -> AsyncIterator[bytes]:
        # A terminal run gets no new events that matter: the store has them all.
        live = None if self.status.terminal else self.hub.subscribe(self.run_id, after=self.seen)
        try:
            async for chunk in self._backlog():
                yield chunk
            if live is not None and not self.done and not self._settled():
                async for chunk in self._live(live, keepalive):
                    yield chunk
            if self.done:  # and what already landed after the terminal event
                async for chunk in self._backlog(to_the_end=True):
                    yield chunk
        finally:
            if live is not None:
                self.hub.unsubscribe(live)

    async def _backlog(
        self, *, last: int | None = None, to_the_end: bool = False
    ) -> AsyncIterator[bytes]:
        """What the store holds after ``sent`` (up to ``last``), stopping after the
        terminal event unless ``to_the_end``."""
        while to_the_end or not self.done:
            want = BACKLOG_PAGE if last is None else min(BACKLOG_PAGE, last - self.sent)
            if want <= 0:
                return
            events = await run_in_threadpool(
                self.store.read_events, self.run_id, after=self.sent, limit=want
            )
            chunk = self._take([sse_frame(event) for event in events], to_the_end=to_the_end)
            if chunk:
                yield chunk
            if len(events) < want:
                return

    async def _live(self, subscription: Subscription, keepalive: float) -> AsyncIterator[bytes]:
        while True:
            batch = await subscription.next_batch(keepalive)
            if batch is None:
                if subscription.closed is not None:  # the client resumes with Last-Event-ID
                    yield f": reconnect: {subscription.closed}\n\n".encode()
                    return
                yield KEEPALIVE
                continue
            frames = [frame for frame in batch.frames if frame.seq > self.sent]
            if frames and frames[0].seq > self.sent + 1:  # not expected; never a gap either
                async for chunk in self._backlog(last=frames[0].seq - 1):
                    yield chunk
            chunk = self._take(frames)
            if chunk:
                yield chunk
            if self.done:
                return
            if batch.caught_up and self._settled():
                return

    def _take(self, frames: list[Frame], *, to_the_end: bool = False) -> bytes:
        """The frames to send (in order, after ``sent``), stopping after a terminal one
        unless ``to_the_end``."""
        out: list[bytes] = []
        for frame in frames:
            if frame.seq <= self.sent:
                continue
            out.append(frame.data)
            self.sent = frame.seq
            if frame.status is not None and frame.seq > self.seen:
                self.status = frame.status
            if frame.status is not None and frame.status.terminal:
                self.done = True
                if not to_the_end:
                    break
        return b"".join(out)

    def _settled(self) -> bool:
        """Caught up with a run that stays where it is until someone acts."""
        if self.sent < self.seen:
            return False
        if self.status.terminal:
            return True
        return self.until is Until.SETTLED and self.status in SETTLED
