"""A run lease records its holder's process; a dead holder's lease can be taken over,
by exactly one caller, only while it is still the run's current lease."""

from __future__ import annotations

import threading
import time

import pytest

from keel.core.errors import LeaseHeld, LeaseLost
from keel.store.base import LeaseHolder, Store
from keel.testing.stores import append, make_run, model_step

HOLDER = LeaseHolder(
    host="build-7", boot_id="b00t", pid=4242, start_ticks=987654321012, pid_ns="pid:[4026531836]"
)
OTHER = LeaseHolder(host="build-8", boot_id="b00u", pid=7, start_ticks=None, pid_ns="")


def test_a_lease_keeps_its_holder_through_renewal_and_loses_it_on_release(store: Store) -> None:
    run = make_run(store)
    lease = store.acquire_run_lease(run.run_id, owner="alice@build-7/1", ttl=30, holder=HOLDER)

    assert lease.holder == HOLDER
    assert store.current_run_lease(run.run_id) == lease
    renewed = store.renew_run_lease(lease, ttl=60)
    assert renewed.holder == HOLDER
    assert store.current_run_lease(run.run_id) == renewed
    store.release_run_lease(lease)
    assert store.current_run_lease(run.run_id) is None
    anonymous = store.acquire_run_lease(run.run_id, owner="bob", ttl=30)
    assert anonymous.holder is None
    assert store.current_run_lease(run.run_id) == anonymous  # nothing left of the old holder


def test_a_takeover_of_an_expired_lease_records_the_new_holder(store: Store) -> None:
    run = make_run(store)
    store.acquire_run_lease(run.run_id, owner="dead", ttl=0.1, holder=HOLDER)
    time.sleep(0.2)
    new = store.acquire_run_lease(run.run_id, owner="alive", ttl=30, holder=OTHER)
    current = store.current_run_lease(run.run_id)
    assert current == new and current is not None and current.holder == OTHER


def test_a_live_lease_is_taken_only_by_naming_its_current_token(store: Store) -> None:
    state = make_run(store)
    dead = store.acquire_run_lease(state.run_id, owner="dead", ttl=30, holder=HOLDER)
    with pytest.raises(LeaseHeld) as refused:
        store.acquire_run_lease(state.run_id, owner="rescuer", ttl=30, holder=OTHER)
    assert refused.value.owner == "dead"
    with pytest.raises(LeaseHeld):
        store.acquire_run_lease(
            state.run_id, owner="rescuer", ttl=30, holder=OTHER, replacing="not-the-token"
        )

    rescued = store.acquire_run_lease(
        state.run_id, owner="rescuer", ttl=30, holder=OTHER, replacing=dead.token
    )

    assert store.current_run_lease(state.run_id) == rescued
    with pytest.raises(LeaseLost):  # the overtaken holder's writes are fenced
        append(store, state, model_step(), lease_token=dead.token)
    with pytest.raises(LeaseLost, match="rescuer"):
        store.renew_run_lease(dead, ttl=30)
    with pytest.raises(LeaseHeld):  # the dead token no longer opens anything
        store.acquire_run_lease(state.run_id, owner="late", ttl=30, replacing=dead.token)


def test_of_two_callers_replacing_the_same_dead_lease_exactly_one_wins(store: Store) -> None:
    run = make_run(store)
    dead = store.acquire_run_lease(run.run_id, owner="dead", ttl=30, holder=HOLDER)
    won: list[str] = []
    lost: list[str] = []
    start = threading.Barrier(4)

    def rescue(name: str) -> None:
        start.wait()
        try:
            store.acquire_run_lease(run.run_id, owner=name, ttl=30, replacing=dead.token)
        except LeaseHeld:
            lost.append(name)
        else:
            won.append(name)

    threads = [threading.Thread(target=rescue, args=(f"r{i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert len(won) == 1 and len(lost) == 3
    current = store.current_run_lease(run.run_id)
    assert current is not None and current.owner == won[0]


def test_claim_next_run_records_the_claiming_holder(store: Store) -> None:
    queued = make_run(store, queued=True)
    claimed = store.claim_next_run(owner="worker", ttl=30, holder=HOLDER)
    assert claimed is not None
    state, lease = claimed
    assert state.run_id == queued.run_id and lease.holder == HOLDER
    assert store.current_run_lease(queued.run_id) == lease
