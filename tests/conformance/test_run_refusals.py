"""The runs half of the Store contract, its refusals word for word: an append or a lease
refused names the run and says why (every backend)."""

from __future__ import annotations

import re
import threading
import time
from datetime import UTC, datetime, timedelta

import pytest

from keel.core.errors import ConcurrentUpdate, LeaseHeld, LeaseLost, RunNotFound
from keel.store.base import Lease, Store
from keel.store.step import fold_step
from keel.testing.stores import append, make_run, model_step, reopened

LOST = "lease on {} is no longer held by this process; nothing was written ({})"


def refused(error: type[Exception], message: str) -> pytest.RaisesContext[Exception]:
    return pytest.raises(error, match=f"^{re.escape(message)}$")


def not_found(run_id: str) -> str:
    return f"no run with id {run_id!r}; `keel runs` lists the runs in this store"


def test_every_read_or_write_of_an_unknown_run_names_it(store: Store) -> None:
    for call in (
        lambda: store.append_events("run_nope", model_step(), expected_seq=1),
        lambda: store.append_events("run_nope", [], expected_seq=1),
        lambda: store.acquire_run_lease("run_nope", owner="a", ttl=5),
        lambda: store.current_run_lease("run_nope"),
        lambda: store.child_runs("run_nope"),
        lambda: store.put_artifact("run_nope", "log", b"x"),
        lambda: make_run(store, parent_id="run_nope"),
        lambda: store.renew_run_lease(
            Lease(subject="run_nope", owner="a", token="t", expires_at=datetime.now(UTC)), ttl=5
        ),
    ):
        with refused(RunNotFound, not_found("run_nope")) as err:
            call()
        assert err.value.run_id == "run_nope"  # type: ignore[attr-defined]


def test_a_stale_append_names_the_run_and_both_sequences(store: Store) -> None:
    run = make_run(store)
    append(store, run, model_step())
    with refused(ConcurrentUpdate, str(ConcurrentUpdate(run.run_id, 1, 3))):
        store.append_events(run.run_id, model_step(), expected_seq=1)


def test_an_append_with_a_lease_no_longer_held_says_what_became_of_it(store: Store) -> None:
    run = make_run(store)
    released = store.acquire_run_lease(run.run_id, owner="a", ttl=30)
    store.release_run_lease(released)
    with refused(LeaseLost, LOST.format(run.run_id, "the lease was released")):
        store.append_events(run.run_id, model_step(), expected_seq=1, lease_token=released.token)
    expired = store.acquire_run_lease(run.run_id, owner="a", ttl=0.05)
    time.sleep(0.1)
    with refused(LeaseLost, LOST.format(run.run_id, "the lease expired")):
        store.append_events(run.run_id, model_step(), expected_seq=1, lease_token=expired.token)
    store.acquire_run_lease(run.run_id, owner="worker-b", ttl=30)
    with refused(LeaseLost, LOST.format(run.run_id, "now held by worker-b")) as err:
        store.append_events(run.run_id, model_step(), expected_seq=1, lease_token=expired.token)
    assert err.value.subject == run.run_id  # type: ignore[attr-defined]


def test_renewing_a_lease_no_longer_held_says_what_became_of_it(store: Store) -> None:
    run = make_run(store)
    lease = store.acquire_run_lease(run.run_id, owner="a", ttl=0.05)
    time.sleep(0.1)
    with refused(LeaseLost, LOST.format(run.run_id, "the lease expired")):
        store.renew_run_lease(lease, ttl=30)
    store.release_run_lease(lease)
    with refused(LeaseLost, LOST.format(run.run_id, "the lease was released")):
        store.renew_run_lease(lease, ttl=30)
    store.acquire_run_lease(run.run_id, owner="worker-b", ttl=30)
    with refused(LeaseLost, LOST.format(run.run_id, "now held by worker-b")):
        store.renew_run_lease(lease, ttl=30)


def test_a_held_lease_names_the_run_its_holder_and_until_when(store: Store) -> None:
    run = make_run(store)
    lease = store.acquire_run_lease(run.run_id, owner="worker-a", ttl=30)
    with pytest.raises(LeaseHeld) as err:
        store.acquire_run_lease(run.run_id, owner="worker-b", ttl=30)
    assert str(err.value) == str(LeaseHeld(run.run_id, "worker-a", lease.expires_at))


def test_an_empty_folded_step_is_refused_like_an_empty_append(store: Store) -> None:
    run = make_run(store)
    empty = fold_step(run, [], now=datetime.now(UTC))
    assert store.append_folded(run.run_id, empty) == (store.load_run(run.run_id), [])
    append(store, run, model_step())
    with pytest.raises(ConcurrentUpdate):
        store.append_folded(run.run_id, empty)
    moved = store.load_run(run.run_id)
    store.acquire_run_lease(run.run_id, owner="a", ttl=30)
    with pytest.raises(LeaseLost):
        store.append_folded(
            run.run_id, fold_step(moved, [], now=datetime.now(UTC)), lease_token="not-it"
        )
    with pytest.raises(RunNotFound):
        store.append_folded("run_nope", empty)


def test_steps_joined_must_follow_each_other() -> None:
    from keel.core.state import RunState  # noqa: PLC0415

    state = RunState(run_id="run_1")
    first = fold_step(state, [], now=datetime.now(UTC))
    later = fold_step(first.state, model_step(), now=datetime.now(UTC))
    with pytest.raises(ValueError, match=r"^step folded onto 2, not 0$"):
        first.then(fold_step(later.state, [], now=datetime.now(UTC)))


def test_runs_are_listed_a_hundred_at_a_time_by_default(store: Store) -> None:
    for _ in range(101):
        make_run(store)
    assert len(store.list_runs()) == 100
    assert len(store.survey_runs()) == 100


def test_a_cold_store_claims_and_reads_runs_it_never_saw(store: Store) -> None:
    run = make_run(store, queued=True)
    keyed = make_run(store, idempotency_key="k-1")
    with reopened(store) as other:
        claimed = other.claim_next_run(owner="w", ttl=30)
        assert claimed is not None and claimed[0].run_id == run.run_id
    with reopened(store) as other:
        assert other.append_events(keyed.run_id, [], expected_seq=1) == (keyed, [])
    with reopened(store) as other:
        assert make_run(other, idempotency_key="k-1", goal="another") == keyed


def test_every_lease_ends_at_a_utc_time_ttl_seconds_from_now(store: Store) -> None:
    run = make_run(store)
    queued = make_run(store, queued=True)
    before = datetime.now(UTC)
    lease = store.acquire_run_lease(run.run_id, owner="a", ttl=30)
    renewed = store.renew_run_lease(lease, ttl=60)
    current = store.current_run_lease(run.run_id)
    claimed = store.claim_next_run(owner="w", ttl=30)
    assert current is not None and claimed is not None and claimed[0].run_id == queued.run_id
    after = datetime.now(UTC)
    for got, ttl in ((lease, 30), (renewed, 60), (current, 60), (claimed[1], 30)):
        assert got.expires_at.utcoffset() == timedelta(0)
        slack = timedelta(seconds=2)  # the database clock and this one
        assert before + timedelta(seconds=ttl) - slack <= got.expires_at
        assert got.expires_at <= after + timedelta(seconds=ttl) + slack


def test_a_waiter_wakes_soon_after_an_append(store: Store) -> None:
    run = make_run(store)

    def later() -> None:
        time.sleep(0.05)
        append(store, run, model_step())

    writer = threading.Thread(target=later)
    writer.start()
    started = time.monotonic()
    assert store.wait_for_events(run.run_id, after=1, timeout=30) is True
    assert time.monotonic() - started < 1.0
    writer.join()


def test_an_artifact_keeps_its_name_and_the_utc_time_it_was_stored(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = make_run(store)
    monkeypatch.setenv("TZ", "Asia/Tokyo")
    time.tzset()
    try:
        artifact = store.put_artifact(run.run_id, "pytest.log", b"ok")
    finally:
        monkeypatch.undo()
        time.tzset()
    assert artifact.name == "pytest.log"
    assert artifact.created_at.utcoffset() == timedelta(0)
    assert abs(datetime.now(UTC) - artifact.created_at) < timedelta(minutes=5)
