"""Taking a run's lease to drive it: at once from a dead holder on this machine, else
by waiting until the lease lapses.

A run lease records its holder's process: host name, boot id, process id, the
process's start time (clock ticks since boot) and pid namespace. A later process
on the same host, in the same boot and pid namespace, can then tell for certain
that the holder is gone — its pid runs no more, or now belongs to a process that
started at another time (a reused pid) — and takes the lease over at once instead
of waiting out its time to live. The take-over is a compare-and-swap on the dead
lease's token, so of two resumes racing for it exactly one wins.

A holder that may still run — alive here, on another host or boot, or recorded
without a holder — is never overtaken: the caller waits until its lease lapses
(the store decides, by the database clock; a holder that keeps renewing keeps the
run) or gives up at once.
"""

from __future__ import annotations

import math
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from keel.core.errors import ConfigError, LeaseHeld
from keel.sandbox import orphans
from keel.store.base import Lease, LeaseHolder, Store

POLL_S = 0.5  # how often a waiting resume asks the store again


@dataclass(frozen=True, slots=True, kw_only=True)
class TakeOver:
    """A lease taken from a holder found dead on this machine, and how that was known."""

    previous: Lease
    reason: str

    def to_event_data(self) -> dict[str, object]:
        """What ``lease_taken_over`` records: from whom and why."""
        holder = self.previous.holder
        return {
            "owner": self.previous.owner,
            "host": holder.host if holder else None,
            "pid": holder.pid if holder else None,
            "boot_id": holder.boot_id if holder else None,
            "lease_expires_at": self.previous.expires_at.isoformat(),
            "reason": self.reason,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaseWait:
    """One moment of waiting for a live holder's lease to lapse (for a countdown)."""

    run_id: str
    lease: Lease  # the lease as last read: a renewal moves ``expires_at`` on
    remaining_s: float  # until ``expires_at`` by this machine's clock, never below 0
    waited_s: float
    why: str  # why it cannot be taken at once


WaitListener = Callable[[LeaseWait], None]


def this_holder() -> LeaseHolder:
    """This process, as a run lease records it: read from /proc once per process (a
    worker's slots ask at every claim), again in a forked child."""
    global _this  # noqa: PLW0603 - replaced whole, once per process
    pid = os.getpid()
    known = _this
    if known is not None and known.pid == pid:
        return known
    known = _this = LeaseHolder(
        host=socket.gethostname(),
        boot_id=orphans.boot_id(),
        pid=pid,
        start_ticks=orphans.running_since(pid),
        pid_ns=_pid_namespace(),
    )
    return known


_this: LeaseHolder | None = None


def holder_gone(holder: LeaseHolder | None) -> str | None:
    """Why ``holder`` is certainly no longer running; None when it may be (or cannot be
    seen from here: another host, boot or pid namespace, or no holder recorded)."""
    if holder is None:
        return None
    me = this_holder()
    if holder.host != me.host or not me.boot_id or holder.boot_id != me.boot_id:
        return None
    if holder.pid_ns and me.pid_ns and holder.pid_ns != me.pid_ns:
        return None
    started = orphans.running_since(holder.pid)
    if started is None:
        return f"process {holder.pid} on {holder.host} is no longer running"
    if holder.start_ticks is not None and started != holder.start_ticks:
        return (
            f"process {holder.pid} on {holder.host} is no longer running "
            "(its process id now belongs to a process started later)"
        )
    return None


def why_waiting(holder: LeaseHolder | None) -> str:
    """Why a lease that ``holder_gone`` did not clear must be waited for."""
    if holder is None:
        return "its holder's process was not recorded"
    me = this_holder()
    if holder.host != me.host:
        return f"it is held on another host ({holder.host})"
    if not me.boot_id:
        return "this system does not tell which boot it is in"
    if holder.boot_id != me.boot_id:
        return f"it was taken in another boot of {holder.host}"
    if holder.pid_ns and me.pid_ns and holder.pid_ns != me.pid_ns:
        return f"its holder runs in another pid namespace ({holder.pid_ns})"
    return f"its holder, {holder.describe()}, is still running"


def describe_lease(lease: Lease) -> str:
    """E.g. ``alice@box/1a2b3c4d (pid 4242 on box)``: who holds the lease, and where."""
    return f"{lease.owner} ({lease.holder.describe()})" if lease.holder else lease.owner


def take_run_lease(
    store: Store,
    run_id: str,
    *,
    owner: str,
    ttl: float,
    wait: float | None = 0.0,
    on_wait: WaitListener | None = None,
) -> tuple[Lease, TakeOver | None]:
    """The run's lease for this process, and the take-over it took (if any).

    A free or lapsed lease is taken; one whose holder ``holder_gone`` finds dead is
    taken over at once. Otherwise this waits — at most ``wait`` seconds (None: as
    long as it takes), telling ``on_wait`` every ``POLL_S`` — for the lease to lapse
    or its holder to die; past ``wait``, ``LeaseHeld`` names the holder and when its
    lease lapses.
    """
    me = this_holder()
    started = time.monotonic()
    while True:
        try:
            return store.acquire_run_lease(run_id, owner=owner, ttl=ttl, holder=me), None
        except LeaseHeld as held:
            refusal = held
        current = store.current_run_lease(run_id)
        if current is None:
            continue  # it lapsed or was released in between: take it
        reason = holder_gone(current.holder)
        if reason is not None:
            try:
                lease = store.acquire_run_lease(
                    run_id, owner=owner, ttl=ttl, holder=me, replacing=current.token
                )
            except LeaseHeld:
                continue  # another process took it over first: look at the new holder
            return lease, TakeOver(previous=current, reason=reason)
        waited = time.monotonic() - started
        if wait is not None and waited >= wait:
            raise LeaseHeld(run_id, describe_lease(current), current.expires_at) from refusal
        remaining = max(0.0, (current.expires_at - datetime.now(UTC)).total_seconds())
        if on_wait is not None:
            on_wait(
                LeaseWait(
                    run_id=run_id,
                    lease=current,
                    remaining_s=remaining,
                    waited_s=waited,
                    why=why_waiting(current.holder),
                )
            )
        pause = POLL_S if wait is None else min(POLL_S, wait - waited)
        if remaining > 0:
            pause = min(pause, remaining)  # ask again the moment it should lapse
        time.sleep(max(0.01, pause))


def _pid_namespace() -> str:
    """This process's pid namespace ("pid:[4026531836]"); "" where the system does not tell."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


DEFAULT_LEASE_TTL = 30.0
LEASE_TTL_VARIABLE = "KEEL_LEASE_TTL"  # seconds; a short lease lets a crashed run be taken sooner


def lease_ttl_from_environment() -> float:
    """``KEEL_LEASE_TTL`` seconds (a positive number), else the 30 s default."""
    raw = os.environ.get(LEASE_TTL_VARIABLE)
    if not raw:
        return DEFAULT_LEASE_TTL
    try:
        ttl = float(raw)
    except ValueError:
        ttl = 0.0
    if not 0 < ttl < math.inf:
        raise ConfigError(f"{LEASE_TTL_VARIABLE}={raw!r}: give the run lease in seconds, e.g. 30")
    return ttl


__all__ = [
    "DEFAULT_LEASE_TTL",
    "LEASE_TTL_VARIABLE",
    "LeaseWait",
    "TakeOver",
    "WaitListener",
    "describe_lease",
    "holder_gone",
    "lease_ttl_from_environment",
    "take_run_lease",
    "this_holder",
    "why_waiting",
]
