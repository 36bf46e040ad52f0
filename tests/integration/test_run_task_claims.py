"""A run's task claims live as long as the run: renewed by its heartbeat, given back at its end.

Both stores, real runs (the Harness with a scripted model), real time: the claim lease
is 1 s (``KEEL_TASK_LEASE``) and the run's heartbeat beats every 0.2 s.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from keel.core.budget import Budget
from keel.core.errors import ConfigError
from keel.core.events import EventType
from keel.core.status import RunStatus
from keel.core.tasks import Task, TaskEventType, TaskStatus
from keel.models.base import ModelRequest, ModelTurn
from keel.runtime.harness import Harness, RunOutcome
from keel.store.base import Store
from keel.testing import ScriptedModel
from keel.testing.cli import KeelWorkspace, expect, one_line_error
from keel.testing.stores import STORE_BACKENDS, postgres_unavailable
from keel.testing.tasks import assert_history_reproduces

CLAIM_LEASE_S = "1"  # KEEL_TASK_LEASE: what a run's claim lasts past its last renewal
RUN_LEASE_S = 0.6  # the run's own lease: its heartbeat beats every 0.2 s


@pytest.fixture(params=sorted(STORE_BACKENDS))
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "postgres" and (reason := postgres_unavailable()):
        pytest.skip(f"PostgreSQL store not tested: {reason}")
    with STORE_BACKENDS[request.param](tmp_path / "store") as backend:
        yield backend


@pytest.fixture(autouse=True)
def short_claims(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KEEL_TASK_LEASE", CLAIM_LEASE_S)


class SlowModel:
    """A scripted model whose turn ``slow_step`` takes ``seconds`` (a slow provider)."""

    def __init__(self, turns: Sequence[Mapping[str, Any]], *, slow_step: int, seconds: float):
        self._script = ScriptedModel(turns)
        self.spec = self._script.spec
        self._slow_step = slow_step
        self._seconds = seconds

    def complete(self, request: ModelRequest) -> ModelTurn:
        if request.step == self._slow_step:
            time.sleep(self._seconds)
        return self._script.complete(request)


def call(name: str, **arguments: object) -> dict[str, object]:
    return {"tool_calls": [{"name": name, "arguments": arguments}]}


def tool_outputs(harness: Harness, run_id: str) -> list[dict[str, Any]]:
    return [
        e.data
        for e in harness.events(run_id)
        if e.type in (EventType.TOOL_FINISHED, EventType.TOOL_FAILED)
    ]


def run(
    store: Store, workspace: Path, turns: Sequence[Mapping[str, Any]], **options: Any
) -> RunOutcome:
    harness = Harness(store=store, model=ScriptedModel(turns), lease_ttl=RUN_LEASE_S)
    return harness.run("work the task graph", cwd=workspace, **options)


def assert_released_by_ended_run(store: Store, task: Task, outcome: RunOutcome) -> str:
    """``task`` went back to pending, its history naming the run and how it ended, and
    anyone can claim it at once; returns the recorded reason."""
    now = store.get_task(task.id)
    assert (now.status, now.owner, now.lease_token) == (TaskStatus.PENDING, None, None)
    events = assert_history_reproduces(store, task.id)
    last = events[-1]
    assert last.type == TaskEventType.RELEASED.value
    assert last.actor == f"run:{outcome.id}"
    assert f"run {outcome.id} ended {outcome.status.value}" in last.data["reason"]
    taken = store.claim_task(owner="next-agent", lease_seconds=60, task_id=task.id)
    assert taken is not None and taken.owner == "next-agent"
    return str(last.data["reason"])


# --- renewal ---------------------------------------------------------------------------


def test_a_runs_claim_is_renewed_by_its_heartbeat_while_the_run_outlasts_the_lease(
    store: Store, tmp_path: Path
) -> None:
    task = store.create_task("long job", actor="lead")
    turns = [
        call("claim_task", task_id=task.id),
        call("complete_task", task_id=task.id, result="done"),  # asked for after 2.5 s
        {"content": "finished"},
    ]
    model = SlowModel(turns, slow_step=1, seconds=2.5)
    harness = Harness(store=store, model=model, lease_ttl=RUN_LEASE_S)
    outcome = harness.run("do the long job", cwd=tmp_path)

    assert outcome.status is RunStatus.COMPLETED, outcome.stop_reason
    claimed, completed = tool_outputs(harness, outcome.id)[:2]
    assert json.loads(claimed["output"])["claimed"]["owner"] == f"run:{outcome.id}"
    assert "error_kind" not in completed, completed
    assert json.loads(completed["output"])["completed"] == task.id
    done = store.get_task(task.id)
    assert (done.status, done.owner) == (TaskStatus.COMPLETED, f"run:{outcome.id}")

    events = assert_history_reproduces(store, task.id)
    kinds = [e.type for e in events]
    assert kinds[:2] == ["task_created", "task_claimed"] and kinds[-1] == "task_completed"
    assert 3 <= kinds.count("task_heartbeat") <= 10  # every third of the lease, not every beat
    first_expiry = datetime.fromisoformat(events[1].data["lease_expires_at"])
    assert events[-1].recorded_at > first_expiry  # without renewal the claim had lapsed
    expiry = first_expiry
    for event in events[2:]:  # every renewal, and the completion, came while the lease lived
        assert event.recorded_at < expiry, (event, expiry)
        if event.type == "task_heartbeat":
            expiry = datetime.fromisoformat(event.data["lease_expires_at"])


# --- settling at the run's end -----------------------------------------------------------


def test_a_completed_run_gives_back_the_claim_it_did_not_complete(
    store: Store, tmp_path: Path
) -> None:
    done = store.create_task("schema", actor="lead")
    left = store.create_task("docs", actor="lead")
    outcome = run(
        store,
        tmp_path,
        [
            call("claim_task", task_id=done.id),
            call("claim_task", task_id=left.id),
            call("complete_task", task_id=done.id, result="schema created"),
            {"content": "schema done, docs not started"},
        ],
    )
    assert outcome.status is RunStatus.COMPLETED
    assert store.get_task(done.id).status is TaskStatus.COMPLETED  # its own settlement stands
    assert_released_by_ended_run(store, left, outcome)
    assert store.tasks_held_by(f"run:{outcome.id}") == []


def test_a_failed_run_gives_back_its_claim_for_another_agent(store: Store, tmp_path: Path) -> None:
    task = store.create_task("docs", actor="lead")
    outcome = run(
        store,
        tmp_path,
        [call("claim_task", task_id=task.id), {"content": "never reached"}],
        budget=Budget(max_steps=1),
    )
    assert outcome.status is RunStatus.FAILED
    reason = assert_released_by_ended_run(store, task, outcome)
    assert outcome.stop_reason is not None and outcome.stop_reason in reason


def test_a_blocked_run_gives_back_its_claim(store: Store, tmp_path: Path) -> None:
    task = store.create_task("docs", actor="lead")
    forbidden = call("write_file", path=".keel/evil.txt", content="x")  # protected for good
    outcome = run(
        store,
        tmp_path,
        [call("claim_task", task_id=task.id), forbidden, forbidden, forbidden],
        mode="auto",
    )
    assert outcome.status is RunStatus.BLOCKED, outcome.stop_reason
    assert_released_by_ended_run(store, task, outcome)


def test_a_waiting_run_keeps_its_claim_unrenewed_until_it_lapses_then_cancel_releases(
    store: Store, tmp_path: Path
) -> None:
    kept = store.create_task("docs", actor="lead")
    lapsing = store.create_task("tests", actor="lead")
    harness = Harness(
        store=store,
        model=ScriptedModel(
            [
                call("claim_task", task_id=kept.id),
                call("claim_task", task_id=lapsing.id),
                call("ask_user", question="which style guide?"),
            ]
        ),
        lease_ttl=RUN_LEASE_S,
    )
    outcome = harness.run("write the docs", cwd=tmp_path)
    assert outcome.status is RunStatus.WAITING
    owner = f"run:{outcome.id}"
    assert [t.id for t in store.tasks_held_by(owner)] == [kept.id, lapsing.id]
    # One claim is stretched by hand (as a resumed run's heartbeat would) to outlive the wait.
    held = store.get_task(kept.id)
    assert held.lease_token is not None
    store.heartbeat_task(kept.id, owner=owner, token=held.lease_token, lease_seconds=60)

    time.sleep(float(CLAIM_LEASE_S) + 0.3)  # nothing renews a stopped run's claims
    taken = store.claim_task(owner="next-agent", lease_seconds=60, task_id=lapsing.id)
    assert taken is not None and taken.owner == "next-agent"
    reclaim = store.task_events(lapsing.id)[-2]
    assert (reclaim.type, reclaim.data["previous_owner"]) == ("task_reclaimed", owner)
    assert "task_released" not in [e.type for e in store.task_events(lapsing.id)]

    # Cancelling the stopped run gives back the claim it still holds, at once.
    cancelled = harness.cancel(outcome.id, "the docs are not needed")
    assert cancelled.status is RunStatus.CANCELLED
    assert_released_by_ended_run(store, kept, RunOutcome(state=cancelled))
    assert store.get_task(lapsing.id).owner == "next-agent"  # someone else's claim: untouched


@pytest.mark.parametrize(
    ("setting", "words"),
    [("-5", "KEEL_TASK_LEASE='-5': give"), ("nan", "KEEL_TASK_LEASE='nan'"), ("0.3", "shorter")],
)
def test_a_bad_task_lease_setting_is_refused_before_any_run_exists(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, setting: str, words: str
) -> None:
    monkeypatch.setenv("KEEL_TASK_LEASE", setting)
    with STORE_BACKENDS["sqlite"](tmp_path / "store") as store:
        with pytest.raises(ConfigError, match=re.escape(words)):
            Harness(store=store, model=ScriptedModel([{"content": "hi"}]), lease_ttl=RUN_LEASE_S)
        assert store.list_runs() == []


def test_keel_run_with_a_bad_task_lease_exits_2_and_creates_no_run(tmp_path: Path) -> None:
    ws = KeelWorkspace(tmp_path, env={"KEEL_TASK_LEASE": "soon"})
    line = one_line_error(ws.keel("run", "hello", "--model", ws.script({"content": "hi"})))
    assert "KEEL_TASK_LEASE='soon'" in line
    ws.env.clear()
    assert json.loads(expect(ws.keel("runs", "--json"), 0)) == []
