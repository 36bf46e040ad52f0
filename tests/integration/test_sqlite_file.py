"""The SQLite file itself: append-only events, migrations, corrupt and newer files, URLs."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from keel.core.errors import ConfigError, SchemaTooNew, StoreCorrupt, StoreError
from keel.store.sqlite.connection import Database
from keel.store.sqlite.migrate import SQLiteMigrations, discover, migrate
from keel.store.sqlite.store import SQLiteStore
from keel.store.url import open_store
from keel.testing.stores import append, make_run, model_step


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "keel.db"


def raw(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(path, isolation_level=None, check_same_thread=False)


def test_events_cannot_be_updated_or_deleted(db_path: Path) -> None:
    with SQLiteStore(db_path) as store:
        state = make_run(store)
        append(store, state, model_step())
    conn = raw(db_path)
    with pytest.raises(sqlite3.IntegrityError, match="append-only"):
        conn.execute("UPDATE events SET data = '{}' WHERE seq = 2")
    with pytest.raises(sqlite3.IntegrityError, match="append-only"):
        conn.execute("DELETE FROM events")
    assert conn.execute("SELECT count(*) FROM events").fetchone()[0] == 3
    conn.close()


def test_migrations_are_recorded_once_in_order(db_path: Path) -> None:
    SQLiteStore(db_path).close()
    SQLiteStore(db_path).close()
    conn = raw(db_path)
    rows = conn.execute("SELECT version, name FROM schema_migrations ORDER BY version").fetchall()
    conn.close()
    shipped = discover("keel.store.sqlite")
    assert rows == [(m.version, m.name) for m in shipped]
    assert rows[0] == (1, "runs")


def test_an_older_database_is_migrated_on_open(db_path: Path) -> None:
    shipped = discover("keel.store.sqlite")
    db = Database(db_path)
    assert [m.version for m in migrate(SQLiteMigrations(db), shipped[:1])] == [1]
    db.close()
    SQLiteStore(db_path).close()
    conn = raw(db_path)
    versions = [v for (v,) in conn.execute("SELECT version FROM schema_migrations")]
    conn.close()
    assert versions == [m.version for m in shipped]


def test_a_newer_schema_is_refused_naming_file_and_versions(db_path: Path) -> None:
    SQLiteStore(db_path).close()
    conn = raw(db_path)
    conn.execute("INSERT INTO schema_migrations VALUES (999, 'future', '2099-01-01')")
    conn.close()
    with pytest.raises(SchemaTooNew) as err:
        SQLiteStore(db_path)
    message = str(err.value)
    assert str(db_path) in message and "999" in message and "upgrade keel" in message


def test_a_file_that_is_not_sqlite_is_refused_and_left_untouched(db_path: Path) -> None:
    garbage = b"this is my shopping list, not a database\n" * 100
    db_path.write_bytes(garbage)
    with pytest.raises(StoreCorrupt) as err:
        SQLiteStore(db_path)
    assert str(db_path) in str(err.value)
    assert db_path.read_bytes() == garbage
    assert not Path(str(db_path) + "-wal").exists()


def test_a_sqlite_file_with_damaged_pages_is_reported_corrupt(db_path: Path) -> None:
    with SQLiteStore(db_path) as store:
        make_run(store)
    conn = raw(db_path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    data = bytearray(db_path.read_bytes())
    data[100:4096] = b"\xff" * (4096 - 100)  # the schema page, after the header
    db_path.write_bytes(bytes(data))
    with pytest.raises(StoreCorrupt) as err:
        SQLiteStore(db_path)
    assert str(db_path) in str(err.value)


def test_a_foreign_sqlite_database_is_not_taken_over(db_path: Path) -> None:
    conn = raw(db_path)
    conn.execute("CREATE TABLE recipes (name TEXT)")
    conn.close()
    with pytest.raises(StoreCorrupt, match="recipes"):
        SQLiteStore(db_path)
    conn = raw(db_path)
    tables = [n for (n,) in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
    conn.close()
    assert tables == ["recipes"]


def test_a_missing_folder_is_created(tmp_path: Path) -> None:
    with SQLiteStore(tmp_path / "a" / "b" / "keel.db") as store:
        make_run(store)
    assert (tmp_path / "a" / "b" / "keel.db").exists()


def test_wal_and_durability_settings(db_path: Path) -> None:
    with SQLiteStore(db_path) as store:
        conn = store._db.connection()
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
        assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    full = open_store(f"sqlite:///{db_path}?synchronous=full")
    assert isinstance(full, SQLiteStore)
    assert full._db.connection().execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    full.close()


def test_store_urls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    default = open_store(None)
    assert default.url == f"sqlite:///{tmp_path}/.keel/keel.db"
    default.close()
    relative = open_store("sqlite:///data/runs.db")
    assert relative.url == f"sqlite:///{tmp_path}/data/runs.db"
    relative.close()
    absolute = open_store(f"sqlite:///{tmp_path}/abs.db")
    assert absolute.url == f"sqlite:///{tmp_path}/abs.db"
    absolute.close()
    with pytest.raises(ConfigError, match="mysql://x"):
        open_store("mysql://x")
    with pytest.raises(ConfigError, match="synchronous"):
        open_store("sqlite:///a.db?synchronous=off")
    with pytest.raises(StoreError, match="no Keel store exists"):
        open_store("sqlite:///missing.db", must_exist=True)
    assert not (tmp_path / "missing.db").exists()


def test_a_lock_held_too_long_gives_a_clear_store_error(db_path: Path) -> None:
    SQLiteStore(db_path).close()
    holder = raw(db_path)
    holder.execute("BEGIN IMMEDIATE")
    db = Database(db_path, lock_wait_s=0.3)
    with pytest.raises(StoreError, match="stayed locked") as err, db.write():
        pass
    assert "database is locked" not in str(err.value)
    holder.execute("ROLLBACK")
    with db.write() as conn:  # free again: the same Database works
        conn.execute("SELECT 1")
    db.close()
    holder.close()


def test_writes_wait_for_a_briefly_held_lock(db_path: Path) -> None:
    with SQLiteStore(db_path) as store:
        state = make_run(store)
        holder = raw(db_path)
        holder.execute("BEGIN IMMEDIATE")
        threading.Timer(0.5, lambda: holder.execute("COMMIT")).start()
        state, _ = append(store, state, model_step())
        assert state.last_seq == 3
        holder.close()


def test_a_new_file_opened_while_another_opener_holds_it_waits_for_the_lock(
    db_path: Path,
) -> None:
    """Two `keel worker`s started on a store that does not exist yet both open it at
    once: one switches the new file to WAL under its exclusive lock, and the other
    waits for that lock as a writer would, instead of failing on SQLite's 100 ms."""
    holder = raw(db_path)  # a new file, still in rollback-journal mode
    holder.execute("BEGIN EXCLUSIVE")
    threading.Timer(0.5, lambda: holder.execute("COMMIT")).start()
    with SQLiteStore(db_path) as store:
        assert store._db.connection().execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert make_run(store).last_seq == 1
    holder.close()


OPENER = r"""
import sys, time
from keel.store.sqlite.store import SQLiteStore

path, start_at = sys.argv[1], float(sys.argv[2])
time.sleep(max(0.0, start_at - time.time()))
SQLiteStore(path).close()
"""


def test_processes_opening_one_new_file_at_once_all_open_it(tmp_path: Path) -> None:
    """Real processes, started together on a store that does not exist (as a fleet of
    workers is): every one opens it. Before the open waited for the new file's lock, some
    failed with "database is locked" in every run of this test on a 2-core machine."""
    for round_ in range(5):
        path = tmp_path / f"new-{round_}.db"
        start_at = time.time() + 1.0  # after every interpreter has started
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", OPENER, str(path), str(start_at)],
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(4)
        ]
        errors = [proc.communicate(timeout=120)[1] for proc in procs]
        assert [proc.returncode for proc in procs] == [0] * 4, errors
        with SQLiteStore(path) as store:  # one schema, migrated once
            applied = SQLiteMigrations(store._db).applied_versions()
            assert sorted(applied) == [m.version for m in discover("keel.store.sqlite")]


def test_a_new_file_locked_too_long_gives_a_clear_store_error(db_path: Path) -> None:
    holder = raw(db_path)
    holder.execute("BEGIN EXCLUSIVE")
    with pytest.raises(StoreError, match="stayed locked") as err:
        Database(db_path, lock_wait_s=0.3)
    assert "database is locked" not in str(err.value)
    holder.execute("ROLLBACK")
    holder.close()
    db = Database(db_path)  # free again: the file opens and is WAL
    assert db.connection().execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    db.close()


def test_leases_can_be_renewed_from_another_thread(db_path: Path) -> None:
    with SQLiteStore(db_path) as store:
        state = make_run(store)
        lease = store.acquire_run_lease(state.run_id, owner="w", ttl=5)
        renewed: list[object] = []
        beat = threading.Thread(target=lambda: renewed.append(store.renew_run_lease(lease, ttl=9)))
        beat.start()
        state, _ = append(store, state, model_step(), lease_token=lease.token)
        beat.join()
        assert len(renewed) == 1 and state.last_seq == 3
