"""A run state's snapshot (keel.core.snapshot, keel.core.records): every field survives
the round trip, and a snapshot written before a field existed reads its default."""

from __future__ import annotations

import json

from keel.core.budget import Budget, Usage
from keel.core.children import ChildRecord
from keel.core.records import (
    Grant,
    PendingRequest,
    RunOptions,
    Todo,
    ValidationRecord,
    canonical_json,
    in_plan_paths,
)
from keel.core.state import RunState
from keel.core.status import RunStatus

FULL = RunState(
    run_id="run_1",
    parent_id="run_0",
    goal="fix it",
    workspace="/ws",
    options=RunOptions(
        model="m",
        mode="auto",
        verify=("pytest",),
        budget=Budget(max_steps=9),
        approval_timeout_s=60.0,
        sandbox={"mode": "off"},
        tools=("read_file",),
        depth=1,
        skills=({"name": "s", "description": "d", "digest": "x"},),
    ),
    status=RunStatus.WAITING,
    reason="approval:c1 write_file",
    usage=Usage(steps=2, tokens=30, cost=0.5),
    warned=("steps",),
    todos=(Todo(content="a", status="pending"),),
    changed_files={"a.py": "h"},
    mutation_revision=3,
    validations=(
        ValidationRecord(
            command="pytest",
            exit_code=1,
            duration_s=0.5,
            artifact="art",
            mutation_revision=2,
            file_hashes={"a.py": "h"},
            passed=False,
            note="2 failed",
            unfixable="not found",
        ),
    ),
    pending=PendingRequest(
        kind="approval",
        call_id="c1",
        tool="write_file",
        arguments={"path": "a"},
        digest="d",
        risk="medium",
        question="q",
        expires_at="2026-01-01T00:00:00+00:00",
    ),
    turn_calls=({"id": "c1", "name": "write_file", "arguments": "{}"},),
    open_calls={"c0": {"call_id": "c0", "tool": "run_command"}},
    grants={"g": Grant(call_id="c9", tool="t", expires_at="2026-01-01T00:00:00+00:00")},
    mode="auto",
    plan="1. a",
    approved_plan_sha256="p",
    plan_paths=("src/",),
    notes=("n",),
    recent_calls=("c",),
    recent_errors=("e",),
    failed_attempts=1,
    no_progress_step=2,
    truncated_turns=1,
    task_id="task_1",
    result={"summary": "s"},
    children={
        "run_k": ChildRecord(call_id="c", task_id=None, agent="a", background=True, attempt=1)
    },
    child_failure={"child_run_id": "run_k"},
    escalation={"call_id": "escalate:run_k"},
    handoff={"run_id": "run_2"},
    pause_requested={"by": "ana"},
    decisions={"model": ({"decision": "append"},)},
    middleware_block={"decision": "deny"},
    last_seq=12,
    last_hash="ab" * 32,
    updated_at="2026-01-01T00:00:00+00:00",
)


def test_every_field_survives_the_snapshot_round_trip_through_json() -> None:
    stored = json.loads(json.dumps(FULL.to_dict()))
    assert RunState.from_dict(stored) == FULL


def test_a_snapshot_from_before_the_fields_existed_reads_their_defaults() -> None:
    old = RunState.from_dict({"run_id": "run_1", "status": "running"})
    assert old == RunState(run_id="run_1", options=RunOptions.from_dict({}))


def test_delegation_fields_are_written_only_when_set() -> None:
    plain = RunState(run_id="run_1").to_dict()
    for key in ("children", "decisions", "child_failure", "escalation", "handoff"):
        assert key not in plain
    assert "middleware_block" not in plain and "pause_requested" not in plain


def test_a_validation_and_a_pending_request_read_from_their_stored_form() -> None:
    [record] = FULL.validations
    assert ValidationRecord.from_dict(record.to_dict()) == record
    minimal = {
        "command": "pytest",
        "exit_code": 0,
        "duration_s": 1,
        "mutation_revision": 0,
        "passed": True,
    }
    assert ValidationRecord.from_dict(minimal) == ValidationRecord(
        command="pytest",
        exit_code=0,
        duration_s=1.0,
        artifact=None,
        mutation_revision=0,
        file_hashes={},
        passed=True,
    )
    assert "note" not in ValidationRecord.from_dict(minimal).to_dict()
    assert FULL.pending is not None
    assert PendingRequest.from_dict(FULL.pending.to_dict()) == FULL.pending


def test_a_passed_validation_has_nothing_left_to_fix() -> None:
    try:
        ValidationRecord(
            command="x",
            exit_code=0,
            duration_s=0,
            artifact=None,
            mutation_revision=0,
            file_hashes={},
            passed=True,
            unfixable="y",
        )
    except ValueError as err:
        assert str(err) == "a passed validation has nothing left to fix"
    else:
        raise AssertionError("accepted")


def test_canonical_json_keeps_text_as_written() -> None:
    assert canonical_json({"b": "é", "a": [1, 2]}) == '{"a":[1,2],"b":"é"}'


def test_a_plan_path_covers_only_what_it_names() -> None:
    assert in_plan_paths("tests/a.py", ("tests",))
    assert not in_plan_paths("tests/a.py", ("Xtests",))
    assert not in_plan_paths("src/a.py", ("/",))
