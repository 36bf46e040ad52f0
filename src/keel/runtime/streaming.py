"""``Harness.stream``: a run's events, as they are committed, to the program that started it.

The run is created in the caller's thread (bad arguments raise there, nothing stored)
and executed in a background thread by ``Harness.execute``; the iterator reads the
run's log from the store, so what it yields is exactly what was committed, in order,
each event once. It ends after the event that leaves the run terminal, waiting or
paused — then the executor is joined, whatever the store holds after that event is
yielded too, and an exception that killed the executor is raised to the caller.

Closing it early (``break`` out of the ``for``, ``close()``) asks the executor to stop
between steps (``should_stop``): the current step finishes, the lease is released and
the run stays resumable (``keel resume RUN``). ``close`` may be called from any thread.

Only the run it created is followed: a run it hands its task to (``handed_off``) is
another run, for ``Harness.resume`` or the workers.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from keel.core.events import Event, EventType
from keel.core.status import RunStatus
from keel.store.base import Store

if TYPE_CHECKING:
    from keel.loop.driver import DeltaSink
    from keel.runtime.harness import Harness

POLL_S: Final = 0.05  # longest wait for the next event before looking at the executor again
PAGE: Final = 500
SETTLED: Final = frozenset({RunStatus.WAITING, RunStatus.PAUSED})


def ends_stream(event: Event) -> bool:
    """Whether ``event`` leaves its run terminal, waiting or paused."""
    if event.type is not EventType.STATUS_CHANGED:
        return False
    try:
        status = RunStatus(str(event.data.get("to")))
    except ValueError:
        return False
    return status.terminal or status in SETTLED


class _Executor:
    """The background thread driving the run (it holds no reference to its stream, so
    a stream dropped by its caller is collected and stops it)."""

    def __init__(self, run_id: str, execute: Callable[[str, Callable[[], bool]], Any]) -> None:
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(
            target=self._run, args=(run_id, execute), name=f"keel-stream-{run_id}", daemon=True
        )
        self.thread.start()

    def _run(self, run_id: str, execute: Callable[[str, Callable[[], bool]], Any]) -> None:
        try:
            execute(run_id, self.stop.is_set)
        except BaseException as exc:  # raised again in the caller's thread
            self.error = exc


class RunStream(Iterator[Event]):
    """The events of one run that ``execute(run_id, should_stop)`` (``Harness.execute``)
    drives in a background thread, started at once."""

    def __init__(
        self,
        store: Store,
        run_id: str,
        execute: Callable[[str, Callable[[], bool]], Any],
        *,
        poll: float = POLL_S,
    ) -> None:
        self.store = store
        self.run_id = run_id
        self._poll = poll
        self._ready: deque[Event] = deque()
        self._after = 0  # the last seq handed out
        self._ended = False  # the settling event was handed out: only the rest follows
        self._finished = False  # the executor is joined and the log read to its end
        self._executor = _Executor(run_id, execute)

    def __iter__(self) -> RunStream:
        return self

    def __next__(self) -> Event:
        while not self._ready:
            if self._finished:
                error, self._executor.error = self._executor.error, None
                if error is not None:
                    raise error
                raise StopIteration
            if self._ended:
                self._finish()
            else:
                self._fill()
        event = self._ready.popleft()
        self._after = event.seq
        if not self._ended and ends_stream(event):
            self._ended = True
            self._ready.clear()  # read again once the executor is joined
        return event

    def _fill(self) -> None:
        """Queue the next events, waiting a little for them; finish once the executor is
        gone and its log read."""
        if self._executor.stop.is_set():  # closed: the caller wants no more
            self._executor.error = None
            self._finished = True
            return
        alive = self._executor.thread.is_alive()
        events = self.store.read_events(self.run_id, after=self._after, limit=PAGE)
        if events:
            self._ready.extend(events)
        elif not alive:  # it stopped without settling the run (lease lost, died)
            self._finish()
        else:
            self.store.wait_for_events(self.run_id, after=self._after, timeout=self._poll)

    def _finish(self) -> None:
        """Join the executor and queue whatever is in the log after ``_after``."""
        self._executor.thread.join()
        after = self._after
        while rest := self.store.read_events(self.run_id, after=after, limit=PAGE):
            self._ready.extend(rest)
            after = rest[-1].seq
        self._finished = True

    def close(self) -> None:
        """Stop following: the executor stops between steps (the run stays resumable)
        and is joined. Idempotent; safe from any thread."""
        self._executor.stop.set()
        self._executor.thread.join()

    def __del__(self) -> None:
        self._executor.stop.set()


def follow_run(
    store: Store,
    run_id: str,
    execute: Callable[[str, Callable[[], bool]], Any],
    *,
    poll: float = POLL_S,
) -> Iterator[Event]:
    """``RunStream`` as a generator: the executor starts at the first ``next`` and is
    stopped and joined when the generator is closed (``break``, garbage collection)."""
    stream = RunStream(store, run_id, execute, poll=poll)
    try:
        yield from stream
    finally:
        stream.close()


def stream_run(
    harness: Harness,
    goal: str,
    *,
    on_delta: DeltaSink | None = None,
    record: str | Path | None = None,
    **options: Any,
) -> Iterator[Event]:
    """``Harness.stream``: create the run now (``Harness.create``'s errors raise here,
    nothing stored), then follow it as ``follow_run`` does while ``harness`` executes it."""
    state = harness.create(goal, record=record, **options)

    def execute(run_id: str, should_stop: Callable[[], bool]) -> object:
        return harness.execute(run_id, should_stop=should_stop, on_delta=on_delta, record=record)

    return follow_run(harness.store, state.run_id, execute)
