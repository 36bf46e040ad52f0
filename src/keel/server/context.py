"""What one ``keel serve`` process holds while it runs: its store, the harness that
creates runs, and its embedded worker slots.

Routes reach it with ``context_of(request)``; there is exactly one per application,
opened at startup and closed at shutdown (``keel.server.app``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import ParamSpec, TypeVar

from starlette.concurrency import run_in_threadpool
from starlette.requests import HTTPConnection

from keel.runtime.harness import Harness
from keel.runtime.worker import Worker
from keel.server.config import ServeConfig
from keel.server.event_metrics import EventMetrics
from keel.store.base import Store
from keel.store.url import open_store

log = logging.getLogger("keel.server")
P = ParamSpec("P")
R = TypeVar("R")
WORKER_STOP_WAIT_S = 60.0


class ServerContext:
    """The store (one per process, shared by every request thread), a ``Harness`` over
    it whose committed events feed ``metrics``, and — when ``config.workers`` > 0 — a
    ``Worker`` running that many slots in a background thread. ``close`` stops the slots
    (each finishes its current step and releases its leases) before it closes the store."""

    def __init__(self, config: ServeConfig, *, store: Store | None = None) -> None:
        self.config = config
        self.store: Store = store if store is not None else open_store(config.store_url)
        self.metrics = EventMetrics()  # what the embedded slots commit, for GET /metrics
        self.harness = Harness(
            store=self.store,
            model=config.model,
            owner=config.owner or None,
            child_slots=0 if config.workers == 0 else None,
            on_event=self.metrics.observe,
        )
        self.local_store = self.store.url.startswith("sqlite")  # see ``read``
        self.worker: Worker | None = None
        self._worker_thread: threading.Thread | None = None
        self._closers: list[Callable[[], None]] = []

    async def read(self, function: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """``function(*args, **kwargs)``, a short read of the store, from a coroutine.

        On SQLite it runs right here on the event loop: a read of a local WAL file takes
        tens of microseconds and never waits for a writer, while a hop to the threadpool
        and back costs more than the read itself (it capped ``GET /runs/{id}`` near 900
        requests/s on two cores). A store across the network (PostgreSQL) is read in the
        threadpool, so a slow round trip never stalls the other requests and streams."""
        if self.local_store:
            return function(*args, **kwargs)
        return await run_in_threadpool(function, *args, **kwargs)

    def add_closer(self, close: Callable[[], None]) -> None:
        """Have ``close`` called at shutdown, after the worker slots stopped and before the
        store closes (latest added first): how a part that holds threads or
        connections of its own (the SSE hub) is told to let go."""
        self._closers.append(close)

    def start_workers(self) -> None:
        """Start ``config.workers`` embedded slots (none when it is 0)."""
        if self.config.workers <= 0 or self.worker is not None:
            return
        self.worker = Worker(
            self.harness,
            concurrency=self.config.workers,
            poll_interval=self.config.poll_interval,
            default_cwd=Path.cwd(),
            log=lambda line: log.info("%s", line),
        )
        self._worker_thread = threading.Thread(
            target=self.worker.run, name="keel-serve-worker", daemon=True
        )
        self._worker_thread.start()

    def close(self) -> None:
        """Stop the embedded slots (current steps finish, leases released), then close
        the harness and the store."""
        if self.worker is not None:
            self.worker.stop()
        if self._worker_thread is not None:
            self._worker_thread.join(WORKER_STOP_WAIT_S)
            if self._worker_thread.is_alive():
                log.warning("embedded worker slots did not stop in %.0f s", WORKER_STOP_WAIT_S)
        for close in reversed(self._closers):
            try:
                close()
            except Exception:  # one part failing to close must not keep the store open
                log.exception("closing %r failed", close)
        self.harness.close()


def context_of(connection: HTTPConnection) -> ServerContext:
    """The running server's context, from any request or websocket."""
    context: ServerContext = connection.app.state.keel
    return context
