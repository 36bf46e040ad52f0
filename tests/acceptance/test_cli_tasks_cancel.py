"""Cancelling tasks end to end: `keel tasks cancel`, the `cancel_task` tool, what dependants
say, and a cancelled run giving back the tasks it claimed — the real `keel` executable in
subprocesses, checked against the store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from keel.core.status import RunStatus
from keel.core.tasks import TaskStatus
from keel.runtime.harness import Harness
from keel.store.sqlite.store import SQLiteStore
from keel.testing import ScriptedModel
from keel.testing.cli import KeelWorkspace, call, expect, flat, one_line_error, turn

KEEL = str(Path(sys.executable).with_name("keel"))


def tasks(db: Path, *args: str, agent: str = "lead") -> subprocess.CompletedProcess[str]:
    """`keel tasks ARGS` as ``agent`` on the SQLite store ``db``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KEEL_")}
    env.update(KEEL_STORE=f"sqlite:///{db}", KEEL_AGENT_ID=agent, COLUMNS="250")
    return subprocess.run(
        [KEEL, "tasks", *args], env=env, capture_output=True, text=True, timeout=60, check=False
    )


def created(db: Path, subject: str, *blockers: str) -> str:
    args = [arg for b in blockers for arg in ("--blocked-by", b)]
    return expect(tasks(db, "create", subject, *args), 0).strip()


def as_json(proc: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(expect(proc, 0))


def test_cancel_reaches_cancelled_and_dependants_say_they_can_never_be_claimed(
    tmp_path: Path,
) -> None:
    db = tmp_path / "keel.db"
    database = created(db, "create database")
    api = created(db, "write API", database)
    tests = created(db, "add tests", api)

    out = expect(tasks(db, "cancel", database, "--reason", "we use a hosted database"), 0)
    assert f"{database} cancelled: we use a hosted database" in out
    assert f"{api} can never be claimed now" in out

    listed = {t["id"]: t for t in as_json(tasks(db, "list", "--json"))}
    assert listed[database]["status"] == "cancelled"
    assert listed[api]["held_by_cancelled"] == [database]
    assert listed[api]["blocked_for_good"] is True
    assert listed[tests]["blocked_for_good"] is False  # it waits on the API
    table = flat(expect(tasks(db, "list"), 0))
    assert f"blocked by {database} (cancelled)" in table and "can never be claimed" in table
    shown = flat(expect(tasks(db, "show", api), 0))
    assert f"waiting on: blocked by {database} (cancelled)" in shown
    assert "reopen" not in shown  # no hint to reopen: a cancelled task stays cancelled
    history = flat(expect(tasks(db, "show", database), 0))
    assert "cancelled because: we use a hosted database" in history
    assert "task_cancelled by lead reason=we use a hosted database" in history
    graph = flat(expect(tasks(db, "graph"), 0))
    assert f"{api} write API — blocked by {database} (cancelled)" in graph

    refused = one_line_error(tasks(db, "claim", api, agent="bob"))
    assert f"{api} cannot be claimed: blocked by {database} (cancelled)" in refused
    assert "can never be claimed" in refused
    nothing = tasks(db, "claim", agent="bob")
    assert nothing.returncode == 1 and "no task is ready" in nothing.stderr  # never waits on it


def test_who_may_cancel_owner_rules_and_refusals_are_one_line(tmp_path: Path) -> None:
    db = tmp_path / "keel.db"
    held = created(db, "deploy")
    expect(tasks(db, "claim", held, agent="alice"), 0)
    not_owner = one_line_error(tasks(db, "cancel", held, "--reason", "stop", agent="bob"))
    assert f"task {held} is owned by alice; bob cannot change it" in not_owner
    cancelled = as_json(
        tasks(db, "cancel", held, "--reason", "rolled back", "--json", agent="alice")
    )
    assert (cancelled["task"]["status"], cancelled["task"]["owner"]) == ("cancelled", "alice")

    again = one_line_error(tasks(db, "cancel", held, "--reason", "twice"))
    assert f"task {held} is cancelled" in again
    blank = one_line_error(tasks(db, "cancel", created(db, "x"), "--reason", " "))
    assert "needs a reason" in blank
    unknown = one_line_error(tasks(db, "cancel", "task_00000000", "--reason", "x"))
    assert "task_00000000" in unknown
    missing = tasks(db, "cancel", held)  # --reason is required
    assert missing.returncode == 2 and "--reason" in missing.stderr

    store = SQLiteStore(db)
    try:
        assert [e.type for e in store.task_events(held)][-1] == "task_cancelled"
        assert (
            len(store.task_events(held)) == 3
        )  # created, claimed, cancelled: refusals wrote nothing
    finally:
        store.close()


def test_the_cancel_task_tool_acts_as_the_run_under_the_same_rules(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "keel.db")
    spare = store.create_task("spare idea", actor="lead")
    mine = store.create_task("refactor", actor="lead")
    theirs = store.create_task("release", actor="lead")
    assert store.claim_task(owner="alice", lease_seconds=600, task_id=theirs.id) is not None
    turns = [
        {
            "tool_calls": [
                {"name": "cancel_task", "arguments": {"task_id": spare.id, "reason": "dup"}}
            ]
        },
        {"tool_calls": [{"name": "claim_task", "arguments": {"task_id": mine.id}}]},
        {
            "tool_calls": [
                {"name": "cancel_task", "arguments": {"task_id": mine.id, "reason": "moot"}}
            ]
        },
        {
            "tool_calls": [
                {"name": "cancel_task", "arguments": {"task_id": theirs.id, "reason": "x"}}
            ]
        },
        {"tool_calls": [{"name": "cancel_task", "arguments": {"task_id": spare.id}}]},
        {"content": "tidied up"},
    ]
    harness = Harness(store=store, model=ScriptedModel(turns))
    outcome = harness.run("tidy the task list", cwd=tmp_path)
    assert outcome.status is RunStatus.COMPLETED
    results = [
        e.data
        for e in harness.events(outcome.id)
        if e.type.value in ("tool_finished", "tool_failed")
    ]
    assert json.loads(results[0]["output"])["status"] == "cancelled"
    assert json.loads(results[2]["output"])["status"] == "cancelled"
    assert results[3]["error_kind"] == "tool_error"  # someone else's claim
    assert "owned by alice" in results[3]["message"]
    assert results[4]["error_kind"] == "invalid_arguments"  # a reason is required
    run_owner = f"run:{outcome.id}"
    assert [e.actor for e in store.task_events(spare.id)][-1] == run_owner
    assert store.get_task(mine.id).status is TaskStatus.CANCELLED
    assert store.get_task(theirs.id).status is TaskStatus.IN_PROGRESS  # untouched
    store.close()


def test_keel_cancel_of_a_waiting_run_gives_back_the_tasks_it_claimed(tmp_path: Path) -> None:
    ws = KeelWorkspace(tmp_path)
    store = SQLiteStore(tmp_path / ".keel" / "keel.db")
    task = store.create_task("write the changelog", actor="lead")
    store.close()
    model = ws.script(
        turn(call("claim_task", task_id=task.id)),
        turn(call("ask_user", question="which release?")),
    )
    run_id, result = ws.start("write the changelog", "--model", model)
    expect(result, 3)  # waiting for the answer; the claim is kept meanwhile
    held = json.loads(expect(ws.keel("tasks", "show", task.id, "--json"), 0))["task"]
    assert (held["status"], held["owner"]) == ("in_progress", f"run:{run_id}")

    expect(ws.keel("cancel", run_id, "--reason", "release postponed"), 0)
    shown = json.loads(expect(ws.keel("tasks", "show", task.id, "--json"), 0))
    assert (shown["task"]["status"], shown["task"]["owner"]) == ("pending", None)
    last = shown["events"][-1]
    assert (last["type"], last["actor"]) == ("task_released", f"run:{run_id}")
    assert f"run {run_id} ended cancelled (release postponed)" in last["data"]["reason"]
    assert ws.state(run_id).status is RunStatus.CANCELLED
