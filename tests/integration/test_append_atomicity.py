"""A step's events are stored whole or not at all, whatever instant of the append a
SIGKILL hits: at each fault point inside the SQLite write transaction (head advanced,
first event written, all written, committed) a real `keel run` is killed at its 2nd
and 3rd append; the log that survives is a gapless prefix of the never-killed run's
log ending at a step boundary, its snapshot is the fold of its events, its hash chain
verifies, and `keel resume` finishes the run without writing the file twice.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from keel.core.events import Event, EventType
from keel.core.state import RunState
from keel.core.status import RunStatus
from keel.store.url import open_store

KEEL = str(Path(sys.executable).with_name("keel"))
SCRIPT: list[dict[str, Any]] = [
    {
        "tool_calls": [
            {
                "name": "todo_write",
                "arguments": {"todos": [{"content": "say bye", "status": "in_progress"}]},
            }
        ]
    },
    {"tool_calls": [{"name": "write_file", "arguments": {"path": "a.txt", "content": "bye\n"}}]},
    {"tool_calls": [{"name": "request_completion", "arguments": {"summary": "a.txt says bye"}}]},
]
POINTS = ("append_head_advanced", "append_mid_events", "append_rows_written", "append_committed")


def keel(root: Path, url: str, *args: str, fault: str | None = None) -> Any:
    env = {k: v for k, v in os.environ.items() if k != "KEEL_FAULT"}
    env["KEEL_LEASE_TTL"] = "1"
    if fault:
        env["KEEL_FAULT"] = fault
    return subprocess.run(
        [KEEL, *args, "--store", url],
        cwd=root,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def start(tmp_path: Path, name: str, fault: str | None) -> tuple[Path, str, str, Any]:
    root = tmp_path / name
    root.mkdir()
    script = root.parent / f"{name}.json"
    script.write_text(json.dumps(SCRIPT))
    url = f"sqlite:///{root.parent / (name + '.db')}"
    args = ("run", "say bye", "--model", f"scripted:{script}", "--verify", "grep -q bye a.txt")
    proc = keel(root, url, *args, "--json", fault=fault)
    run_id = str(json.loads(proc.stdout.splitlines()[0])["run_id"])
    return root, url, run_id, proc


def events_of(url: str, run_id: str) -> list[Event]:
    with open_store(url) as store:
        return list(store.read_events(run_id))


def shape(events: list[Event]) -> list[tuple[str, str]]:
    """What must match between two runs of the same script (ids and times differ)."""
    return [(e.type.value, str(sorted(e.data))) for e in events]


@pytest.fixture(scope="module")
def boundaries(tmp_path_factory: pytest.TempPathFactory) -> dict[int, int]:
    """How many events are stored once append K committed (K = 0: before any append)."""
    tmp = tmp_path_factory.mktemp("reference")
    found: dict[int, int] = {}
    _, url, run_id, done = start(tmp, "reference", None)
    assert done.returncode == 0, done.stderr
    found[-1] = len(events_of(url, run_id))  # the whole run
    for k in (1, 2, 3):
        _, url, run_id, killed = start(tmp, f"committed-{k}", f"append_committed:{k}")
        assert killed.returncode == -signal.SIGKILL, killed.stderr
        found[k] = len(events_of(url, run_id))
    assert found[1] < found[2] < found[3] < found[-1]
    return found


@pytest.mark.parametrize("point", POINTS)
@pytest.mark.parametrize("k", [2, 3])
def test_a_step_is_stored_whole_or_not_at_all_when_killed_inside_its_append(
    tmp_path: Path, boundaries: dict[int, int], point: str, k: int
) -> None:
    root, url, run_id, killed = start(tmp_path, "run", f"{point}:{k}")
    assert killed.returncode == -signal.SIGKILL, killed.stderr

    events = events_of(url, run_id)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))  # gapless
    expected = boundaries[k] if point == "append_committed" else boundaries[k - 1]
    assert len(events) == expected, (point, k, [e.type.value for e in events])
    with open_store(url) as store:
        stored = store.load_run(run_id)
    assert RunState.from_events(events).to_dict() == stored.to_dict()
    verified = keel(root, url, "verify", run_id)
    assert verified.returncode == 0, verified.stdout + verified.stderr

    if point == "append_mid_events":  # and the run goes on from there, once
        resumed = keel(root, url, "resume", run_id, "--json")
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr
        final = events_of(url, run_id)
        state = RunState.from_events(final)
        assert state.status is RunStatus.COMPLETED
        writes = [
            e
            for e in final
            if e.type is EventType.TOOL_FINISHED and e.data.get("tool") == "write_file"
        ]
        assert len(writes) == 1 and (root / "a.txt").read_text() == "bye\n"
