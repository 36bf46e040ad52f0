"""Paging runs, counting them and the queue depth in the Store contract; the creator a
run is made by; idempotent creation under a race."""

from __future__ import annotations

import base64
import threading

import pytest

from keel.core.errors import UsageError
from keel.core.records import RunOptions
from keel.core.state import RunState
from keel.core.status import RunStatus
from keel.store.base import Store
from keel.testing.stores import OutOfBand, append, make_run, move, reopened


def by(creator: str | None) -> RunOptions:
    return RunOptions(model="scripted:turns.json", creator=creator)


def newest_first(store: Store, runs: list[RunState]) -> list[str]:
    """The contract's order, from each run's ``run_created`` time (its created_at)."""
    keyed = [(store.read_events(r.run_id)[0].recorded_at, r.run_id) for r in runs]
    return [run_id for _, run_id in sorted(keyed, reverse=True)]


def walk(store: Store, **filters: object) -> tuple[list[str], list[int]]:
    """Every page in turn: the run ids in page order and each page's size."""
    ids: list[str] = []
    sizes: list[int] = []
    cursor: str | None = None
    while True:
        page, cursor = store.page_runs(before=cursor, **filters)  # type: ignore[arg-type]
        ids += [r.run_id for r in page]
        sizes.append(len(page))
        if cursor is None:
            return ids, sizes
        assert len(sizes) < 100, "paging does not end"


def test_pages_walk_every_run_once_newest_first(store: Store) -> None:
    runs = [make_run(store, goal=f"g{i}") for i in range(11)]
    ids, sizes = walk(store, limit=4)
    assert ids == newest_first(store, runs)
    assert sizes == [4, 4, 3]
    page, _ = store.page_runs(limit=4)
    assert [r.run_id for r in page] == ids[:4]
    assert page[0] == store.load_run(page[0].run_id)  # full states, not stubs


def test_an_exactly_full_last_page_has_no_next_cursor(store: Store) -> None:
    for _ in range(6):
        make_run(store)
    _, sizes = walk(store, limit=3)
    assert sizes == [3, 3]
    page, cursor = store.page_runs(limit=6)
    assert len(page) == 6 and cursor is None


def test_an_empty_store_has_one_empty_page(store: Store) -> None:
    assert store.page_runs() == ([], None)


def test_runs_created_between_fetches_neither_skip_nor_repeat_a_run(store: Store) -> None:
    first = [make_run(store, goal=f"old {i}") for i in range(9)]
    page, cursor = store.page_runs(limit=4)
    seen = [r.run_id for r in page]
    newer = [make_run(store, goal=f"new {i}") for i in range(3)]
    while cursor is not None:
        page, cursor = store.page_runs(limit=4, before=cursor)
        seen += [r.run_id for r in page]
        newer.append(make_run(store, goal="created while paging"))
    assert seen == newest_first(store, first)
    top, _ = store.page_runs(limit=len(newer))  # the new runs lead a fresh first page
    assert [r.run_id for r in top] == newest_first(store, newer)


def test_the_cursor_works_in_another_process(store: Store) -> None:
    runs = [make_run(store) for _ in range(5)]
    page, cursor = store.page_runs(limit=2)
    assert cursor is not None
    with reopened(store) as other:
        rest, end = other.page_runs(limit=10, before=cursor)
    assert [r.run_id for r in page + rest] == newest_first(store, runs)
    assert end is None


def test_filters_combine(store: Store) -> None:
    parent = make_run(store, options=by("token:ci"))
    kids = [
        make_run(store, parent_id=parent.run_id, options=by("token:ci" if i else "token:x"))
        for i in range(3)
    ]
    alone = make_run(store, options=by(None), queued=True)
    queued_ci = make_run(store, options=by("token:ci"), queued=True)
    everyone = [parent, *kids, alone, queued_ci]

    def ids(**filters: object) -> list[str]:
        return walk(store, limit=2, **filters)[0]

    assert ids() == newest_first(store, everyone)
    assert ids(creator="token:ci") == newest_first(store, [parent, kids[1], kids[2], queued_ci])
    assert ids(parent_id=parent.run_id) == newest_first(store, kids)
    assert ids(top_level=True) == newest_first(store, [parent, alone, queued_ci])
    assert ids(status=RunStatus.QUEUED) == newest_first(store, [alone, queued_ci])
    assert ids(status=RunStatus.QUEUED, creator="token:ci") == [queued_ci.run_id]
    assert ids(top_level=True, creator="token:ci") == newest_first(store, [parent, queued_ci])
    assert ids(parent_id=parent.run_id, creator="token:x") == [kids[0].run_id]
    assert ids(status=RunStatus.COMPLETED) == []
    assert ids(creator="token:nobody") == []


def test_a_status_filter_sees_moves(store: Store) -> None:
    run = make_run(store)
    other = make_run(store)
    append(store, run, [move(run, RunStatus.FAILED, "gave up")])
    done, _ = store.page_runs(status=RunStatus.FAILED)
    assert [r.run_id for r in done] == [run.run_id]
    assert done[0].status is RunStatus.FAILED
    live, _ = store.page_runs(status=RunStatus.RUNNING)
    assert [r.run_id for r in live] == [other.run_id]


def test_parent_and_top_level_together_are_refused(store: Store) -> None:
    parent = make_run(store)
    with pytest.raises(UsageError, match="parent_id and top_level=True exclude each other"):
        store.page_runs(parent_id=parent.run_id, top_level=True)


def test_the_limit_is_clamped_to_one_through_five_hundred(store: Store) -> None:
    for _ in range(3):
        make_run(store)
    for low in (0, -5):
        page, cursor = store.page_runs(limit=low)
        assert len(page) == 1 and cursor is not None
    page, cursor = store.page_runs(limit=10_000)
    assert len(page) == 3 and cursor is None


def _b64(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


BAD_CURSORS = [
    "",
    "not a cursor!",
    "%%%",
    _b64("no separator"),
    _b64("2026-01-01T00:00:00+00:00|run_1|extra"),
    _b64("yesterday|run_0123456789ab"),
    _b64("2026-01-01T00:00:00|run_0123456789ab"),  # no time zone
    _b64("2026-01-01T00:00:00+00:00|"),
    _b64("2026-01-01T00:00:00+00:00|run' OR 1=1 --"),
    "x" * 500,
]


def test_a_malformed_cursor_is_refused_precisely(store: Store) -> None:
    make_run(store)
    for bad in BAD_CURSORS:
        with pytest.raises(UsageError, match=r"^invalid cursor: "):
            store.page_runs(before=bad)


def test_a_well_formed_cursor_for_a_time_before_every_run_gives_an_empty_page(
    store: Store,
) -> None:
    make_run(store)
    assert store.page_runs(before=_b64("2000-01-01T00:00:00+00:00|run_000000000000")) == ([], None)


# --- creator ------------------------------------------------------------------------


def test_the_creator_is_kept_in_the_options_and_the_indexed_column(store: Store) -> None:
    mine = make_run(store, options=by("token:ci"))
    cli = make_run(store, options=by(None))
    assert store.load_run(mine.run_id).options.creator == "token:ci"
    assert store.load_run(cli.run_id).options.creator is None
    assert "creator" not in store.read_events(cli.run_id)[0].data["options"]  # as before
    with OutOfBand(store) as db:
        rows = dict(db.execute("SELECT id, creator FROM runs"))
    assert rows == {mine.run_id: "token:ci", cli.run_id: None}


def test_follows_is_kept_only_when_set(store: Store) -> None:
    first = make_run(store)
    follow = make_run(store, options=RunOptions(model="m", follows=first.run_id))
    assert store.load_run(follow.run_id).options.follows == first.run_id
    assert "follows" not in store.read_events(first.run_id)[0].data["options"]


# --- counts and the queue -----------------------------------------------------------


def test_counts_name_every_status_zeros_included(store: Store) -> None:
    assert store.count_runs_by_status() == dict.fromkeys(RunStatus, 0)
    done = make_run(store)
    append(store, done, [move(done, RunStatus.FAILED, "gave up")])
    make_run(store)
    make_run(store, queued=True)
    make_run(store, queued=True)
    counts = store.count_runs_by_status()
    assert set(counts) == set(RunStatus)
    expected = dict.fromkeys(RunStatus, 0)
    expected.update({RunStatus.FAILED: 1, RunStatus.RUNNING: 1, RunStatus.QUEUED: 2})
    assert counts == expected


def test_queue_depth_counts_claimable_runs_and_ready_tasks(store: Store) -> None:
    assert store.queue_depth() == 0
    make_run(store, queued=True)
    make_run(store, queued=True)
    make_run(store)  # running: driven by its own process, not queued
    make_run(store, queued=True, task_id="task_0000abcd")  # a child: its task is the work
    assert store.queue_depth() == 2
    blocker = store.create_task("first", actor="t")
    blocked = store.create_task("second", blocked_by=[blocker.id], actor="t")
    assert store.queue_depth() == 3  # the blocker is ready, the blocked one is not
    claimed = store.claim_task(owner="w", lease_seconds=30, task_id=blocker.id)
    assert claimed is not None and store.queue_depth() == 2  # claimed: no longer waiting
    store.complete_task(blocker.id, owner="w", token=claimed.lease_token)
    assert store.queue_depth() == 3  # the second became ready
    store.cancel_task(blocked.id, actor="t", reason="not needed")
    assert store.queue_depth() == 2


# --- idempotent creation under a race -------------------------------------------------


def test_twenty_threads_creating_with_one_idempotency_key_make_one_run(store: Store) -> None:
    made: list[str] = []
    failed: list[BaseException] = []
    start = threading.Barrier(20)

    def create() -> None:
        start.wait()
        try:
            made.append(make_run(store, idempotency_key="submit-1", goal="once").run_id)
        except BaseException as exc:  # pragma: no cover - reported by the assert below
            failed.append(exc)

    threads = [threading.Thread(target=create) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failed == []
    assert len(made) == 20 and len(set(made)) == 1
    assert store.run_ids() == [made[0]]
    assert len(store.read_events(made[0])) == 1
