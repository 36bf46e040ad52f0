"""Taking a run's lease: at once from a holder that died on this machine, else by waiting.

Real processes stand in for lease holders (a live `sleep`, an exited `true`, a reused
process id), on both stores; the holder recorded in the lease row is what decides.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from keel.core.errors import LeaseHeld
from keel.core.events import EventType
from keel.core.status import RunStatus
from keel.runtime.harness import Harness
from keel.runtime.takeover import (
    LeaseWait,
    holder_gone,
    take_run_lease,
    this_holder,
    why_waiting,
)
from keel.sandbox import orphans
from keel.store.base import LeaseHolder, Store
from keel.testing import ScriptedModel
from keel.testing.stores import STORE_BACKENDS, make_run, postgres_unavailable


@pytest.fixture(params=sorted(STORE_BACKENDS))
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "postgres" and (reason := postgres_unavailable()):
        pytest.skip(f"PostgreSQL store not tested: {reason}")
    with STORE_BACKENDS[request.param](tmp_path) as backend:
        yield backend


@pytest.fixture
def live_process() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["sleep", "60"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def holder_of(pid: int) -> LeaseHolder:
    """The lease holder a process with ``pid`` on this machine would have recorded."""
    return replace(this_holder(), pid=pid, start_ticks=orphans.running_since(pid))


def exited_holder() -> LeaseHolder:
    proc = subprocess.Popen(["true"])
    holder = holder_of(proc.pid)
    proc.wait()
    return holder


# --- telling a dead holder from a live one --------------------------------------------


def test_a_holder_whose_process_exited_is_gone() -> None:
    holder = exited_holder()
    assert holder_gone(holder) == f"process {holder.pid} on {holder.host} is no longer running"


def test_a_holder_whose_process_id_was_reused_is_gone(
    live_process: subprocess.Popen[bytes],
) -> None:
    holder = holder_of(live_process.pid)
    assert holder.start_ticks is not None
    earlier = replace(holder, start_ticks=holder.start_ticks - 1)  # the pid's first owner

    assert holder_gone(holder) is None
    reason = holder_gone(earlier)
    assert reason is not None and "now belongs to a process started later" in reason


def test_a_holder_that_may_still_run_is_never_found_gone() -> None:
    dead = exited_holder()
    assert holder_gone(this_holder()) is None  # this very process
    assert holder_gone(replace(dead, host="elsewhere")) is None  # cannot be seen from here
    assert holder_gone(replace(dead, boot_id="an-earlier-boot")) is None
    assert holder_gone(replace(dead, pid_ns="pid:[1]")) is None
    assert holder_gone(None) is None
    # … and a resume says why it waits instead.
    assert why_waiting(replace(dead, host="elsewhere")) == "it is held on another host (elsewhere)"
    assert why_waiting(replace(dead, boot_id="x")) == f"it was taken in another boot of {dead.host}"
    assert why_waiting(replace(dead, pid_ns="pid:[1]")) == (
        "its holder runs in another pid namespace (pid:[1])"
    )
    assert why_waiting(None) == "its holder's process was not recorded"


def test_this_holder_names_this_host_boot_and_process() -> None:
    me = this_holder()
    assert me.host == socket.gethostname() and me.pid == os.getpid()
    assert me.boot_id == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert me.start_ticks == int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])


# --- acquiring ------------------------------------------------------------------------


def test_a_dead_local_holders_lease_is_taken_over_at_once(store: Store) -> None:
    run = make_run(store)
    dead = exited_holder()
    old = store.acquire_run_lease(run.run_id, owner="alice@here/1", ttl=30, holder=dead)

    started = time.monotonic()
    lease, taken = take_run_lease(store, run.run_id, owner="bob@here/2", ttl=30, wait=0)

    assert time.monotonic() - started < 1
    assert taken is not None and taken.previous == old
    assert taken.reason == f"process {dead.pid} on {dead.host} is no longer running"
    assert lease.owner == "bob@here/2" and lease.holder == this_holder()
    assert store.current_run_lease(run.run_id) == lease
    data = taken.to_event_data()
    assert (data["owner"], data["pid"], data["host"]) == ("alice@here/1", dead.pid, dead.host)


def test_a_live_local_holder_is_waited_for_until_its_lease_lapses(
    store: Store, live_process: subprocess.Popen[bytes]
) -> None:
    run = make_run(store)
    holder = holder_of(live_process.pid)
    store.acquire_run_lease(run.run_id, owner="alice@here/1", ttl=2, holder=holder)
    waits: list[LeaseWait] = []

    started = time.monotonic()
    lease, taken = take_run_lease(
        store, run.run_id, owner="bob@here/2", ttl=30, wait=None, on_wait=waits.append
    )

    assert time.monotonic() - started > 1.2  # the lease's own expiry, not a fixed wait
    assert taken is None and lease.owner == "bob@here/2"
    assert waits and all(w.lease.holder == holder for w in waits)
    assert waits[0].why == f"its holder, pid {holder.pid} on {holder.host}, is still running"
    remaining = [w.remaining_s for w in waits]
    assert remaining == sorted(remaining, reverse=True) and remaining[0] > 1
    assert live_process.poll() is None


def test_a_holder_on_another_host_is_refused_at_once_without_waiting(store: Store) -> None:
    run = make_run(store)
    elsewhere = LeaseHolder(host="build-9", boot_id="b", pid=os.getpid(), start_ticks=1)
    store.acquire_run_lease(run.run_id, owner="carol@build-9/3", ttl=30, holder=elsewhere)

    started = time.monotonic()
    with pytest.raises(LeaseHeld) as held:
        take_run_lease(store, run.run_id, owner="bob@here/2", ttl=30, wait=0)

    assert time.monotonic() - started < 1
    assert held.value.owner == f"carol@build-9/3 (pid {os.getpid()} on build-9)"
    lease = store.current_run_lease(run.run_id)
    assert lease is not None and lease.owner == "carol@build-9/3"


def test_a_bounded_wait_gives_up_with_the_holder_named(store: Store) -> None:
    run = make_run(store)
    elsewhere = LeaseHolder(host="build-9", boot_id="b", pid=7)
    store.acquire_run_lease(run.run_id, owner="carol", ttl=30, holder=elsewhere)
    waits: list[LeaseWait] = []

    started = time.monotonic()
    with pytest.raises(LeaseHeld, match="carol"):
        take_run_lease(store, run.run_id, owner="bob", ttl=30, wait=1, on_wait=waits.append)

    assert 0.9 < time.monotonic() - started < 5
    assert waits and waits[0].why == "it is held on another host (build-9)"
    assert 25 < waits[0].remaining_s <= 30


def test_a_holder_that_dies_while_waited_for_is_taken_over_then(
    store: Store, live_process: subprocess.Popen[bytes]
) -> None:
    run = make_run(store)
    holder = holder_of(live_process.pid)
    store.acquire_run_lease(run.run_id, owner="alice", ttl=30, holder=holder)

    def holder_dies(wait: LeaseWait) -> None:
        live_process.kill()
        live_process.wait()

    started = time.monotonic()
    _, taken = take_run_lease(
        store, run.run_id, owner="bob", ttl=30, wait=None, on_wait=holder_dies
    )

    assert time.monotonic() - started < 5  # far before its 30 s lease lapses
    assert taken is not None and taken.previous.holder == holder


# --- through the harness --------------------------------------------------------------


def test_harness_resume_takes_a_dead_local_holders_run_over_and_records_it(
    store: Store, tmp_path: Path
) -> None:
    asks = ScriptedModel(
        [
            {"tool_calls": [{"name": "ask_user", "arguments": {"question": "go?"}}]},
            {"content": "done"},
        ]
    )
    harness = Harness(store=store, model=asks)
    waiting = harness.run("ask first", cwd=tmp_path)
    assert waiting.status is RunStatus.WAITING
    harness.answer(waiting.id, "yes")
    dead = exited_holder()
    store.acquire_run_lease(waiting.id, owner="alice@here/dead", ttl=30, holder=dead)

    outcome = harness.resume(waiting.id)

    assert outcome.status is RunStatus.COMPLETED
    events = list(harness.events(waiting.id))
    (taken,) = [e for e in events if e.type is EventType.LEASE_TAKEN_OVER]
    assert taken.data["owner"] == "alice@here/dead" and taken.data["pid"] == dead.pid
    assert taken.data["reason"] == f"process {dead.pid} on {dead.host} is no longer running"
    assert taken.data["by"] == harness.owner
    resumed = next(e for e in events if e.type is EventType.RUN_RESUMED)
    assert resumed.seq == taken.seq + 1
    assert (resumed.data["host"], resumed.data["pid"]) == (socket.gethostname(), os.getpid())
    assert store.current_run_lease(waiting.id) is None  # released at the end


def test_harness_resume_refuses_a_live_holder_at_once_unless_asked_to_wait(
    store: Store, tmp_path: Path
) -> None:
    asks = ScriptedModel(
        [
            {"tool_calls": [{"name": "ask_user", "arguments": {"question": "go?"}}]},
            {"content": "done"},
        ]
    )
    harness = Harness(store=store, model=asks)
    run_id = harness.run("ask first", cwd=tmp_path).id
    harness.answer(run_id, "yes")
    elsewhere = LeaseHolder(host="build-9", boot_id="b", pid=7)
    store.acquire_run_lease(run_id, owner="carol", ttl=1.5, holder=elsewhere)

    with pytest.raises(LeaseHeld, match=r"carol \(pid 7 on build-9\)"):
        harness.resume(run_id)
    waits: list[LeaseWait] = []
    outcome = harness.resume(run_id, wait=None, on_wait=waits.append)

    assert outcome.status is RunStatus.COMPLETED
    assert waits and waits[0].lease.owner == "carol"
    assert [e for e in harness.events(run_id) if e.type is EventType.LEASE_TAKEN_OVER] == []
