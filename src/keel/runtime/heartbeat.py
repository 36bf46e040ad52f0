"""A lease kept alive from its own thread, independent of the work it protects."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable

from keel.core.errors import KeelError
from keel.store.base import Lease


class Heartbeat:
    """Renews a lease every ``ttl / 3`` seconds until stopped.

    If a renewal fails (the lease was taken over, or the store refused), ``on_lost``
    is called once with the reason and the thread ends; the work must then stop.
    After each successful renewal ``on_beat`` runs (a run renews the task claims it
    holds there); its errors are its own: they never stop the heartbeat.
    """

    def __init__(
        self,
        lease: Lease,
        *,
        ttl: float,
        renew: Callable[[Lease, float], Lease],
        on_lost: Callable[[str], None],
        on_beat: Callable[[], object] | None = None,
    ) -> None:
        self.lease = lease
        self._ttl = ttl
        self._renew = renew
        self._on_lost = on_lost
        self._on_beat = on_beat
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"heartbeat-{lease.subject}")
        self._thread.daemon = True

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=self._ttl)

    def _beat(self) -> None:
        interval = self._ttl / 3
        while not self._stop.wait(interval):
            try:
                self.lease = self._renew(self.lease, self._ttl)
            except KeelError as exc:
                self._on_lost(str(exc))
                return
            if self._on_beat is not None:
                with contextlib.suppress(KeelError):
                    self._on_beat()
