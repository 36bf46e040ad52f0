"""One executing process per run: concurrent `keel resume`, and a frozen stale lease holder.

Real `keel` subprocesses on a real SQLite file; the model's turns are scripted.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from keel.core.events import Event, EventType
from keel.core.status import RunStatus
from keel.store.url import open_store

KEEL = str(Path(sys.executable).with_name("keel"))
TIMEOUT_S = 60

# The command appends a line, then holds the run until the test creates `go`.
HOLDING_SCRIPT: list[dict[str, Any]] = [
    {
        "tool_calls": [
            {
                "name": "run_command",
                "arguments": {
                    "argv": [
                        "sh",
                        "-c",
                        "echo ran >> log.txt; while [ ! -f go ]; do sleep 0.05; done",
                    ]
                },
            }
        ]
    },
    {"tool_calls": [{"name": "request_completion", "arguments": {"summary": "logged"}}]},
]

WRITE_SCRIPT: list[dict[str, Any]] = [
    {"tool_calls": [{"name": "write_file", "arguments": {"path": "a.txt", "content": "bye\n"}}]},
    {"tool_calls": [{"name": "request_completion", "arguments": {"summary": "a.txt says bye"}}]},
]


def keel_cmd(*args: str, store: str) -> list[str]:
    return [KEEL, *args, "--store", store]


def env_with(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "KEEL_FAULT"}
    env.update(extra)
    return env


def setup(tmp_path: Path, script: list[dict[str, Any]]) -> tuple[Path, str, Path]:
    root = tmp_path / "ws"
    root.mkdir()
    (root / "a.txt").write_text("hello\n")
    path = tmp_path / "script.json"
    path.write_text(json.dumps(script))
    return root, f"sqlite:///{tmp_path / 'keel.db'}", path


def crashed_run(root: Path, store: str, script: Path, verify: str) -> str:
    """A run whose process died before its first model turn was stored; its lease expired."""
    proc = subprocess.run(
        keel_cmd(
            "run", "log it", "--model", f"scripted:{script}", "--mode", "auto",
            "--verify", verify, "--json", store=store,
        ),
        cwd=root,
        env=env_with(KEEL_FAULT="mid_model_step:1", KEEL_LEASE_TTL="1"),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )  # fmt: skip
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    run_id = str(json.loads(proc.stdout.splitlines()[0])["run_id"])
    wait_until(lambda: current_lease_owner(store, run_id) is None, "the lease to expire")
    return run_id


def current_lease_owner(store: str, run_id: str) -> str | None:
    with open_store(store) as s:
        lease = s.current_run_lease(run_id)
    return lease.owner if lease else None


def read_events(store: str, run_id: str) -> list[Event]:
    with open_store(store) as s:
        return s.read_events(run_id)


def wait_until(condition: Any, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def process_state(pid: int) -> str:
    """The kernel's one-letter state of ``pid`` (``T`` = stopped)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0]


@pytest.mark.sandboxed
def test_two_concurrent_resumes_execute_the_run_once_and_the_loser_names_the_holder(
    tmp_path: Path,
) -> None:
    root, store, script = setup(tmp_path, HOLDING_SCRIPT)
    run_id = crashed_run(root, store, script, verify="grep -q ran log.txt")

    procs = [
        subprocess.Popen(
            keel_cmd("resume", run_id, "--no-wait", store=store),
            cwd=root,
            env=env_with(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    try:
        # The winner is held inside its command until `go` exists; the loser exits first.
        wait_until(lambda: any(p.poll() is not None for p in procs), "one resume to exit")
        loser = next(p for p in procs if p.poll() is not None)
        winner = next(p for p in procs if p is not loser)
        holder = current_lease_owner(store, run_id)
        (root / "go").write_text("")
        _, loser_err = loser.communicate(timeout=TIMEOUT_S)
        winner_out, winner_err = winner.communicate(timeout=TIMEOUT_S)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()

    assert loser.returncode == 2
    assert holder is not None
    assert f"is being executed by {holder}" in loser_err
    assert "its lease lapses at" in loser_err
    assert winner.returncode == 0, winner_out + winner_err
    assert (root / "log.txt").read_text().splitlines() == ["ran"]
    events = read_events(store, run_id)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert sum(e.type is EventType.MODEL_RESPONDED for e in events) == 2  # each turn once
    with open_store(store) as s:
        assert s.load_run(run_id).status is RunStatus.COMPLETED


@pytest.mark.parametrize(
    "frozen_at",
    [
        "after_tool_started",  # its next act would be the effect itself
        "after_tool_finished",  # its next act would be a store write
    ],
)
def test_stale_lease_holder_is_refused_every_write_and_stops_after_a_takeover(
    tmp_path: Path, frozen_at: str
) -> None:
    root, store, script = setup(tmp_path, WRITE_SCRIPT)
    stale = subprocess.Popen(
        keel_cmd(
            "run", "say bye", "--model", f"scripted:{script}", "--verify", "grep -q bye a.txt",
            "--json", store=store,
        ),
        cwd=root,
        env=env_with(KEEL_FAULT=f"{frozen_at}:1:stop", KEEL_LEASE_TTL="1"),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        wait_until(lambda: process_state(stale.pid) == "T", "the run to freeze itself")
        assert stale.stdout is not None
        run_id = str(json.loads(stale.stdout.readline())["run_id"])
        wait_until(lambda: current_lease_owner(store, run_id) is None, "the lease to expire")

        takeover = subprocess.run(
            keel_cmd("resume", run_id, store=store),
            cwd=root,
            env=env_with(),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            check=False,
        )
        assert takeover.returncode == 0, takeover.stdout + takeover.stderr
        written = (root / "a.txt").stat()
        seen = read_events(store, run_id)

        stale.send_signal(signal.SIGCONT)
        _, stale_err = stale.communicate(timeout=TIMEOUT_S)
    finally:
        if stale.poll() is None:
            stale.kill()
            stale.wait()

    assert stale.returncode == 2
    assert "no longer held by this process" in stale_err
    assert read_events(store, run_id) == seen  # not one event from the stale process
    after = (root / "a.txt").stat()
    assert (after.st_ino, after.st_mtime_ns) == (written.st_ino, written.st_mtime_ns)
    assert (root / "a.txt").read_text() == "bye\n"
    finished = [
        e for e in seen if e.type is EventType.TOOL_FINISHED and e.data["tool"] == "write_file"
    ]
    assert len(finished) == 1
    with open_store(store) as s:
        assert s.load_run(run_id).status is RunStatus.COMPLETED
