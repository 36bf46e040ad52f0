"""``AsyncHarness``: the harness for asyncio programs, without blocking their event loop.

Every blocking call (the store, the model, tools) runs in a worker thread. ``stream``
is ``Harness.stream`` read by a thread that hands each event to the loop through an
``asyncio.Queue`` (``call_soon_threadsafe``): the loop only ever awaits. Leaving the
``async for`` early (``break``, cancellation) stops the run between steps — resumable —
and waits, off the loop, for its executor to let go.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator
from typing import Any

from keel.core.events import Event
from keel.core.state import RunState
from keel.runtime.harness import Harness, RunOutcome
from keel.runtime.streaming import RunStream


class AsyncHarness:
    """An asyncio front door over a ``Harness`` (made from the same arguments, or given
    as ``harness=``)."""

    def __init__(self, *args: Any, harness: Harness | None = None, **kwargs: Any) -> None:
        self.harness = harness if harness is not None else Harness(*args, **kwargs)

    async def run(self, goal: str, **options: Any) -> RunOutcome:
        """``Harness.run`` in a worker thread."""
        return await asyncio.to_thread(self.harness.run, goal, **options)

    async def resume(self, run_id: str, **options: Any) -> RunOutcome:
        return await asyncio.to_thread(self.harness.resume, run_id, **options)

    async def approve(self, run_id: str, **options: Any) -> RunState:
        return await asyncio.to_thread(self.harness.approve, run_id, **options)

    async def answer(self, run_id: str, text: str) -> RunState:
        return await asyncio.to_thread(self.harness.answer, run_id, text)

    async def cancel(self, run_id: str, reason: str) -> RunState:
        return await asyncio.to_thread(self.harness.cancel, run_id, reason)

    async def get(self, run_id: str) -> RunState:
        return await asyncio.to_thread(self.harness.get, run_id)

    async def stream(self, goal: str, **options: Any) -> AsyncIterator[Event]:
        """``Harness.stream`` as an async iterator: the run is created (its errors raise
        at the first ``__anext__``), driven in a thread, and each committed event
        yielded; it ends as ``Harness.stream`` does, raising what killed the executor."""
        state = await asyncio.to_thread(self.harness.create, goal, **_create_options(options))
        stream = RunStream(
            self.harness.store,
            state.run_id,
            lambda run_id, stop: self.harness.execute(
                run_id, should_stop=stop, **_execute_options(options)
            ),
        )
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[Event | None, BaseException | None]] = asyncio.Queue()
        reader = threading.Thread(
            target=_read, args=(stream, loop, queue), name=f"keel-astream-{state.run_id}"
        )
        reader.start()
        try:
            while True:
                event, error = await queue.get()
                if error is not None:
                    raise error
                if event is None:
                    return
                yield event
        finally:
            await asyncio.to_thread(_stop, stream, reader)

    async def close(self) -> None:
        await asyncio.to_thread(self.harness.close)

    async def __aenter__(self) -> AsyncHarness:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def _read(
    stream: RunStream,
    loop: asyncio.AbstractEventLoop,
    queue: asyncio.Queue[tuple[Event | None, BaseException | None]],
) -> None:
    """The reader thread: every event of ``stream``, then (None, error or None)."""
    item: tuple[Event | None, BaseException | None]
    try:
        for event in stream:
            _hand(loop, queue, (event, None))
        item = (None, None)
    except BaseException as exc:  # the executor's error, raised in the loop's task
        item = (None, exc)
    _hand(loop, queue, item)


def _hand(
    loop: asyncio.AbstractEventLoop,
    queue: asyncio.Queue[tuple[Event | None, BaseException | None]],
    item: tuple[Event | None, BaseException | None],
) -> None:
    with contextlib.suppress(RuntimeError):  # the loop is closed: nobody listens any more
        loop.call_soon_threadsafe(queue.put_nowait, item)


def _stop(stream: RunStream, reader: threading.Thread) -> None:
    stream.close()
    reader.join()


def _create_options(options: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in options.items() if k != "on_delta"}


def _execute_options(options: dict[str, Any]) -> dict[str, Any]:
    return {k: options[k] for k in ("on_delta", "record") if k in options}
