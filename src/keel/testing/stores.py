"""Stores for tests: one registry of backends, and factories for runs and steps.

``STORE_BACKENDS`` maps a backend name to a context manager that yields a fresh,
empty store and cleans it up; the conformance suite runs once per entry. To add
a backend, register it here::

    STORE_BACKENDS["postgres"] = postgres_store   # yields a PostgresStore on a scratch DB

A factory may raise ``pytest.skip``-style exceptions itself when its server is
unavailable; the registry does not know about pytest. ``postgres_unavailable()``
says why the PostgreSQL entry cannot run (its variable unset), for the fixture
to skip with that reason.
"""

from __future__ import annotations

import importlib.util
import os
import sqlite3
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from keel.core.budget import Budget
from keel.core.chain import chain_time
from keel.core.errors import ConfigError
from keel.core.events import Event, EventType, NewEvent
from keel.core.records import RunOptions
from keel.core.state import RunState, transition
from keel.core.status import RunStatus
from keel.store.base import Store
from keel.store.sqlite.store import SQLiteStore
from keel.store.step import dump_json

StoreFactory = Callable[[Path], AbstractContextManager[Store]]


@contextmanager
def sqlite_store(tmp: Path, *, synchronous: str = "normal") -> Iterator[Store]:
    """A new SQLite store in ``tmp`` (a folder), closed on exit."""
    store = SQLiteStore(tmp / "keel.db", synchronous=synchronous)
    try:
        yield store
    finally:
        store.close()


POSTGRES_URL_ENV = "KEEL_TEST_POSTGRES_URL"


def postgres_unavailable() -> str | None:
    """Why PostgreSQL tests cannot run here (None when they can)."""
    if not os.environ.get(POSTGRES_URL_ENV):
        return f"{POSTGRES_URL_ENV} is not set (e.g. postgresql://postgres@127.0.0.1:5432/postgres)"
    if importlib.util.find_spec("psycopg") is None:
        return "psycopg is not installed: pip install 'keel[postgres]'"
    return None


@contextmanager
def scratch_database() -> Iterator[str]:
    """The URL of a new empty database ``keel_test_<hex>`` on the server named by
    ``KEEL_TEST_POSTGRES_URL``, dropped on exit (open sessions are ended)."""
    import psycopg  # noqa: PLC0415 - optional: only the PostgreSQL tests need it

    admin_url = os.environ.get(POSTGRES_URL_ENV)
    if not admin_url:
        raise ConfigError(f"{POSTGRES_URL_ENV} is not set; PostgreSQL tests need a server")
    name = "keel_test_" + uuid.uuid4().hex[:12]
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield urlunsplit(urlsplit(admin_url)._replace(path="/" + name))
    finally:
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextmanager
def postgres_store(tmp: Path) -> Iterator[Store]:
    """A ``PostgresStore`` on a scratch database (see ``scratch_database``), closed and
    dropped on exit. ``tmp`` is unused: the server holds the data."""
    from keel.store.postgres.store import PostgresStore  # noqa: PLC0415 - optional extra

    with scratch_database() as url:
        store = PostgresStore(url)
        try:
            yield store
        finally:
            store.close()


STORE_BACKENDS: dict[str, StoreFactory] = {
    "sqlite": sqlite_store,
    "postgres": postgres_store,
}


@contextmanager
def reopened(store: Store) -> Iterator[Store]:
    """A second, cold instance of ``store`` (nothing cached): what another process sees."""
    from keel.store.url import open_store  # noqa: PLC0415 - url imports every backend

    other = open_store(store.url)
    try:
        yield other
    finally:
        other.close()


class OutOfBand:
    """Direct SQL on a store's database, past Keel: what someone holding the SQLite file or
    the server's password can do. Tests of tamper evidence use it; ``?`` marks parameters
    on both backends. Use as a context manager (the connection is closed on exit)."""

    def __init__(self, store: Store) -> None:
        self.sqlite = isinstance(store, SQLiteStore)
        if isinstance(store, SQLiteStore):
            self._conn: Any = sqlite3.connect(store.path, isolation_level=None)
        else:
            import psycopg  # noqa: PLC0415 - optional: only the PostgreSQL tests need it

            self._conn = psycopg.connect(store.url, autocommit=True)

    def __enter__(self) -> OutOfBand:
        return self

    def __exit__(self, *exc: object) -> None:
        self._conn.close()

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        cursor = self._conn.execute(sql if self.sqlite else sql.replace("?", "%s"), params)
        return list(cursor.fetchall()) if cursor.description else []

    def drop_event_triggers(self) -> None:
        """Drop the triggers that keep events append-only (not the one against gaps)."""
        if self.sqlite:
            self.execute("DROP TRIGGER events_refuse_update")
            self.execute("DROP TRIGGER events_refuse_delete")
        else:
            self.execute("DROP TRIGGER events_append_only ON events")

    def insert_event(
        self,
        run_id: str,
        seq: int,
        *,
        data: str = '{"text":"added out of band"}',
        hash: str | None = "0" * 64,
    ) -> None:
        self.execute(
            "INSERT INTO events (run_id, seq, event_id, type, recorded_at, data, hash) "
            "VALUES (?, ?, ?, 'note_added', '2026-01-01T00:00:00.000000+00:00', ?, ?)",
            (run_id, seq, uuid.uuid4().hex, data, hash),
        )

    def change_event(self, run_id: str, seq: int, data: str) -> None:
        self.execute("UPDATE events SET data = ? WHERE run_id = ? AND seq = ?", (data, run_id, seq))

    def delete_event(self, run_id: str, seq: int) -> None:
        self.execute("DELETE FROM events WHERE run_id = ? AND seq = ?", (run_id, seq))

    def event_row(self, run_id: str, seq: int) -> tuple[Any, ...] | None:
        rows = self.execute(
            "SELECT seq, event_id, type, data, hash FROM events WHERE run_id = ? AND seq = ?",
            (run_id, seq),
        )
        return rows[0] if rows else None


def make_run(store: Store, **overrides: Any) -> RunState:
    """Create a run with sensible defaults; any ``create_run`` argument can be overridden."""
    args: dict[str, Any] = {
        "goal": "check package.json",
        "workspace": "/tmp/workspace",
        "options": RunOptions(model="scripted:turns.json", budget=Budget(max_steps=12)),
    }
    args.update(overrides)
    return store.create_run(**args)


def model_step(
    *,
    content: str = "thinking",
    input_tokens: int = 100,
    output_tokens: int = 20,
    cost: float = 0.0,
) -> list[NewEvent]:
    """The events of one model turn: request and response (one step of the budget)."""
    return [
        NewEvent(type=EventType.MODEL_REQUESTED, data={"step": 1, "messages": 2}),
        NewEvent(
            type=EventType.MODEL_RESPONDED,
            data={
                "content": content,
                "tool_calls": [],
                "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens},
                "cost": cost,
            },
        ),
    ]


def tool_step(
    call_id: str,
    *,
    tool: str = "write_file",
    arguments: dict[str, Any] | None = None,
    changed_files: dict[str, str] | None = None,
) -> list[NewEvent]:
    """A tool call recorded as started then finished."""
    args = arguments if arguments is not None else {"path": "a.txt", "content": "x"}
    return [
        NewEvent(
            type=EventType.TOOL_STARTED,
            data={"call_id": call_id, "key": f"key-{call_id}", "tool": tool, "arguments": args},
        ),
        NewEvent(
            type=EventType.TOOL_FINISHED,
            data={
                "call_id": call_id,
                "tool": tool,
                "arguments": args,
                "result": "ok",
                "changed_files": changed_files or {},
            },
        ),
    ]


def move(state: RunState, to: RunStatus, reason: str | None = None) -> NewEvent:
    """The ``status_changed`` event for a legal move (raises InvalidTransition otherwise)."""
    return transition(state, to, reason)


def append(
    store: Store, state: RunState, events: Sequence[NewEvent], **kwargs: Any
) -> tuple[RunState, list[Event]]:
    """Append ``events`` as the next step of ``state`` (expected_seq from the state)."""
    return store.append_events(state.run_id, events, expected_seq=state.last_seq, **kwargs)


def write_calls(store: Store, state: RunState, calls: int, start: int = 0) -> RunState:
    """Append ``calls`` write calls (started, finished), numbered from ``start``, each
    changing one new file ``f<i>.py``; the state after the last."""
    for i in range(start, start + calls):
        state, _ = append(store, state, tool_step(f"c{i}", changed_files={f"f{i}.py": "ab" * 32}))
    return state


def legal_step(state: RunState, choice: int) -> list[NewEvent]:
    """A legal next step for ``state`` picked deterministically by ``choice`` (>= 0).

    Covers every kind of change the fold knows (usage, tool calls, changed files,
    todos, notes, warnings, approvals, questions, verification, every legal status
    move). Returns ``[]`` for a terminal run. Property tests draw the choices.
    """
    options = _STEPS[state.status]
    if not options:
        return []
    pick, arg = choice % len(options), choice // len(options)
    return options[pick](state, arg)


def _validation(state: RunState, passed: bool, arg: int) -> dict[str, Any]:
    return {
        "command": "pytest -q",
        "exit_code": 0 if passed else 1 + arg % 3,
        "duration_s": 0.5 + arg % 7,
        "artifact": f"art_{arg:032x}",
        "mutation_revision": state.mutation_revision,
        "file_hashes": dict(state.changed_files),
        "passed": passed,
    }


def _reason(arg: int) -> str:
    return f"reason {arg}"


_Step = Callable[[RunState, int], list[NewEvent]]

_RUNNING: list[_Step] = [
    lambda s, a: model_step(input_tokens=a % 500, output_tokens=a % 50, cost=(a % 9) / 1000),
    lambda s, a: tool_step(
        f"call_{s.last_seq}", changed_files={f"f{a % 4}.py": f"{a:064x}"} if a % 2 else None
    ),
    lambda s, a: [
        NewEvent(
            type=EventType.TOOL_STARTED,
            data={"call_id": f"call_{s.last_seq}", "tool": "run_command", "arguments": {}},
        ),
        NewEvent(
            type=EventType.TOOL_FAILED,
            data={"call_id": f"call_{s.last_seq}", "tool": "run_command", "message": f"e{a}"},
        ),
    ],
    lambda s, a: [
        NewEvent(
            type=EventType.TODO_UPDATED,
            data={
                "todos": [
                    {"content": f"todo {i}", "status": ("pending", "completed")[(a >> i) & 1]}
                    for i in range(a % 4)
                ]
            },
        )
    ],
    lambda s, a: [NewEvent(type=EventType.NOTE_ADDED, data={"text": f"note {a}"})],
    lambda s, a: [
        NewEvent(
            type=EventType.BUDGET_WARNING,
            data={"dimension": ("steps", "tokens", "cost")[a % 3], "used": a, "limit": a + 1},
        )
    ],
    lambda s, a: [
        NewEvent(type=EventType.VERIFICATION_STARTED, data={"commands": ["pytest -q"]}),
        NewEvent(
            type=EventType.VERIFICATION_PASSED if a % 2 else EventType.VERIFICATION_FAILED,
            data={"records": [_validation(s, bool(a % 2), a)]},
        ),
    ],
    lambda s, a: [
        NewEvent(
            type=EventType.APPROVAL_REQUESTED,
            data={
                "call_id": f"call_{s.last_seq}",
                "tool": "run_command",
                "arguments": {"argv": ["rm", f"f{a}"]},
                "digest": f"{a:016x}",
                "risk": "execute",
            },
        ),
        NewEvent(
            type=EventType.STATUS_CHANGED,
            data={"from": "running", "to": "waiting", "reason": "approval of run_command"},
        ),
    ],
    lambda s, a: [
        NewEvent(
            type=EventType.INPUT_REQUESTED,
            data={"call_id": f"call_{s.last_seq}", "question": f"which file? ({a})"},
        ),
        move(s, RunStatus.WAITING, "a question for the user"),
    ],
    lambda s, a: [move(s, RunStatus.PAUSED, _reason(a))],
    lambda s, a: [move(s, RunStatus.VERIFYING, "the model asked to finish")],
    lambda s, a: [move(s, (RunStatus.FAILED, RunStatus.BLOCKED)[a % 2], _reason(a))],
]


def _resume_waiting(s: RunState, a: int) -> list[NewEvent]:
    pending = s.pending
    if pending is not None and pending.kind == "question":
        answer = NewEvent(
            type=EventType.INPUT_RECEIVED, data={"call_id": pending.call_id, "answer": f"a{a}"}
        )
    elif pending is not None:
        kind = EventType.APPROVAL_GRANTED if a % 2 else EventType.APPROVAL_DENIED
        answer = NewEvent(
            type=kind,
            data={"call_id": pending.call_id, "digest": pending.digest, "by": "user"},
        )
    else:
        answer = NewEvent(type=EventType.NOTE_ADDED, data={"text": "resumed"})
    return [answer, move(s, RunStatus.RUNNING)]


_STEPS: dict[RunStatus, list[_Step]] = {
    RunStatus.QUEUED: [
        lambda s, a: [move(s, RunStatus.RUNNING)],
        lambda s, a: [move(s, RunStatus.CANCELLED, _reason(a))],
    ],
    RunStatus.RUNNING: _RUNNING,
    RunStatus.WAITING: [
        _resume_waiting,
        _resume_waiting,
        lambda s, a: [move(s, (RunStatus.FAILED, RunStatus.CANCELLED)[a % 2], _reason(a))],
    ],
    RunStatus.PAUSED: [
        lambda s, a: [move(s, RunStatus.RUNNING)],
        lambda s, a: [move(s, RunStatus.CANCELLED, _reason(a))],
    ],
    RunStatus.VERIFYING: [
        lambda s, a: [
            NewEvent(
                type=EventType.VERIFICATION_PASSED, data={"records": [_validation(s, True, a)]}
            ),
            move(s, RunStatus.COMPLETED, "verified"),
        ],
        lambda s, a: [
            NewEvent(
                type=EventType.VERIFICATION_FAILED, data={"records": [_validation(s, False, a)]}
            ),
            move(s, RunStatus.RUNNING),
        ],
        lambda s, a: [move(s, (RunStatus.FAILED, RunStatus.CANCELLED)[a % 2], _reason(a))],
    ],
    RunStatus.COMPLETED: [],
    RunStatus.FAILED: [],
    RunStatus.BLOCKED: [],
    RunStatus.CANCELLED: [],
}


def write_run_with_snapshot_row(
    conn: Any, state: RunState, events: Sequence[Event], *, placeholder: str = "?"
) -> None:
    """Store a run as Keel did before SQLite's migration 0007 (and as PostgreSQL still
    does): its row holding the snapshot, then its chained events, no figures. For
    migration tests on a raw connection (``placeholder``: ``?`` SQLite, ``%s`` psycopg)."""
    at = chain_time(events[0].recorded_at)
    conn.execute(
        "INSERT INTO runs (id, status, goal, workspace, snapshot, last_seq, last_hash, "
        f"created_at, updated_at) VALUES ({', '.join([placeholder] * 9)})",
        (
            state.run_id,
            state.status.value,
            state.goal,
            state.workspace,
            dump_json(state.to_dict()),
            state.last_seq,
            state.last_hash,
            at,
            at,
        ),
    )
    for e in events:
        conn.execute(
            "INSERT INTO events (run_id, seq, event_id, type, recorded_at, data, hash) "
            f"VALUES ({', '.join([placeholder] * 7)})",
            (
                e.run_id,
                e.seq,
                e.event_id,
                e.type.value,
                chain_time(e.recorded_at),
                dump_json(e.data),
                e.hash,
            ),
        )
