"""Delegation across processes: a parent run in this process spawns children that several
``keel worker`` processes execute, on SQLite and on PostgreSQL.

The parent (a scripted model; ``child_slots=0``, so it never runs a background child
on a thread of its own) spawns one child in the foreground — which it executes inline,
holding the child's task — and four in the background, which two ``keel worker
--concurrency 2`` processes claim as tasks and execute. The children's model is the
FakeProvider over HTTP (``openai:fake-model``, 250 ms a turn), so each child's turns are
visible one by one. Shown: one run and one task per spawn; each task executed by exactly
one owner (the parent for the foreground child, a worker for each background one, both
workers taking part); each model turn of each child asked for exactly once; every
result recorded on the parent (``subagent_finished``) and the parent completed.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

import pytest

from keel.core.budget import Budget
from keel.core.events import EventType
from keel.core.status import RunStatus
from keel.core.tasks import TaskEventType, TaskStatus
from keel.models.base import ModelRequest, ModelTurn
from keel.runtime.harness import Harness
from keel.store.base import Store, iter_all_events
from keel.store.url import open_store
from keel.testing.agents import RelayModel, write_agent
from keel.testing.provider import FakeProvider
from keel.testing.stores import postgres_unavailable, scratch_database

KEEL = [sys.executable, "-m", "keel"]
TURN_DELAY_S = 0.25
BACKGROUND = 4
CHILD_TASK = re.compile(r"## Your task\s+(child \w+)")


@contextmanager
def backend(kind: str, tmp_path: Path) -> Iterator[str]:
    if kind == "sqlite":
        yield f"sqlite:///{tmp_path / 'keel.db'}"
        return
    if reason := postgres_unavailable():
        pytest.skip(f"PostgreSQL store not tested: {reason}")
    with scratch_database() as url:
        yield url


def child_turns(provider: FakeProvider) -> dict[str, int]:
    """Answer each child's conversation by its length: read a.txt, then finish. Returns
    the count of model requests per child (by the task named in its goal)."""
    asked: dict[str, int] = {}

    def respond(body: dict[str, Any]) -> None:
        messages = body.get("messages") or []
        user = next((str(m.get("content")) for m in messages if m.get("role") == "user"), "")
        found = CHILD_TASK.search(user)
        name = found.group(1) if found else "?"
        asked[name] = asked.get(name, 0) + 1
        turn = sum(1 for m in messages if m.get("role") == "assistant")
        if turn == 0:
            call: tuple[str, dict[str, Any]] = ("read_file", {"path": "a.txt"})
        else:
            call = ("request_completion", {"summary": f"{name} read a.txt"})
        provider.reply(tool_calls=[call], usage=(20, 5), delay=TURN_DELAY_S)

    provider.respond_with(respond)
    return asked


class GatedParent:
    """The parent's scripted model; before turn ``gate_step`` it waits (as a slow model
    would) until every background child's task has been claimed by someone, so the
    workers — not the parent's ``agent_wait`` — take each one."""

    def __init__(self, relay: RelayModel, store: Store, gate_step: int) -> None:
        self.relay = relay
        self.spec = relay.spec
        self.store = store
        self.gate_step = gate_step
        self.gate_opened = threading.Event()

    def complete(self, request: ModelRequest) -> ModelTurn:
        if request.step == self.gate_step:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                tasks = [t for t in self.store.list_tasks() if (t.options or {}).get("background")]
                if len(tasks) == BACKGROUND and all(
                    t.status is not TaskStatus.PENDING for t in tasks
                ):
                    self.gate_opened.set()
                    break
                time.sleep(0.02)
        return self.relay.complete(request)


def spawn(task: str, **more: Any) -> dict[str, Any]:
    return {"name": "agent_spawn", "arguments": {"agent": "finder", "task": task, **more}}


PARENT_SCRIPT: list[dict[str, Any]] = [
    {"tool_calls": [spawn("child fg: what does a.txt say?")]},
    {
        "tool_calls": [
            spawn(f"child bg{i}: what does a.txt say?", background=True) for i in range(BACKGROUND)
        ]
    },
    {
        "tool_calls": [
            {
                "name": "agent_wait",
                "arguments": {
                    "ids": [f"{{task{i}}}" for i in range(BACKGROUND)],
                    "timeout_seconds": 60,
                },
            }
        ]
    },
    {"tool_calls": [{"name": "request_completion", "arguments": {"summary": "all read"}}]},
]


def start_worker(url: str, owner: str, cwd: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    command = [*KEEL, "worker", "--store", url, "--concurrency", "2", "--poll", "0.1"]
    return subprocess.Popen(
        [*command, "--owner", owner],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_until_ready(proc: subprocess.Popen[str]) -> None:
    """Until the worker says it is serving (its first words on stderr, before its slots
    start; the console may wrap them)."""
    assert proc.stderr is not None
    said = ""
    while "slots)" not in said:
        line = proc.stderr.readline()
        assert line, said + proc.stderr.read()
        said += line


def stop_workers(workers: list[subprocess.Popen[str]]) -> list[str]:
    errors = []
    for proc in workers:
        proc.send_signal(signal.SIGTERM)
    for proc in workers:
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        errors.append(err)
    return errors


def executor_of(store: Store, task_id: str, child_id: str) -> str:
    """The one owner that executed the task's run: the task's history after its run was
    linked is either [completed] (the linking owner ran it) or [released, claimed,
    completed] (the claimer ran it); heartbeats aside, nothing else is allowed."""
    events = [e for e in store.task_events(task_id) if e.type != TaskEventType.HEARTBEAT.value]
    kinds = [e.type for e in events]
    assert kinds.count(TaskEventType.RUN_LINKED.value) == 1, kinds
    linked = kinds.index(TaskEventType.RUN_LINKED.value)
    assert events[linked].data["run_id"] == child_id
    claims = [e for e in events[:linked] if e.type == TaskEventType.CLAIMED.value]
    after = kinds[linked + 1 :]
    if after == [TaskEventType.COMPLETED.value]:
        return str(claims[-1].data["owner"])
    assert after == [
        TaskEventType.RELEASED.value,
        TaskEventType.CLAIMED.value,
        TaskEventType.COMPLETED.value,
    ], kinds
    return str(events[linked + 2].data["owner"])


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_children_run_exactly_once_across_worker_processes(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("hello world\n")
    write_agent(
        ws,
        "finder",
        model="openai:fake-model",
        tools=["read_file"],
        workspace_kind="shared-readonly",
        budget={"steps": 6},
    )
    with backend(kind, tmp_path) as url, FakeProvider() as provider:
        asked = child_turns(provider)
        env = {
            "OPENAI_API_KEY": "sk-test",
            "OPENAI_BASE_URL": provider.base_url,
            "XDG_CACHE_HOME": str(tmp_path / "cache"),
            "KEEL_LEASE_TTL": "10",
        }
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        worker_env = {**os.environ, **env}
        workers = [start_worker(url, f"w{i}", tmp_path, worker_env) for i in range(2)]
        try:
            for proc in workers:  # both serve before any child exists: both take some
                wait_until_ready(proc)
            watch = open_store(url)
            parent_model = GatedParent(RelayModel(PARENT_SCRIPT), watch, gate_step=2)
            harness = Harness(store=url, model=parent_model, child_slots=0)
            with harness, closing(watch):
                out = harness.run("read a.txt five times", cwd=ws, budget=Budget(max_steps=20))
                store = harness.store
                assert out.status is RunStatus.COMPLETED, out.stop_reason
                assert parent_model.gate_opened.is_set(), "the workers never took the children"

                spawned = [
                    e
                    for e in iter_all_events(store, out.id)
                    if e.type is EventType.SUBAGENT_SPAWNED
                ]
                finished = [
                    e
                    for e in iter_all_events(store, out.id)
                    if e.type is EventType.SUBAGENT_FINISHED
                ]
                children = store.child_runs(out.id)
                # one run and one task per spawn; every result recorded on the parent once
                assert len(spawned) == len(children) == 1 + BACKGROUND
                assert sorted(e.data["child_run_id"] for e in spawned) == sorted(
                    c.run_id for c in children
                )
                assert sorted(e.data["child_run_id"] for e in finished) == sorted(
                    c.run_id for c in children
                )
                assert {e.data["status"] for e in finished} == {"completed"}
                assert len({e.data["task_id"] for e in spawned}) == len(spawned)

                executors: dict[str, str] = {}
                for event in spawned:
                    child_id, task_id = event.data["child_run_id"], event.data["task_id"]
                    child = store.load_run(child_id)
                    assert child.status is RunStatus.COMPLETED, (child_id, child.reason)
                    assert child.task_id == task_id
                    task = store.get_task(task_id)
                    assert task.status is TaskStatus.COMPLETED and task.run_id == child_id
                    key = child_id if event.data["background"] else "child fg"
                    executors[key] = executor_of(store, task_id, child_id)
                    log = list(iter_all_events(store, child_id))
                    kinds = [e.type for e in log]
                    # driven once, from start to end: never resumed or taken over
                    assert EventType.RUN_RESUMED not in kinds, kinds
                    assert EventType.LEASE_TAKEN_OVER not in kinds, kinds
                    started = [
                        e
                        for e in log
                        if e.type is EventType.STATUS_CHANGED and e.data.get("to") == "running"
                    ]
                    assert len(started) == 1
                    assert kinds.count(EventType.MODEL_RESPONDED) == 2

                # the foreground child ran inline in this process, each background child
                # in a worker, and both workers took part
                assert executors.pop("child fg") == harness.owner
                owners = {owner.split("/")[0] for owner in executors.values()}
                assert owners == {"w0", "w1"}, executors
                # each child's two model turns were asked for exactly once
                assert asked == {
                    "child fg": 2,
                    **{f"child bg{i}": 2 for i in range(BACKGROUND)},
                }
                # the parent saw every background result in agent_wait
                waited = next(
                    e
                    for e in iter_all_events(store, out.id)
                    if e.type is EventType.TOOL_FINISHED and e.data.get("call_id") == "call_2_0"
                )
                results = json.loads(waited.data["output"])["results"]
                assert [r["status"] for r in results] == ["completed"] * BACKGROUND
                assert out.state.usage.tokens >= (1 + BACKGROUND) * 2 * 25
        finally:
            errors = stop_workers(workers)
        for err in errors:
            assert "Traceback" not in err, err
