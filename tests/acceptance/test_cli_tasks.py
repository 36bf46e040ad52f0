"""`keel tasks …` end to end: the real command in a subprocess, checked against the store."""

from __future__ import annotations

import getpass
import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from keel.cli.app import app
from keel.core.tasks import TaskStatus
from keel.store.sqlite.store import SQLiteStore

KEEL = str(Path(sys.executable).parent / "keel")


@dataclass(frozen=True)
class Outcome:
    returncode: int
    stdout: str
    stderr: str


Keel = Callable[..., Outcome]


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "keel.db"


@pytest.fixture
def keel(db: Path) -> Keel:
    """The `keel tasks` command, invoked in-process (the real app, parser and store)."""
    runner = CliRunner()

    def run(*args: str, agent: str | None = "agent-1", ok: bool = True) -> Outcome:
        env = {"KEEL_STORE": f"sqlite:///{db}", "KEEL_AGENT_ID": agent}
        result = runner.invoke(app, ["tasks", *args], env=env)
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            raise result.exception
        outcome = Outcome(result.exit_code, result.stdout, result.stderr)
        if ok:
            assert outcome.returncode == 0, outcome.stderr
        return outcome

    return run


def real_keel(db: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The installed `keel` executable in a subprocess, with no KEEL_AGENT_ID."""
    env = {k: v for k, v in os.environ.items() if k != "KEEL_AGENT_ID"}
    env["KEEL_STORE"] = f"sqlite:///{db}"
    return subprocess.run(
        [KEEL, "tasks", *args], env=env, capture_output=True, text=True, timeout=120, check=False
    )


def as_json(proc: Outcome) -> Any:
    return json.loads(proc.stdout)


def four_tasks(keel: Keel) -> dict[str, str]:
    database = keel("create", "create database").stdout.strip()
    api = keel("create", "write API", "--blocked-by", database).stdout.strip()
    tests = keel("create", "add tests", "--blocked-by", api).stdout.strip()
    docs = keel("create", "write docs", "--description", "user guide").stdout.strip()
    keel("block", docs, "--by", database)
    return {"database": database, "api": api, "tests": tests, "docs": docs}


def one_line_error(proc: Outcome | subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    return lines[0]


def test_four_task_example_from_the_command_line(keel: Keel, db: Path) -> None:
    ids = four_tasks(keel)
    ready = as_json(keel("list", "--ready", "--json"))
    assert [t["id"] for t in ready] == [ids["database"]]
    claimed = as_json(keel("claim", "--json", "--lease", "120"))
    assert (claimed["id"], claimed["owner"], claimed["attempt"]) == (ids["database"], "agent-1", 1)
    done = as_json(keel("complete", ids["database"], "--result", "schema v1", "--json"))
    assert {t["id"] for t in done["now_ready"]} == {ids["api"], ids["docs"]}
    text = keel("complete", ids["api"], ok=False)
    assert "not claimed by anyone" in one_line_error(text)
    keel("claim", ids["api"])
    out = keel("complete", ids["api"]).stdout
    assert f"now ready: {ids['tests']} add tests" in out

    store = SQLiteStore(db)
    database = store.get_task(ids["database"])
    assert (database.status, database.result, database.owner) == (
        TaskStatus.COMPLETED,
        "schema v1",
        "agent-1",
    )
    assert store.get_task(ids["docs"]).description == "user guide"
    assert store.get_task(ids["tests"]).ready
    store.close()


def test_show_prints_the_task_with_its_history(keel: Keel) -> None:
    ids = four_tasks(keel)
    keel("claim", ids["database"])
    keel("complete", ids["database"], "--result", "done")
    shown = as_json(keel("show", ids["database"], "--json"))
    assert shown["task"]["status"] == "completed"
    assert [(e["seq"], e["type"], e["actor"]) for e in shown["events"]] == [
        (1, "task_created", "agent-1"),
        (2, "task_claimed", "agent-1"),
        (3, "task_completed", "agent-1"),
    ]
    text = keel("show", ids["database"]).stdout
    assert "history:" in text and "task_completed by agent-1" in text and "result: done" in text


def test_owner_defaults_to_user_at_host_so_claim_and_complete_can_be_two_commands(
    db: Path,
) -> None:
    task = real_keel(db, "create", "fix typo").stdout.strip()
    assert real_keel(db, "claim", task).returncode == 0
    assert real_keel(db, "complete", task).returncode == 0
    again = real_keel(db, "complete", task)
    assert "is completed" in one_line_error(again)  # the real executable: exit 2, one line
    store = SQLiteStore(db)
    done = store.get_task(task)
    assert done.status is TaskStatus.COMPLETED
    assert done.owner == f"{getpass.getuser()}@{socket.gethostname()}"
    store.close()


def test_usage_errors_exit_2_with_one_line_naming_the_tasks(keel: Keel, db: Path) -> None:
    ids = four_tasks(keel)
    assert "task_00000000" in one_line_error(keel("show", "task_00000000", ok=False))
    cycle = one_line_error(keel("block", ids["database"], "--by", ids["tests"], ok=False))
    assert f"{ids['database']} -> {ids['tests']} -> {ids['api']} -> {ids['database']}" in cycle
    blocked = one_line_error(keel("claim", ids["tests"], ok=False))
    assert ids["api"] in blocked
    keel("claim", ids["database"], "--owner", "alice")
    not_owner = one_line_error(keel("complete", ids["database"], "--owner", "bob", ok=False))
    assert "owned by alice; bob cannot change it" in not_owner
    store = SQLiteStore(db)
    assert store.get_task(ids["database"]).blocked_by == ()  # the cycle wrote nothing
    assert store.get_task(ids["database"]).status is TaskStatus.IN_PROGRESS
    store.close()


def test_claim_with_nothing_ready_exits_1(keel: Keel) -> None:
    proc = keel("claim", ok=False)
    assert proc.returncode == 1 and "no task is ready" in proc.stderr
    assert as_json(keel("claim", "--json", ok=False)) is None


def test_failed_blocker_is_named_by_list_and_reopen_lets_work_go_on(keel: Keel) -> None:
    ids = four_tasks(keel)
    keel("claim", ids["database"])
    keel("fail", ids["database"], "--reason", "disk full")
    listed = {t["id"]: t for t in as_json(keel("list", "--json"))}
    assert listed[ids["api"]]["held_by_failed"] == [ids["database"]]
    assert listed[ids["database"]]["result"] == "disk full"
    rows = keel("list").stdout.splitlines()
    api_row = next(line for line in rows if line.lstrip().startswith(ids["api"]))
    assert "held by failed" in api_row  # the table row names the failed blocker
    assert ids["database"] in "".join(rows[rows.index(api_row) :][:3])
    assert "held by failed blocker" in keel("show", ids["api"]).stdout
    assert as_json(keel("list", "--status", "failed", "--json"))[0]["id"] == ids["database"]
    keel("reopen", ids["database"])
    again = as_json(keel("claim", "--json"))
    assert (again["id"], again["attempt"]) == (ids["database"], 2)


def test_idempotency_key_returns_the_same_task(keel: Keel) -> None:
    first = keel("create", "nightly", "--key", "nightly-7").stdout.strip()
    second = keel("create", "nightly again", "--key", "nightly-7").stdout.strip()
    assert first == second
    assert len(as_json(keel("list", "--json"))) == 1


def test_graph_draws_the_dag_as_text_and_as_mermaid(keel: Keel) -> None:
    ids = four_tasks(keel)
    keel("claim", ids["database"])
    text = keel("graph").stdout
    assert "4 tasks" in text
    for task_id in ids.values():
        assert task_id in text
    assert "in_progress" in text and "create database" in text
    mermaid = keel("graph", "--format", "mermaid").stdout.splitlines()
    assert mermaid[0] == "flowchart TD"
    assert f"    {ids['database']} --> {ids['api']}" in mermaid
    assert f"    {ids['api']} --> {ids['tests']}" in mermaid
    assert f"    {ids['database']} --> {ids['docs']}" in mermaid
    assert any(line.startswith("    classDef in_progress") for line in mermaid)
    edges = as_json(keel("graph", "--json"))["edges"]
    assert sorted(map(tuple, edges)) == sorted(
        [(ids["database"], ids["api"]), (ids["api"], ids["tests"]), (ids["database"], ids["docs"])]
    )
