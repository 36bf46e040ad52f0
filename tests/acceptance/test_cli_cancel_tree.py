"""`keel cancel` on a run tree, end to end: the real ``keel`` executable cancels the run and
every live descendant, and prints what the tree already did (it stays on record)."""

from __future__ import annotations

import json
from pathlib import Path

from keel.core.events import EventType, NewEvent
from keel.core.state import RunState
from keel.core.status import RunStatus
from keel.store.sqlite.store import SQLiteStore
from keel.testing.cli import KeelWorkspace
from keel.testing.stores import append, make_run, move


def started(call_id: str, tool: str, effect: str, arguments: dict[str, object]) -> NewEvent:
    return NewEvent(
        type=EventType.TOOL_STARTED,
        data={"call_id": call_id, "tool": tool, "arguments": arguments, "effect": effect},
    )


def finished(call_id: str, tool: str) -> NewEvent:
    return NewEvent(
        type=EventType.TOOL_FINISHED,
        data={"call_id": call_id, "tool": tool, "output": "ok", "changed_files": {}},
    )


def tree(store: SQLiteStore) -> tuple[RunState, RunState, RunState, RunState]:
    """A parent; a running child that wrote a file and started a command; a child that
    already completed; and a queued grandchild under the running child."""
    parent = make_run(store, goal="ship the feature")
    child = make_run(store, parent_id=parent.run_id, goal="write the code")
    append(
        store,
        child,
        [
            started("call_1", "write_file", "write", {"path": "src/app.py", "content": "x"}),
            finished("call_1", "write_file"),
            started("call_2", "run_command", "execute", {"argv": ["pytest", "-q"]}),
            started("call_3", "read_file", "read", {"path": "README.md"}),
        ],
    )
    done = make_run(store, parent_id=parent.run_id, goal="look around")
    done, _ = append(store, done, [move(done, RunStatus.VERIFYING, "finish")])
    done, _ = append(store, done, [move(done, RunStatus.COMPLETED, "verified")])
    grandchild = make_run(store, parent_id=child.run_id, queued=True, goal="review")
    return parent, child, done, grandchild


def test_cancel_prints_the_descendants_and_what_stays_on_record(tmp_path: Path) -> None:
    ws = KeelWorkspace(tmp_path, store_url=f"sqlite:///{tmp_path / 'keel.db'}")
    store = SQLiteStore(tmp_path / "keel.db")
    try:
        parent, child, done, grandchild = tree(store)
        result = ws.keel("cancel", parent.run_id, "--reason", "wrong goal")
        assert result.returncode == 0, result.stderr
        lines = result.stdout.splitlines()
        assert lines[0] == f"run {parent.run_id} is cancelled"
        assert lines[1] == (
            f"  descendants cancelled (parent_cancelled): {child.run_id}, {grandchild.run_id}"
        )
        assert lines[2] == "  already done, stays on record:"
        assert lines[3:] == [
            f"    {child.run_id} call_1 write_file (write) finished: src/app.py",
            f"    {child.run_id} call_2 run_command (execute) started, outcome unknown: pytest -q",
        ]
        for run_id in (child.run_id, grandchild.run_id):
            state = store.load_run(run_id)
            assert (state.status, state.reason) == (RunStatus.CANCELLED, "parent_cancelled")
        assert store.load_run(parent.run_id).reason == "wrong goal"
        assert store.load_run(done.run_id).status is RunStatus.COMPLETED

        again = ws.keel("cancel", parent.run_id, "--reason", "twice")
        assert again.returncode == 2
        assert again.stderr.count("\n") == 1 and "cancelled is terminal" in again.stderr
    finally:
        store.close()


def test_cancel_json_prints_the_report(tmp_path: Path) -> None:
    ws = KeelWorkspace(tmp_path, store_url=f"sqlite:///{tmp_path / 'keel.db'}")
    store = SQLiteStore(tmp_path / "keel.db")
    try:
        parent, child, _done, grandchild = tree(store)
        lone = make_run(store)
    finally:
        store.close()
    result = ws.keel("cancel", parent.run_id, "--reason", "wrong goal", "--json")
    assert result.returncode == 0, result.stderr
    (line,) = result.stdout.splitlines()
    report = json.loads(line)
    assert report["run_id"] == parent.run_id
    assert (report["status"], report["reason"]) == ("cancelled", "wrong goal")
    assert report["cancelled"] == [child.run_id, grandchild.run_id]
    assert [(e["call_id"], e["outcome"], e["summary"]) for e in report["side_effects"]] == [
        ("call_1", "finished", "src/app.py"),
        ("call_2", "started, outcome unknown", "pytest -q"),
    ]
    assert report["side_effects"][0]["run_id"] == child.run_id
    assert report["tasks_cancelled"] == [] and report["tasks_left"] == {}

    plain = ws.keel("cancel", lone.run_id, "--reason", "not needed")
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.splitlines() == [
        f"run {lone.run_id} is cancelled",
        "  already done, stays on record: nothing",
    ]
