"""Limits and process trees of sandboxed calls: fork bombs, CPU, file size, memory, orphans.

Real programs, real signals. Processes are found on the host by a random token in
their command line (a pid printed inside a pid namespace would mean nothing here).
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from keel.sandbox.base import Sandbox, SandboxSettings
from keel.sandbox.bubblewrap import probe_bubblewrap
from keel.sandbox.choose import open_sandbox
from keel.tools import ToolContext, ToolResult, default_registry

PY = sys.executable
MakeSandbox = Callable[..., Sandbox]


@pytest.fixture(scope="module")
def bwrap() -> str:
    path = shutil.which("bwrap")
    if path is None:
        pytest.skip("bubblewrap is not installed (apt-get install bubblewrap): skipped")
    probe = probe_bubblewrap(path)
    if not probe.works:
        pytest.skip(f"bubblewrap does not work here ({probe.reason}): skipped")
    return path


@pytest.fixture(params=["bubblewrap", "none"])
def make_any_sandbox(request: pytest.FixtureRequest) -> MakeSandbox:
    """Both kinds: bubblewrap (skipped without it) and the unconfined fallback."""
    if request.param == "bubblewrap":
        request.getfixturevalue("bwrap")
    mode = "required" if request.param == "bubblewrap" else "off"

    def make(**settings: Any) -> Sandbox:
        return open_sandbox(SandboxSettings(mode=mode, **settings))

    return make


@pytest.fixture
def make_sandbox(bwrap: str) -> MakeSandbox:
    def make(**settings: Any) -> Sandbox:
        return open_sandbox(SandboxSettings(mode="required", **settings))

    return make


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    return root.resolve()


def run(sandbox: Sandbox, ws: Path, argv: list[str], timeout: float = 30) -> ToolResult:
    ctx = ToolContext(workspace=ws, run_id="r", call_id="c", owner="o", sandbox=sandbox)
    args = {"argv": argv, "timeout_seconds": timeout}
    return default_registry().execute("run_command", args, ctx)


def token() -> str:
    """A number no other process has in its command line (sleep accepts it)."""
    return f"{random.randrange(100, 999)}.{random.randrange(10**9):09d}"


def running_with(mark: str) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmdline = f.read()
            with open(f"/proc/{name}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if mark.encode() in cmdline and state != "Z":
            found.append(int(name))
    return found


def gone(mark: str, within: float = 5.0) -> bool:
    deadline = time.monotonic() + within
    while running_with(mark):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


BOMB = """
import os, sys, time
# {mark}
refused = False
while True:
    try:
        os.fork()
    except OSError:
        if not refused:
            refused = True
            print("fork refused", flush=True)
        time.sleep(0.05)
"""


def test_a_fork_bomb_is_contained_and_nothing_survives(
    make_any_sandbox: MakeSandbox, ws: Path
) -> None:
    sandbox = make_any_sandbox(processes=16)
    if sandbox.describe()["processes"]["enforced_by"] == "none":
        pytest.skip("no process limit can be enforced here (root without a writable pids cgroup)")
    mark = token()
    started = time.monotonic()
    result = run(sandbox, ws, [PY, "-c", BOMB.format(mark=mark)], timeout=3)
    assert time.monotonic() - started < 15
    assert result.data["timed_out"] is True
    assert "fork refused" in result.output
    assert gone(mark)


def test_cpu_time_limit_stops_a_busy_loop(make_any_sandbox: MakeSandbox, ws: Path) -> None:
    started = time.monotonic()
    result = run(make_any_sandbox(cpu_seconds=1), ws, [PY, "-c", "while True: pass"], timeout=20)
    assert time.monotonic() - started < 10 and result.data["timed_out"] is False
    assert result.data["exit_code"] in (128 + signal.SIGXCPU, -signal.SIGXCPU, 137, -9)


def test_file_size_limit_stops_a_large_write(make_any_sandbox: MakeSandbox, ws: Path) -> None:
    result = run(
        make_any_sandbox(file_size_mb=1), ws, ["sh", "-c", "head -c 3000000 /dev/zero > big.bin"]
    )
    assert result.data["exit_code"] != 0
    assert (ws / "big.bin").stat().st_size <= 1024 * 1024


def test_memory_limit_refuses_a_large_allocation(make_any_sandbox: MakeSandbox, ws: Path) -> None:
    code = "b = bytearray(400 * 1024 * 1024); print('allocated')"
    result = run(make_any_sandbox(memory_mb=128), ws, [PY, "-c", code])
    assert "MemoryError" in result.output and "\nallocated" not in result.output


def test_processes_left_running_are_killed_when_the_call_ends(
    make_any_sandbox: MakeSandbox, ws: Path
) -> None:
    mark = token()
    script = f'setsid sh -c "sleep {mark}" >/dev/null 2>&1 < /dev/null & echo started'
    result = run(make_any_sandbox(), ws, ["sh", "-c", script])
    assert result.data["exit_code"] == 0 and "started" in result.output
    assert gone(mark, within=2)


def test_a_timeout_kills_the_whole_tree(make_any_sandbox: MakeSandbox, ws: Path) -> None:
    mark = token()
    script = f"setsid sleep {mark} & sleep {mark} & wait"
    started = time.monotonic()
    result = run(make_any_sandbox(), ws, ["sh", "-c", script], timeout=1)
    assert result.data["timed_out"] is True and time.monotonic() - started < 10
    assert gone(mark, within=2)


def test_a_command_that_closes_its_output_is_still_bound_by_its_timeout(
    make_any_sandbox: MakeSandbox, ws: Path
) -> None:
    mark = token()
    started = time.monotonic()
    result = run(make_any_sandbox(), ws, ["sh", "-c", f"exec >/dev/null 2>&1; sleep {mark}"], 1)
    assert result.data["timed_out"] is True and time.monotonic() - started < 10
    assert gone(mark, within=2)


INTERRUPTED = """
import sys
from pathlib import Path
from keel.sandbox.base import SandboxSettings
from keel.sandbox.choose import open_sandbox
from keel.tools import ToolContext, default_registry

ws, mark, mode = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
sandbox = open_sandbox(SandboxSettings(mode=mode))
ctx = ToolContext(workspace=ws, run_id="r", call_id="c", owner="o", sandbox=sandbox)
script = f'setsid sleep {mark} & echo up > up.txt; sleep {mark}'
default_registry().execute("run_command", {"argv": ["sh", "-c", script]}, ctx)
"""


def test_ctrl_c_in_keel_kills_the_whole_tree(make_any_sandbox: MakeSandbox, ws: Path) -> None:
    mark = token()
    mode = "off" if make_any_sandbox().kind == "none" else "required"
    keel = subprocess.Popen([PY, "-c", INTERRUPTED, str(ws), mark, mode], stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 20
        while not (ws / "up.txt").exists() or len(running_with(mark)) < 2:
            assert time.monotonic() < deadline and keel.poll() is None
            time.sleep(0.05)
        keel.send_signal(signal.SIGINT)
        _, err = keel.communicate(timeout=20)
        assert b"KeyboardInterrupt" in err
        assert gone(mark, within=2), running_with(mark)
    finally:
        if keel.poll() is None:
            keel.kill()
        for pid in running_with(mark):
            os.kill(pid, signal.SIGKILL)


KEEL_SIDE = """
import subprocess, sys, time
from pathlib import Path
from keel.sandbox.base import Confinement, SandboxSettings
from keel.sandbox.choose import open_sandbox

ws, mark = Path(sys.argv[1]), sys.argv[2]
sandbox = open_sandbox(SandboxSettings(mode="required"))
script = f'setsid sh -c "echo up > daemon.txt; exec sleep {mark}" >/dev/null 2>&1 & sleep {mark}'
proc = sandbox.popen(["sh", "-c", script], Confinement(workspace=ws),
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print(proc.pid, flush=True)
proc.wait()
"""


def test_the_tree_dies_when_keel_is_killed(make_sandbox: MakeSandbox, ws: Path) -> None:
    mark = token()
    keel = subprocess.Popen([PY, "-c", KEEL_SIDE, str(ws), mark], stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while not (ws / "daemon.txt").exists() or len(running_with(mark)) < 2:
            assert time.monotonic() < deadline and keel.poll() is None
            time.sleep(0.05)
        keel.kill()  # SIGKILL: no cleanup code of Keel's runs
        keel.wait()
        assert gone(mark, within=5), running_with(mark)
    finally:
        if keel.poll() is None:
            keel.kill()
        for pid in running_with(mark):
            os.kill(pid, signal.SIGKILL)
        if keel.stdout is not None:
            keel.stdout.close()
