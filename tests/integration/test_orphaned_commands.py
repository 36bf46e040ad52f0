"""A command outlives no crash: `keel run` SIGKILLed while a command runs, then resumed.

Real `keel` processes, a real SQLite file and real commands; only the model's turns
are scripted. The command appends "start" to a log, sleeps, then appends "end", so
the log tells whether it finished, was killed, or ran twice.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from keel.core.events import EventType
from keel.store.url import open_store

KEEL = str(Path(sys.executable).with_name("keel"))
SLEEP_S = 6.0  # the orphan must outlive the kill, the lease lapsing and a slow CLI start


def script(path: Path) -> str:
    turns: list[dict[str, Any]] = [
        {
            "tool_calls": [
                {
                    "name": "run_command",
                    "arguments": {
                        "argv": [
                            "sh",
                            "-c",
                            f"echo start >> log.txt; sleep {SLEEP_S}; echo end >> log.txt",
                        ]
                    },
                }
            ]
        },
        {"tool_calls": [{"name": "request_completion", "arguments": {"summary": "logged"}}]},
    ]
    path.write_text(json.dumps(turns), encoding="utf-8")
    return f"scripted:{path}"


def keel(ws: Path, *args: str, wait: bool = True) -> Any:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KEEL_")}
    env["KEEL_LEASE_TTL"] = "1"
    command = [KEEL, *args, "--store", f"sqlite:///{ws / 'store.db'}"]
    if not wait:
        return subprocess.Popen(
            command, cwd=ws, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True
        )
    return subprocess.run(
        command,
        cwd=ws,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def start_and_kill(ws: Path, sandbox: str) -> str:
    """Start a run whose command is mid-sleep, SIGKILL `keel run`, return the run id."""
    # Unconfined commands ask even in auto mode; the user's allow rule lets this one run.
    (ws / ".keel").mkdir(exist_ok=True)
    (ws / ".keel" / "policy.toml").write_text('[[rule]]\naction = "allow"\ntool = "run_command"\n')
    proc = keel(
        ws,
        "run",
        "log it",
        "--model",
        script(ws / "model.json"),
        "--mode",
        "auto",
        "--sandbox",
        sandbox,
        "--verify",
        "grep -q start log.txt",
        "--json",
        wait=False,
    )
    run_id = json.loads(proc.stdout.readline())["run_id"]
    deadline = time.monotonic() + 30
    while not (ws / "log.txt").exists() or not any(
        e.type is EventType.PROCESS_STARTED for e in events(ws, run_id)
    ):
        assert time.monotonic() < deadline, "the command never started"
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    proc.stdout.close()
    time.sleep(1.2)  # the dead process's lease lapses (KEEL_LEASE_TTL=1)
    return str(run_id)


def events(ws: Path, run_id: str) -> list[Any]:
    with open_store(f"sqlite:///{ws / 'store.db'}") as store:
        return store.read_events(run_id)


def finish(ws: Path, run_id: str) -> None:
    """Resume (it waits for a person), deny the re-run, resume to the end."""
    resumed = keel(ws, "resume", run_id)
    assert resumed.returncode == 3, resumed.stdout + resumed.stderr
    denied = keel(ws, "approve", run_id, "--deny", "--reason", "it already ran")
    assert denied.returncode == 0, denied.stderr
    done = keel(ws, "resume", run_id)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_command_left_running_is_waited_for_before_anyone_is_asked(tmp_path: Path) -> None:
    run_id = start_and_kill(tmp_path, "off")
    assert (tmp_path / "log.txt").read_text() == "start\n"  # still sleeping: not ended
    finish(tmp_path, run_id)
    assert (tmp_path / "log.txt").read_text() == "start\nend\n"  # ran once, to its end
    log = events(tmp_path, run_id)
    started = [e for e in log if e.type is EventType.PROCESS_STARTED]
    settled = [e for e in log if e.type is EventType.PROCESS_SETTLED]
    assert len(started) == 1 and started[0].data["pgid"] > 1
    assert [e.data["outcome"] for e in settled] == ["waited"]
    asked = [e for e in log if e.type is EventType.APPROVAL_REQUESTED]
    assert asked[0].data["kind"] == "unknown_outcome"
    assert asked[0].seq > settled[0].seq  # nobody was asked while it still ran
    assert "still running; the resume waited" in asked[0].data["why"]
    assert len([e for e in log if e.type is EventType.TOOL_STARTED]) == 1


def test_orphans_kill_policy_kills_the_command_on_resume(tmp_path: Path) -> None:
    (tmp_path / ".keel").mkdir()
    (tmp_path / ".keel" / "config.toml").write_text('[sandbox]\norphans = "kill"\n')
    run_id = start_and_kill(tmp_path, "off")
    finish(tmp_path, run_id)
    time.sleep(SLEEP_S)  # had it survived, it would have written "end" by now
    assert (tmp_path / "log.txt").read_text() == "start\n"
    settled = [e for e in events(tmp_path, run_id) if e.type is EventType.PROCESS_SETTLED]
    assert [e.data["outcome"] for e in settled] == ["killed"]


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
def test_a_sandboxed_command_dies_with_keel(tmp_path: Path) -> None:
    run_id = start_and_kill(tmp_path, "required")
    started = next(e for e in events(tmp_path, run_id) if e.type is EventType.PROCESS_STARTED)
    assert started.data["sandbox"] == "bubblewrap"
    finish(tmp_path, run_id)
    time.sleep(SLEEP_S)
    assert (tmp_path / "log.txt").read_text() == "start\n"  # killed with keel, never re-run
    settled = [e for e in events(tmp_path, run_id) if e.type is EventType.PROCESS_SETTLED]
    assert [e.data["outcome"] for e in settled] == ["gone"]
