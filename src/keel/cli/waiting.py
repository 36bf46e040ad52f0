"""What `keel resume` says while it waits for another process's lease, or takes it over."""

from __future__ import annotations

import math
from datetime import UTC, datetime

from keel.cli.common import err_console
from keel.core.errors import LeaseHeld
from keel.core.events import Event
from keel.runtime.takeover import LeaseWait, describe_lease

EVERY_S = 5  # a countdown line every this many seconds, every second near the end
CLOSE_S = 10


class LeaseCountdown:
    """Says on stderr who holds the run and why it is waited for (again whenever the
    holder changes), then the seconds until the lease lapses: every ``EVERY_S``
    seconds, and every second for the last ``CLOSE_S``."""

    def __init__(self) -> None:
        self._holder: str | None = None
        self._shown: int | None = None

    def __call__(self, wait: LeaseWait) -> None:
        if wait.lease.token != self._holder:
            self._holder, self._shown = wait.lease.token, None
            self._say(
                f"run {wait.run_id} is held by {describe_lease(wait.lease)}: {wait.why}; "
                "waiting until its lease lapses (Ctrl-C stops waiting)"
            )
        left = math.ceil(wait.remaining_s)
        if left == self._shown or (self._shown is not None and left > CLOSE_S and left % EVERY_S):
            return
        self._shown = left
        self._say(f"  its lease lapses in {left} s")

    @staticmethod
    def _say(text: str) -> None:
        err_console.print(text, highlight=False, soft_wrap=True)


def lease_held_line(exc: LeaseHeld, run_id: str) -> str:
    """The one line of `keel resume --no-wait` for a held run: who holds it, when it lapses."""
    left = max(0, math.ceil((exc.expires_at - datetime.now(UTC)).total_seconds()))
    at = exc.expires_at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return (
        f"run {run_id} is being executed by {exc.owner}; its lease lapses at {at} "
        f"(in {left} s): `keel resume {run_id}` without --no-wait waits for it"
    )


def taken_over_line(event: Event) -> str:
    """What a resume says when it took the lease of a dead process on this machine."""
    d = event.data
    return f"took run {event.run_id} over from {d.get('owner')}: {d.get('reason')}"
