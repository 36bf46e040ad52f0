"""A run moved between two real `keel worker` processes on PostgreSQL by a SIGKILL.

`keel run --detach` enqueues the run; the first worker is armed with KEEL_FAULT to
die right after its command's tool_finished is committed; the second worker takes
the run over once the lease (KEEL_LEASE_TTL=1) lapses and finishes it. Only the
model's decisions are scripted.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from keel.core.events import EventType
from keel.core.state import RunState
from keel.core.status import RunStatus
from keel.store.postgres.store import PostgresStore
from keel.testing.stores import postgres_unavailable, scratch_database

pytestmark = [pytest.mark.postgres, pytest.mark.sandboxed]  # auto mode runs its command

KEEL = str(Path(sys.executable).with_name("keel"))
SCRIPT: list[dict[str, Any]] = [
    {
        "tool_calls": [
            {"name": "run_command", "arguments": {"argv": ["sh", "-c", "echo ran >> effects.log"]}}
        ]
    },
    {"tool_calls": [{"name": "request_completion", "arguments": {"summary": "logged"}}]},
]


@pytest.fixture
def pg_url() -> Iterator[str]:
    if reason := postgres_unavailable():
        pytest.skip(f"PostgreSQL store not tested: {reason}")
    with scratch_database() as url:
        yield url


def keel(cwd: Path, *args: str, fault: str | None = None) -> subprocess.Popen[str]:
    env = {**os.environ, "KEEL_LEASE_TTL": "1"}
    env.pop("KEEL_FAULT", None)
    if fault:
        env["KEEL_FAULT"] = fault
    return subprocess.Popen(
        [KEEL, *args],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_run_killed_under_one_worker_completes_under_another_without_repeating_its_effect(
    tmp_path: Path, pg_url: str
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    enqueue = keel(
        ws,
        "run",
        "log once",
        "--detach",
        "--model",
        f"scripted:{script}",
        "--mode",
        "auto",
        "--json",
        "--store",
        pg_url,
    )
    out, err = enqueue.communicate(timeout=60)
    assert enqueue.returncode == 0, err
    run_id = json.loads(out.splitlines()[0])["run_id"]
    store = PostgresStore(pg_url)
    try:
        assert store.load_run(run_id).status is RunStatus.QUEUED

        first = keel(
            ws, "worker", "--store", pg_url, "--poll", "0.2", fault="after_tool_finished:1"
        )
        _, err = first.communicate(timeout=60)
        assert first.returncode == -signal.SIGKILL, err
        dead = store.load_run(run_id)
        assert dead.status is RunStatus.RUNNING and dead.usage.tool_calls == 1
        assert (ws / "effects.log").read_text() == "ran\n"

        second = keel(ws, "worker", "--store", pg_url, "--poll", "0.2")
        deadline = time.monotonic() + 60
        while not store.load_run(run_id).status.terminal:
            assert time.monotonic() < deadline, "the second worker never finished the run"
            time.sleep(0.1)
        second.send_signal(signal.SIGTERM)
        _, err = second.communicate(timeout=60)
        assert second.returncode == 0, err

        events = store.read_events(run_id)
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
        assert RunState.from_events(events).to_dict() == store.load_run(run_id).to_dict()
        assert store.load_run(run_id).status is RunStatus.COMPLETED
        started = [e for e in events if e.type is EventType.TOOL_STARTED]
        assert len(started) == 1, "the command was started again after the takeover"
        assert (ws / "effects.log").read_text() == "ran\n"  # the effect happened once
    finally:
        store.close()
