"""`keel resume` on the machine where the run's process died takes over at once; a run a
live process holds is waited for with a countdown, or refused at once with --no-wait.

Real `keel` subprocesses on SQLite and PostgreSQL, with the default 30 s run lease
(no KEEL_LEASE_TTL): a resume that waited for the dead process's lease would take
30 s, so finishing in a few seconds shows the take-over.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from keel.core.events import EventType
from keel.core.status import RunStatus
from keel.store.base import LeaseHolder
from keel.store.url import open_store
from keel.testing.cli import DONE, KEEL, KeelWorkspace, call, expect, one_line_error, turn
from keel.testing.stores import postgres_unavailable, scratch_database

TAKEOVER_BOUND_S = 15.0  # well under the 30 s lease a resume would otherwise wait out


@pytest.fixture(params=["sqlite", "postgres"])
def ws(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[KeelWorkspace]:
    root = tmp_path / "ws"
    root.mkdir()
    if request.param == "sqlite":
        yield KeelWorkspace(root)
        return
    if reason := postgres_unavailable():
        pytest.skip(f"PostgreSQL store not tested: {reason}")
    with scratch_database() as url:
        yield KeelWorkspace(root, store_url=url)


def killed_at(ws: KeelWorkspace, fault: str, *turns: dict[str, object]) -> tuple[str, int]:
    """A `keel run` that SIGKILLs itself at ``fault``; its run id and its process id."""
    model = ws.script(*turns)
    env = {k: v for k, v in os.environ.items() if not k.startswith("KEEL_")}
    env["KEEL_FAULT"] = fault
    store = ["--store", ws.store_url] if ws.store_url else []
    proc = subprocess.Popen(
        [KEEL, "run", "write twice", "--model", model, "--json", *store],
        cwd=ws.root,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL, err
    run_id = re.search(r'"run_id": "(run_[0-9a-f]+)"', out)
    assert run_id is not None, out
    return run_id.group(1), proc.pid


def test_resume_right_after_a_sigkill_takes_the_dead_process_lease_over_at_once(
    ws: KeelWorkspace,
) -> None:
    run_id, dead_pid = killed_at(
        ws,
        "after_effect:2",  # the second write happened; its tool_finished was never stored
        turn(call("write_file", path="a.txt", content="one\n")),
        turn(call("write_file", path="a.txt", content="two\n")),
        DONE,
    )
    held = ws.state(run_id)
    assert held.status is RunStatus.RUNNING and held.open_calls
    with open_store(ws.url) as store:
        lease = store.current_run_lease(run_id)
    assert lease is not None and lease.holder is not None and lease.holder.pid == dead_pid

    started = time.monotonic()
    result = ws.keel("resume", run_id)
    elapsed = time.monotonic() - started

    expect(result, 0)
    assert elapsed < TAKEOVER_BOUND_S, f"resume took {elapsed:.1f} s: it waited for the lease"
    (taken,) = ws.of_type(run_id, EventType.LEASE_TAKEN_OVER)
    assert taken.data["owner"] == lease.owner and taken.data["pid"] == dead_pid
    assert taken.data["reason"] == f"process {dead_pid} on {lease.holder.host} is no longer running"
    assert f"took run {run_id} over from {lease.owner}" in result.stderr
    # The dead process's own second write is reconciled, not reported as an outside edit.
    assert ws.of_type(run_id, EventType.WORKSPACE_CHANGED) == []
    assert (ws.root / "a.txt").read_text() == "two\n"
    assert ws.state(run_id).status is RunStatus.COMPLETED


def waiting_run(ws: KeelWorkspace) -> str:
    """A run waiting for an answer (its process exited 3 and gave the lease back), answered."""
    run_id, result = ws.start(
        "ask first", "--model", ws.script(turn(call("ask_user", question="go?")), DONE)
    )
    expect(result, 3)
    expect(ws.keel("answer", run_id, "yes"), 0)
    return run_id


def hold(ws: KeelWorkspace, run_id: str, holder: LeaseHolder, ttl: float) -> str:
    with open_store(ws.url) as store:
        return store.acquire_run_lease(
            run_id, owner="carol@build-9/3", ttl=ttl, holder=holder
        ).owner


def test_a_lease_held_on_another_host_is_refused_at_once_with_no_wait(ws: KeelWorkspace) -> None:
    run_id = waiting_run(ws)
    hold(ws, run_id, LeaseHolder(host="build-9", boot_id="b", pid=4242), ttl=30)
    before = ws.events(run_id)

    started = time.monotonic()
    line = one_line_error(ws.keel("resume", run_id, "--no-wait"))

    assert time.monotonic() - started < 10
    assert f"run {run_id} is being executed by carol@build-9/3 (pid 4242 on build-9)" in line
    lapse = re.search(r"its lease lapses at (\S+ \S+) UTC \(in (\d+) s\)", line)
    assert lapse is not None, line
    assert 20 <= int(lapse.group(2)) <= 30
    assert ws.events(run_id) == before  # nothing written


def test_a_lease_held_on_another_host_is_waited_for_with_a_countdown(ws: KeelWorkspace) -> None:
    run_id = waiting_run(ws)
    hold(ws, run_id, LeaseHolder(host="build-9", boot_id="b", pid=4242), ttl=4)

    started = time.monotonic()
    result = ws.keel("resume", run_id)
    elapsed = time.monotonic() - started

    expect(result, 0)
    assert elapsed > 2.5  # it waited for the lease to lapse …
    counted = [int(n) for n in re.findall(r"its lease lapses in (\d+) s", result.stderr)]
    assert len(counted) >= 3 and counted == sorted(counted, reverse=True), result.stderr
    assert counted[0] >= 3
    assert (
        "held by carol@build-9/3 (pid 4242 on build-9): it is held on another host" in result.stderr
    )
    assert ws.of_type(run_id, EventType.LEASE_TAKEN_OVER) == []  # … and took nothing over
    assert ws.state(run_id).status is RunStatus.COMPLETED
