"""LISTEN/NOTIFY on a dedicated session: wake-ups, never the source of truth.

One daemon thread per store holds its own connection (not a pooled one) and
listens on ``keel_work`` (a task became ready, a run was queued) and
``keel_events`` (a run's log grew; payload ``run_id:last_seq``). Waiters block on
a condition with a bounded timeout and re-check the database themselves, so a
lost notification or a dead listener only delays a wake-up to the poll interval.
When the listening session dies (server restart, ``pg_terminate_backend``) the
thread reconnects with backoff.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any, Final

import psycopg

from keel.core.errors import StoreError
from keel.store.postgres.connection import connect

WORK_CHANNEL: Final = "keel_work"
EVENTS_CHANNEL: Final = "keel_events"
LISTENER_NAME: Final = "keel listener"
RECONNECT_MAX_S: Final = 2.0


class Listener:
    """Counts notifications per channel and wakes the threads waiting for them."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._changed = threading.Condition()
        self.work_generation = 0
        self._run_seq: dict[str, int] = {}
        self._watched: dict[str, int] = {}
        self._stop = threading.Event()
        self._conn: psycopg.Connection[Any] | None = None
        self.connected = threading.Event()
        self.reconnects = 0
        self._thread = threading.Thread(target=self._loop, name="keel-listener", daemon=True)
        self._thread.start()

    # --- waiting -------------------------------------------------------------------------

    def wait_for_work(self, seen: int, timeout: float) -> int:
        """Block until ``work_generation`` moves past ``seen`` or ``timeout``; return it."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while self.work_generation == seen:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._changed.wait(remaining)
            return self.work_generation

    def watch(self, run_id: str) -> None:
        with self._changed:
            self._watched[run_id] = self._watched.get(run_id, 0) + 1

    def unwatch(self, run_id: str) -> None:
        with self._changed:
            left = self._watched.get(run_id, 1) - 1
            if left:
                self._watched[run_id] = left
            else:
                self._watched.pop(run_id, None)
                self._run_seq.pop(run_id, None)

    def wait_for_seq(self, run_id: str, after: int, timeout: float) -> bool:
        """True once a notification says ``run_id`` has an event after ``after`` (watched)."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while self._run_seq.get(run_id, 0) <= after:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._changed.wait(remaining)
            return True

    # --- the listening thread ------------------------------------------------------------

    def _loop(self) -> None:
        pause = 0.05
        while not self._stop.is_set():
            try:
                conn = connect(self._url, application_name=LISTENER_NAME)
            except StoreError:
                self._stop.wait(pause)
                pause = min(pause * 2, RECONNECT_MAX_S)
                continue
            self._conn = conn
            try:
                conn.execute(f"LISTEN {WORK_CHANNEL}")
                conn.execute(f"LISTEN {EVENTS_CHANNEL}")
                self.connected.set()
                self._bump_work()  # anything may have happened while we were deaf
                pause = 0.05
                while not self._stop.is_set():
                    for note in conn.notifies(timeout=0.5):
                        self._deliver(note.channel, note.payload)
            except psycopg.Error:
                self.reconnects += 1
            finally:
                self.connected.clear()
                self._conn = None
                conn.close()
            if not self._stop.is_set():
                self._stop.wait(pause)
                pause = min(pause * 2, RECONNECT_MAX_S)

    def _bump_work(self) -> None:
        with self._changed:
            self.work_generation += 1
            self._changed.notify_all()

    def _deliver(self, channel: str, payload: str) -> None:
        if channel == WORK_CHANNEL:
            self._bump_work()
            return
        run_id, _, seq_text = payload.rpartition(":")
        with self._changed:
            if run_id in self._watched:
                seq = int(seq_text)
                if seq > self._run_seq.get(run_id, 0):
                    self._run_seq[run_id] = seq
                    self._changed.notify_all()

    def close(self) -> None:
        self._stop.set()
        conn = self._conn
        if conn is not None:
            # Interrupts notifies(): the loop sees the stop flag and exits.
            with contextlib.suppress(psycopg.Error):
                conn.cancel_safe(timeout=1.0)
        self._thread.join(timeout=5)
