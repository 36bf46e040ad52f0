"""The PostgreSQL store against a real server: schema, triggers, the claim's index,
NOTIFY wake-ups and a listener that dies, the waiting-run claim rule."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import psycopg
import pytest

from keel.core.errors import SchemaTooNew, TaskNotClaimable
from keel.core.status import RunStatus
from keel.store.postgres.listener import LISTENER_NAME
from keel.store.postgres.migrate import discover
from keel.store.postgres.store import PostgresStore
from keel.store.postgres.tasks import CLAIM_NEXT
from keel.store.url import open_store
from keel.testing.stores import (
    append,
    legal_step,
    make_run,
    model_step,
    postgres_unavailable,
    scratch_database,
)

pytestmark = pytest.mark.postgres


@pytest.fixture
def pg_url() -> Iterator[str]:
    if reason := postgres_unavailable():
        pytest.skip(f"PostgreSQL store not tested: {reason}")
    with scratch_database() as url:
        yield url


@pytest.fixture
def store(pg_url: str) -> Iterator[PostgresStore]:
    s = PostgresStore(pg_url)
    yield s
    s.close()


def sql(url: str, statement: str, params: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(statement, params)
        return cur.fetchall() if cur.description else []


# --- schema ------------------------------------------------------------------------------


def test_open_store_selects_postgres_and_records_ordered_migrations(pg_url: str) -> None:
    with open_store(pg_url) as store:
        assert isinstance(store, PostgresStore)
    shipped = [(m.version, m.name) for m in discover("keel.store.postgres")]
    assert shipped[:3] == [(1, "runs"), (2, "tasks"), (3, "event_chain")]
    assert sql(pg_url, "SELECT version, name FROM schema_migrations ORDER BY version") == shipped
    PostgresStore(pg_url).close()  # reopening applies nothing again
    assert sql(pg_url, "SELECT count(*) FROM schema_migrations") == [(len(shipped),)]


def test_a_database_from_a_newer_keel_is_refused(pg_url: str) -> None:
    PostgresStore(pg_url).close()
    sql(pg_url, "INSERT INTO schema_migrations (version, name) VALUES (99, 'future')")
    with pytest.raises(SchemaTooNew, match="99"):
        PostgresStore(pg_url)


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE events SET type = 'note_added'",
        "DELETE FROM events",
        "TRUNCATE events CASCADE",
        "UPDATE task_events SET actor = 'mallory'",
        "DELETE FROM task_events",
    ],
)
def test_event_tables_are_append_only(store: PostgresStore, pg_url: str, statement: str) -> None:
    state = make_run(store)
    append(store, state, model_step())
    store.create_task("a", actor="p")
    with pytest.raises(psycopg.errors.RestrictViolation, match="append-only"):
        sql(pg_url, statement)
    assert len(store.read_events(state.run_id)) == 3


def test_synchronous_commit_is_a_url_option(pg_url: str) -> None:
    with PostgresStore(pg_url + "?synchronous_commit=off") as store:
        with store._db.connection() as conn:
            assert conn.execute("SHOW synchronous_commit").fetchone() == ("off",)
        assert store.create_task("a", actor="p").ready


# --- the claim's index -----------------------------------------------------------------


def test_claim_uses_its_index_on_a_table_with_a_million_finished_tasks(
    store: PostgresStore, pg_url: str
) -> None:
    sql(
        pg_url,
        """
        INSERT INTO tasks (id, subject, description, status, owner, attempt, result, options,
                           created_at, updated_at, version, blocked_by, open_blockers)
        SELECT 'task_' || lpad(to_hex(n), 8, '0'), 'done ' || n, '', 'completed', 'w', 1,
               'ok', '{}', now(), now(), 3, '{}', 0
        FROM generate_series(1, 1000000) AS n
        """,
    )
    sql(pg_url, "ANALYZE tasks")
    waiting = store.create_task("the one left", actor="p")
    params = {"owner": "w", "token": "t" * 32, "lease": 30.0}
    with psycopg.connect(pg_url, autocommit=True) as conn:
        plan = "\n".join(r[0] for r in conn.execute("EXPLAIN " + CLAIM_NEXT, params))
    assert "Index Scan using tasks_ready on tasks r" in plan, plan  # the ready side
    leased_side = plan.split("tasks x", 1)[1].splitlines()[:2]  # the expired-lease side
    assert "Index Cond" in " ".join(leased_side), plan
    assert "Seq Scan on tasks" not in plan, plan
    started = time.perf_counter()
    claimed = store.claim_task(owner="w", lease_seconds=30)
    assert claimed is not None and claimed.id == waiting.id
    assert time.perf_counter() - started < 0.5


# --- NOTIFY and its listener -----------------------------------------------------------


def test_an_idle_waiter_wakes_on_notify_long_before_its_poll_interval(
    store: PostgresStore, pg_url: str
) -> None:
    store.wait_for_work(0.3)  # the listener is up
    assert store._listener().connected.wait(5)
    with PostgresStore(pg_url) as other:
        threading.Timer(0.3, lambda: other.create_task("wake up", actor="p")).start()
        started = time.monotonic()
        assert store.wait_for_work(10) is True
        assert time.monotonic() - started < 2


def test_tasks_are_picked_up_within_the_poll_interval_after_the_listener_is_killed(
    store: PostgresStore, pg_url: str
) -> None:
    poll = 0.5
    claimed: dict[str, float] = {}
    stop = threading.Event()

    def worker() -> None:
        while not stop.is_set():
            task = store.claim_task(owner="w", lease_seconds=30)
            if task is not None:
                claimed[task.id] = time.monotonic()
                continue
            store.wait_for_work(poll)

    thread = threading.Thread(target=worker)
    thread.start()
    try:
        assert store._listener().connected.wait(5)
        killed = sql(
            pg_url,
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name = %s AND datname = current_database()",
            (LISTENER_NAME,),
        )
        assert killed == [(True,)]
        with PostgresStore(pg_url) as other:
            created = {}
            for i in range(3):
                created[other.create_task(f"after the kill {i}", actor="p").id] = time.monotonic()
                time.sleep(0.2)
            deadline = time.monotonic() + 5
            while len(claimed) < 3 and time.monotonic() < deadline:
                time.sleep(0.02)
        assert set(claimed) == set(created)
        for task_id, at in created.items():
            assert claimed[task_id] - at <= poll + 0.5
        deadline = time.monotonic() + 5
        while store._listener().reconnects < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert store._listener().connected.wait(5), "the listener never reconnected"
    finally:
        stop.set()
        thread.join(timeout=10)


def test_wait_for_events_wakes_on_notify(store: PostgresStore, pg_url: str) -> None:
    state = make_run(store)
    with PostgresStore(pg_url) as other:
        threading.Timer(0.3, lambda: append(other, state, model_step())).start()
        started = time.monotonic()
        assert store.wait_for_events(state.run_id, after=1, timeout=10) is True
        assert time.monotonic() - started < 2


# --- a task whose run waits for a person -----------------------------------------------


def test_a_pending_task_whose_run_waits_for_a_person_is_not_claimable(
    store: PostgresStore,
) -> None:
    task = store.claim_task(
        owner="w", lease_seconds=30, task_id=store.create_task("ask", actor="p").id
    )
    assert task is not None and task.lease_token is not None
    run = make_run(store, task_id=task.id)
    store.link_task_run(task.id, run.run_id, owner="w", token=task.lease_token)
    run, _ = append(store, run, legal_step(run, 8))  # a question: the run waits
    assert run.status is RunStatus.WAITING
    store.release_task(task.id, owner="w", token=task.lease_token)

    assert store.claim_task(owner="other", lease_seconds=30) is None
    with pytest.raises(TaskNotClaimable, match="waiting for a person"):
        store.claim_task(owner="other", lease_seconds=30, task_id=task.id)

    run, _ = append(store, run, legal_step(run, 0))  # answered: running again
    again = store.claim_task(owner="other", lease_seconds=30)
    assert again is not None and again.id == task.id and again.attempt == 2
