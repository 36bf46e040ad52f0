"""What each Keel error says, and what it carries for a caller that catches it
(keel.core.errors): the message a person reads names the next step."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from keel.core.errors import (
    ApprovalRequired,
    BudgetExhausted,
    ConcurrentUpdate,
    ContextUnfaithful,
    InputRequired,
    InvalidTaskTransition,
    InvalidTransition,
    LeaseHeld,
    LeaseLost,
    ModelError,
    NothingPending,
    NotOwner,
    PendingCallChanged,
    RunNotFound,
    SchemaTooNew,
    StoreCorrupt,
    TaskNotClaimable,
    TaskNotFound,
)

UNTIL = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


@pytest.mark.parametrize(
    ("kind", "arguments", "message", "attributes"),
    [
        (
            ApprovalRequired,
            ("run_1", "c1", "run_command"),
            "run run_1 waits for approval of run_command (call c1): run `keel approve run_1` or "
            "`keel approve run_1 --deny --reason TEXT`",
            {"run_id": "run_1", "call_id": "c1", "tool": "run_command"},
        ),
        (
            InputRequired,
            ("run_1", "Which db?"),
            "run run_1 asks: Which db? — answer with `keel answer run_1 TEXT`",
            {"run_id": "run_1", "question": "Which db?"},
        ),
        (
            InvalidTransition,
            ("completed", "running"),
            "cannot move a run from completed to running",
            {"current": "completed", "target": "running"},
        ),
        (
            InvalidTransition,
            ("completed", "running", "it ended"),
            "cannot move a run from completed to running: it ended",
            {},
        ),
        (
            RunNotFound,
            ("run_x",),
            "no run with id 'run_x'; `keel runs` lists the runs in this store",
            {"run_id": "run_x"},
        ),
        (
            TaskNotFound,
            ("task_x",),
            "no task with id 'task_x'; `keel tasks list` lists the tasks",
            {"task_id": "task_x"},
        ),
        (
            TaskNotClaimable,
            ("task_1", "blocked by task_0"),
            "task task_1 cannot be claimed: blocked by task_0",
            {"task_id": "task_1", "reason": "blocked by task_0"},
        ),
        (
            NotOwner,
            ("task_1", "w1", "w2"),
            "task task_1 is owned by w1; w2 cannot change it",
            {"task_id": "task_1", "owner": "w1", "caller": "w2"},
        ),
        (
            NotOwner,
            ("task_1", None, "w2"),
            "task task_1 is not claimed by anyone; w2 cannot change it",
            {"owner": None},
        ),
        (
            InvalidTaskTransition,
            ("task_1", "done", "it is finished"),
            "task task_1 is done: it is finished",
            {"task_id": "task_1", "status": "done"},
        ),
        (
            NothingPending,
            ("run_1", "an answer"),
            "run run_1 is not waiting for an answer",
            {"run_id": "run_1"},
        ),
        (
            PendingCallChanged,
            ("run_1", "abc", "write_file"),
            "the pending call changed: run run_1 now waits for write_file, not digest abc; look "
            "at it again before approving",
            {"run_id": "run_1", "digest": "abc"},
        ),
        (BudgetExhausted, ("steps",), "budget exhausted: steps", {"dimension": "steps"}),
        (
            ModelError,
            ("HTTP 500",),
            "HTTP 500",
            {"reason": "model_error", "status_code": None, "transient": False},
        ),
        (
            ConcurrentUpdate,
            ("run_1", 3, 5),
            "run run_1 moved on: expected last sequence 3, store has 5; nothing was written — "
            "reload the run and retry",
            {"run_id": "run_1", "expected": 3, "actual": 5},
        ),
        (
            LeaseLost,
            ("run run_1",),
            "lease on run run_1 is no longer held by this process; nothing was written",
            {"subject": "run run_1"},
        ),
        (
            LeaseLost,
            ("run run_1", "taken over"),
            "lease on run run_1 is no longer held by this process; nothing was written "
            "(taken over)",
            {},
        ),
        (
            LeaseHeld,
            ("run run_1", "w1", UNTIL),
            "run run_1 is being executed by w1 (lease until 2026-01-02T03:04:05+00:00); wait "
            "for it to finish or for the lease to expire",
            {"subject": "run run_1", "owner": "w1", "expires_at": UNTIL},
        ),
        (
            SchemaTooNew,
            ("keel.db", 9, 7),
            "keel.db has schema version 9, newer than this Keel supports (7); upgrade keel to "
            "open it",
            {"location": "keel.db"},
        ),
        (
            StoreCorrupt,
            ("keel.db", "file is not a database"),
            "keel.db is not a readable Keel database: file is not a database",
            {"location": "keel.db"},
        ),
    ],
)
def test_an_error_says_what_happened_and_carries_its_facts(
    kind: type[Exception], arguments: tuple[Any, ...], message: str, attributes: dict[str, Any]
) -> None:
    # Built inside the test, not while pytest collects this file: the code under test is
    # then the code this test runs (mutmut switches a mutant on per test, after collection).
    error = kind(*arguments)
    assert str(error) == message
    for name, value in attributes.items():
        assert getattr(error, name) == value


@pytest.mark.parametrize(("length", "cut"), [(200, False), (201, True)])
def test_an_unfaithful_context_quotes_the_missing_item_up_to_200_characters(
    length: int, cut: bool
) -> None:
    item = "t" * length
    error = ContextUnfaithful("open todo", item)
    shown = item[:200] + "…" if cut else item
    assert str(error) == (
        f"the compacted context lacks the open todo {shown!r}; it was not sent (a continuation "
        "must keep the goal, every open todo, the latest verification gaps and the last "
        "unresolved error)"
    )
    assert (error.missing, error.item) == ("open todo", item)


def test_a_model_error_carries_the_status_whether_it_was_transient_and_the_reason() -> None:
    error = ModelError("HTTP 402", status_code=402, transient=True, reason="out_of_credit")
    assert str(error) == "HTTP 402"
    assert (error.status_code, error.transient, error.reason) == (402, True, "out_of_credit")
