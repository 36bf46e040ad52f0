"""The SQLite task graph against an in-memory reference model, driven by hypothesis.

Rules: create (with blockers), depend, claim (a named task or the next one),
heartbeat, complete, fail (each with the current token, a stale token, no token,
or as someone else), reopen, release, cancel (by the holder or anyone) and expire.
Expiry is real time: the holder heartbeats its lease down to a few milliseconds and
the rule waits it out, so no clock is patched. After every step the store must agree
with the model on every task, and every task's history must replay to its row.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from keel.core.errors import (
    DependencyError,
    InvalidTaskTransition,
    KeelError,
    LeaseLost,
    NotOwner,
    TaskNotClaimable,
)
from keel.core.tasks import Task, TaskStatus
from keel.store.sqlite.store import SQLiteStore
from keel.testing.tasks import assert_history_reproduces

LONG = 600.0
OWNERS = st.sampled_from(["ann", "bo", "cy"])
HOW = st.sampled_from(["token", "stale", "none", "other"])


@dataclass
class Model:
    id: str
    order: int
    blockers: list[str] = field(default_factory=list)
    status: TaskStatus = TaskStatus.PENDING
    owner: str | None = None
    token: str | None = None
    attempt: int = 0
    expired: bool = False
    tokens: list[str] = field(default_factory=list)


class TaskGraphMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.folder = Path(tempfile.mkdtemp(prefix="keel-sm-"))
        self.store = SQLiteStore(self.folder / "keel.db")
        self.tasks: dict[str, Model] = {}

    def teardown(self) -> None:
        self.store.close()
        shutil.rmtree(self.folder, ignore_errors=True)

    # --- the model's rules -----------------------------------------------------------

    def done(self, task_id: str) -> bool:
        return self.tasks[task_id].status is TaskStatus.COMPLETED

    def ready(self, m: Model) -> bool:
        return m.status is TaskStatus.PENDING and all(self.done(b) for b in m.blockers)

    def claimable(self, m: Model) -> bool:
        return self.ready(m) or (m.status is TaskStatus.IN_PROGRESS and m.expired)

    def reaches(self, start: str, target: str) -> bool:
        seen, stack = set(), [start]
        while stack:
            node = stack.pop()
            if node == target:
                return True
            if node not in seen:
                seen.add(node)
                stack.extend(self.tasks[node].blockers)
        return False

    def holder_error(self, m: Model, owner: str, token: str | None) -> type[KeelError] | None:
        if token is not None and token != m.token:
            return LeaseLost
        if m.status is TaskStatus.PENDING:
            return NotOwner
        if m.status is not TaskStatus.IN_PROGRESS:
            return InvalidTaskTransition
        if m.owner != owner:
            return NotOwner
        if m.expired:
            return LeaseLost
        return None

    def credentials(self, m: Model, how: str) -> tuple[str, str | None]:
        holder = m.owner or "ann"
        if how == "token":
            return holder, m.token
        if how == "stale":
            return holder, m.tokens[0] if m.tokens and m.tokens[0] != m.token else "f" * 32
        if how == "none":
            return holder, None
        return "mallory", None

    def in_order(self) -> list[Model]:
        """Tasks by creation (ids are random, so drawing by id would not replay)."""
        return sorted(self.tasks.values(), key=lambda m: m.order)

    def pick(self, data: st.DataObject) -> Model:
        return data.draw(st.sampled_from(self.in_order()))

    def pick_held(self, data: st.DataObject) -> Model:
        """Half the time a claimed task (the interesting case for holder writes)."""
        held = [m for m in self.in_order() if m.status is TaskStatus.IN_PROGRESS]
        if held and data.draw(st.booleans()):
            return data.draw(st.sampled_from(held))
        return self.pick(data)

    def expect(self, error: type[KeelError] | None, call: object) -> object:
        assert callable(call)
        if error is None:
            return call()
        try:
            call()
        except KeelError as exc:
            assert type(exc) is error, f"expected {error.__name__}, got {exc!r}"
            return None
        raise AssertionError(f"expected {error.__name__}, the store accepted it")

    def took(self, m: Model, owner: str, task: object) -> None:
        assert isinstance(task, Task) and task.id == m.id
        assert task.lease_token is not None
        m.status, m.owner, m.token = TaskStatus.IN_PROGRESS, owner, task.lease_token
        m.attempt += 1
        m.expired = False
        m.tokens.append(task.lease_token)

    # --- rules -----------------------------------------------------------------------

    @initialize()
    def first_task(self) -> None:
        self.create(blockers=[])

    @rule(data=st.data())
    def create_task(self, data: st.DataObject) -> None:
        pool = [m.id for m in self.in_order()]
        blockers = data.draw(st.lists(st.sampled_from(pool), max_size=2, unique=True))
        self.create(blockers)

    def create(self, blockers: list[str]) -> None:
        task = self.store.create_task(f"t{len(self.tasks)}", actor="planner", blocked_by=blockers)
        self.tasks[task.id] = Model(id=task.id, order=len(self.tasks), blockers=list(blockers))

    @rule(data=st.data())
    def depend(self, data: st.DataObject) -> None:
        m, blocker = self.pick(data), self.pick(data)
        if m.status is not TaskStatus.PENDING:
            error: type[KeelError] | None = InvalidTaskTransition
        elif m.id == blocker.id or self.reaches(blocker.id, m.id):
            error = DependencyError
        else:
            error = None
        self.expect(error, lambda: self.store.add_dependencies(m.id, [blocker.id], actor="p"))
        if error is None and blocker.id not in m.blockers:
            m.blockers.append(blocker.id)

    @rule(data=st.data(), owner=OWNERS)
    def claim_named(self, data: st.DataObject, owner: str) -> None:
        m = self.pick(data)
        error = None if self.claimable(m) else TaskNotClaimable
        task = self.expect(
            error, lambda: self.store.claim_task(owner=owner, lease_seconds=LONG, task_id=m.id)
        )
        if error is None:
            self.took(m, owner, task)

    @rule(owner=OWNERS)
    def claim_next(self, owner: str) -> None:
        candidates = sorted(
            (m for m in self.tasks.values() if self.claimable(m)), key=lambda m: m.order
        )
        task = self.store.claim_task(owner=owner, lease_seconds=LONG)
        if not candidates:
            assert task is None
            return
        self.took(candidates[0], owner, task)

    @precondition(lambda self: any(m.tokens for m in self.tasks.values()))
    @rule(data=st.data(), how=HOW)
    def heartbeat(self, data: st.DataObject, how: str) -> None:
        m = self.pick_held(data)
        owner, token = self.credentials(m, how)
        token = token or "0" * 32  # a heartbeat always carries a token
        self.expect(
            self.holder_error(m, owner, token),
            lambda: self.store.heartbeat_task(m.id, owner=owner, token=token, lease_seconds=LONG),
        )

    @rule(data=st.data(), how=HOW)
    def complete(self, data: st.DataObject, how: str) -> None:
        m = self.pick_held(data)
        owner, token = self.credentials(m, how)
        error = self.holder_error(m, owner, token)
        waiting = {t.id for t in self.tasks.values() if not self.ready(t)}
        result = self.expect(
            error, lambda: self.store.complete_task(m.id, owner=owner, token=token)
        )
        if error is None:
            m.status, m.token = TaskStatus.COMPLETED, None
            now_ready = {t.id for t in self.tasks.values() if self.ready(t)}
            assert isinstance(result, list)
            assert {t.id for t in result} == waiting & now_ready

    @rule(data=st.data(), how=HOW)
    def fail(self, data: st.DataObject, how: str) -> None:
        m = self.pick_held(data)
        owner, token = self.credentials(m, how)
        error = self.holder_error(m, owner, token)
        self.expect(
            error, lambda: self.store.fail_task(m.id, owner=owner, reason="no", token=token)
        )
        if error is None:
            m.status, m.token = TaskStatus.FAILED, None

    @rule(data=st.data())
    def reopen(self, data: st.DataObject) -> None:
        m = self.pick(data)
        error = None if m.status is TaskStatus.FAILED else InvalidTaskTransition
        self.expect(error, lambda: self.store.reopen_task(m.id, actor="lead"))
        if error is None:
            m.status, m.owner = TaskStatus.PENDING, None

    @rule(data=st.data(), actor=OWNERS)
    def cancel(self, data: st.DataObject, actor: str) -> None:
        m = self.pick_held(data)
        error: type[KeelError] | None = None
        if m.status in (TaskStatus.COMPLETED, TaskStatus.CANCELLED):
            error = InvalidTaskTransition
        elif m.status is TaskStatus.IN_PROGRESS and not m.expired and m.owner != actor:
            error = NotOwner
        self.expect(error, lambda: self.store.cancel_task(m.id, actor=actor, reason="withdrawn"))
        if error is None:
            m.status, m.token = TaskStatus.CANCELLED, None

    @precondition(
        lambda self: any(
            m.status is TaskStatus.IN_PROGRESS and not m.expired for m in self.tasks.values()
        )
    )
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        live = [
            m for m in self.tasks.values() if m.status is TaskStatus.IN_PROGRESS and not m.expired
        ]
        m = data.draw(st.sampled_from(sorted(live, key=lambda t: t.order)))
        assert m.owner is not None and m.token is not None
        self.store.release_task(m.id, owner=m.owner, token=m.token)
        m.status, m.owner, m.token = TaskStatus.PENDING, None, None

    @precondition(
        lambda self: any(
            m.status is TaskStatus.IN_PROGRESS and not m.expired for m in self.tasks.values()
        )
    )
    @rule(data=st.data())
    def expire(self, data: st.DataObject) -> None:
        live = [
            m for m in self.tasks.values() if m.status is TaskStatus.IN_PROGRESS and not m.expired
        ]
        m = data.draw(st.sampled_from(sorted(live, key=lambda t: t.order)))
        assert m.owner is not None and m.token is not None
        self.store.heartbeat_task(m.id, owner=m.owner, token=m.token, lease_seconds=0.005)
        time.sleep(0.015)
        m.expired = True

    # --- agreement -------------------------------------------------------------------

    @invariant()
    def store_agrees_with_the_model(self) -> None:
        stored = {t.id: t for t in self.store.list_tasks()}
        assert list(stored) == sorted(self.tasks, key=lambda i: self.tasks[i].order)
        for task_id, m in self.tasks.items():
            t = stored[task_id]
            assert (t.status, t.attempt, list(t.blocked_by)) == (m.status, m.attempt, m.blockers)
            assert t.ready == self.ready(m)
            if m.status is TaskStatus.IN_PROGRESS:
                assert (t.owner, t.lease_token) == (m.owner, m.token)
            assert t.waiting_on == tuple(b for b in m.blockers if not self.done(b))
            failed = tuple(b for b in m.blockers if self.tasks[b].status is TaskStatus.FAILED)
            assert t.held_by_failed == failed
            gone = tuple(b for b in m.blockers if self.tasks[b].status is TaskStatus.CANCELLED)
            assert t.held_by_cancelled == gone
            assert t.blocked_for_good == (m.status is TaskStatus.PENDING and bool(gone))
            assert_history_reproduces(self.store, task_id)


TaskGraphMachine.TestCase.settings = settings(
    max_examples=25,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_task_graph_matches_its_reference_model = TaskGraphMachine.TestCase
