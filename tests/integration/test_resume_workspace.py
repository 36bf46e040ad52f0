"""A resume notices files edited while the run was stopped: the model is told, and a
verification that passed before the edit no longer counts. On both stores."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from keel.core.events import EventType
from keel.core.state import RunState
from keel.core.status import RunStatus
from keel.runtime.harness import Harness
from keel.store.base import Store
from keel.testing import ScriptedModel
from keel.testing.stores import STORE_BACKENDS, postgres_unavailable
from keel.tools.workspace import sha256_bytes

CHECK_A = "grep -q hello a.txt"
CHECK_B = "test -f b.txt"


@pytest.fixture(params=sorted(STORE_BACKENDS))
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "postgres" and (reason := postgres_unavailable()):
        pytest.skip(f"PostgreSQL store not tested: {reason}")
    with STORE_BACKENDS[request.param](tmp_path / "db") as backend:
        yield backend


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    (root / "old.txt").write_text("old\n")
    return root


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"tool_calls": [{"name": name, "arguments": arguments}]}


SCRIPT = [
    call("write_file", path="a.txt", content="hello\n"),
    call("edit_file", path="old.txt", old_text="old", new_text="older"),
    call("request_completion", summary="a.txt says hello"),  # a.txt passes, b.txt is missing
    call("ask_user", question="may I create b.txt?"),
    # after the resume:
    call("write_file", path="b.txt", content="b\n"),
    call("request_completion", summary="both there"),
]


def stopped_with_a_passed_check(store: Store, workspace: Path) -> str:
    """A run waiting for an answer after CHECK_A passed and CHECK_B failed."""
    harness = Harness(store=store, model=ScriptedModel(SCRIPT))
    outcome = harness.run("say hello", cwd=workspace, verify=[CHECK_A, CHECK_B])
    assert outcome.status is RunStatus.WAITING
    state = outcome.state
    passed = state.latest_validation(CHECK_A)
    assert passed is not None and passed.passed
    assert state.verification_gaps() == [f"{CHECK_B}: failed with exit code 1"]
    harness.answer(outcome.id, "yes")
    return outcome.id


def state_at(store: Store, run_id: str, seq: int) -> RunState:
    return RunState.from_events([e for e in store.read_events(run_id) if e.seq <= seq])


def test_a_file_edited_while_stopped_is_told_to_the_model_and_voids_the_passed_check(
    store: Store, workspace: Path
) -> None:
    run_id = stopped_with_a_passed_check(store, workspace)
    revision = store.load_run(run_id).mutation_revision
    (workspace / "a.txt").write_text("hello, edited by a person\n")
    (workspace / "old.txt").unlink()

    model = ScriptedModel(SCRIPT)
    outcome = Harness(store=store, model=model).resume(run_id)

    assert outcome.status is RunStatus.COMPLETED
    (changed,) = [e for e in store.read_events(run_id) if e.type is EventType.WORKSPACE_CHANGED]
    assert changed.data["changed_files"] == {
        "a.txt": sha256_bytes(b"hello, edited by a person\n"),
        "old.txt": "",
    }
    after = state_at(store, run_id, changed.seq)
    assert after.mutation_revision == revision + 1
    assert f"{CHECK_A}: last run at revision {revision}, files changed since" in " ".join(
        after.verification_gaps()
    )
    # The model's next request says what changed, and that the earlier pass is stale.
    first = model.requests[0]
    note = next(m.content for m in first.messages if m.content and "[harness] While" in m.content)
    assert "a.txt (modified)" in note and "old.txt (deleted)" in note
    system = first.messages[0].content or ""
    assert f"{CHECK_A}: last run at revision {revision}" in system
    # Verification ran again at the new revision before the run completed.
    final = store.load_run(run_id)
    record = final.latest_validation(CHECK_A)
    assert record is not None and record.passed
    assert record.mutation_revision == final.mutation_revision > revision + 1


def test_an_untouched_workspace_records_no_change(store: Store, workspace: Path) -> None:
    run_id = stopped_with_a_passed_check(store, workspace)
    revision = store.load_run(run_id).mutation_revision

    model = ScriptedModel(SCRIPT)
    Harness(store=store, model=model).resume(run_id)

    kinds = [e.type for e in store.read_events(run_id)]
    assert EventType.WORKSPACE_CHANGED not in kinds
    assert not any("[harness] While" in (m.content or "") for m in model.requests[0].messages)
    verified = [e for e in store.read_events(run_id) if e.type is EventType.VERIFICATION_STARTED]
    assert verified[-1].data["mutation_revision"] == revision + 1  # only b.txt's write


def test_a_change_is_reported_once_not_on_every_resume(store: Store, workspace: Path) -> None:
    asks = [
        call("write_file", path="a.txt", content="hello\n"),
        call("ask_user", question="first?"),
        call("ask_user", question="second?"),
        {"content": "done"},
    ]
    harness = Harness(store=store, model=ScriptedModel(asks))
    run_id = harness.run("ask twice", cwd=workspace).id
    (workspace / "a.txt").write_text("changed\n")
    harness.answer(run_id, "yes")
    assert harness.resume(run_id).status is RunStatus.WAITING  # asked the second question
    harness.answer(run_id, "yes")
    assert harness.resume(run_id).status is RunStatus.COMPLETED

    changes = [e for e in store.read_events(run_id) if e.type is EventType.WORKSPACE_CHANGED]
    assert len(changes) == 1
    assert store.load_run(run_id).changed_files["a.txt"] == sha256_bytes(b"changed\n")
