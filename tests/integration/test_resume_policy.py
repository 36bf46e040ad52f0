"""`keel resume` reads the run's policy file again: a change is recorded and enforced from
then on; a file that became invalid refuses the resume and leaves the run as it was.

Real `keel` processes on SQLite and PostgreSQL; scripted model turns.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from keel.core.events import EventType
from keel.core.status import RunStatus
from keel.policy.rules import Policy
from keel.store.url import open_store
from keel.testing.cli import DONE, KeelWorkspace, call, expect, one_line_error, turn
from keel.testing.stores import postgres_unavailable, scratch_database

DENY_NOTES = """\
# written by a person while the run waited

[[rule]]
action = "deny"
tool = "write_file"
path = "notes/*"
reason = "notes are written by people"
"""


@pytest.fixture(params=["sqlite", "postgres"])
def ws(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[KeelWorkspace]:
    root = tmp_path / "ws"
    root.mkdir()
    if request.param == "sqlite":
        yield KeelWorkspace(root)
        return
    if reason := postgres_unavailable():
        pytest.skip(f"PostgreSQL store not tested: {reason}")
    with scratch_database() as url:
        yield KeelWorkspace(root, store_url=url)


def waiting_run(ws: KeelWorkspace, *flags: str) -> str:
    """A run (no policy rules yet) that asked a question, answered: ready to resume."""
    model = ws.script(
        turn(call("ask_user", question="go?")),
        turn(call("write_file", path="notes/a.txt", content="by the agent\n")),
        turn(call("write_file", path="other.txt", content="fine\n")),
        DONE,
    )
    run_id, result = ws.start("write notes", "--model", model, *flags)
    expect(result, 3)
    expect(ws.keel("answer", run_id, "yes"), 0)
    return run_id


def test_a_policy_file_written_while_stopped_is_recorded_and_enforced_after_resume(
    ws: KeelWorkspace,
) -> None:
    run_id = waiting_run(ws)
    path = ws.root / ".keel" / "policy.toml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(DENY_NOTES)

    expect(ws.keel("resume", run_id), 0)

    (changed,) = ws.of_type(run_id, EventType.POLICY_CHANGED)
    assert changed.data["source"] == str(path)
    assert changed.data["summary"] == [
        f"policy file: none -> {path}",
        "+ deny write_file path='notes/*' (notes are written by people)",
    ]
    assert Policy.from_dict(changed.data["policy"]) == Policy.from_sources(ws.root)
    state = ws.state(run_id)
    assert state.options.policy == changed.data["policy"]  # the fold carries it on
    (denied,) = ws.of_type(run_id, EventType.TOOL_FAILED)
    assert denied.data["error_kind"] == "policy_denied"
    assert f"{path}:3 deny write_file" in denied.data["message"]  # the rule's file and line
    assert not (ws.root / "notes" / "a.txt").exists()
    assert (ws.root / "other.txt").read_text() == "fine\n"
    notes = [e.data["text"] for e in ws.of_type(run_id, EventType.NOTE_ADDED)]
    assert any("policy was changed" in n and "notes/*" in n for n in notes)
    assert state.status is RunStatus.COMPLETED


def test_a_policy_file_given_with_policy_is_read_again_from_where_it_was(
    ws: KeelWorkspace,
) -> None:
    team = ws.root.parent / "team-policy.toml"
    team.write_text('[[rule]]\naction = "deny"\ntool = "run_command"\nargv = "git push*"\n')
    run_id = waiting_run(ws, "--policy", "../team-policy.toml")  # relative to the ws
    team.write_text(team.read_text() + DENY_NOTES)
    elsewhere = ws.root.parent / "elsewhere"
    elsewhere.mkdir()

    # Resumed from another directory: the file is found by the absolute path stored.
    expect(KeelWorkspace(elsewhere, store_url=ws.url).keel("resume", run_id), 0)

    (changed,) = ws.of_type(run_id, EventType.POLICY_CHANGED)
    assert changed.data["source"] == str(team)
    assert changed.data["summary"] == [
        "+ deny write_file path='notes/*' (notes are written by people)"
    ]  # the unchanged git push rule, now on other lines, is no change
    assert ws.of_type(run_id, EventType.TOOL_FAILED)[0].data["error_kind"] == "policy_denied"


def test_an_unchanged_policy_records_nothing(ws: KeelWorkspace) -> None:
    path = ws.root / ".keel" / "policy.toml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(DENY_NOTES)
    run_id = waiting_run(ws)
    path.write_text("# a comment moves the rule down a line\n" + DENY_NOTES)

    expect(ws.keel("resume", run_id), 0)

    assert ws.of_type(run_id, EventType.POLICY_CHANGED) == []
    assert ws.of_type(run_id, EventType.TOOL_FAILED)[0].data["error_kind"] == "policy_denied"


def test_a_policy_file_that_became_invalid_refuses_the_resume_and_leaves_the_run(
    ws: KeelWorkspace,
) -> None:
    run_id = waiting_run(ws)
    path = ws.root / ".keel" / "policy.toml"
    path.parent.mkdir(exist_ok=True)
    path.write_text('[[rule]]\ntool = "write_file"\naction = "forbid"\n')
    before = ws.events(run_id)

    line = one_line_error(ws.keel("resume", run_id))

    assert line.startswith(f"error: {path}:3: rule 1")
    assert "action" in line
    assert ws.events(run_id) == before
    with open_store(ws.url) as store:
        assert store.current_run_lease(run_id) is None
    assert not (ws.root / "notes").exists()

    path.write_text(DENY_NOTES)  # fixed: the resume goes on, under the new rule
    expect(ws.keel("resume", run_id), 0)
    assert ws.of_type(run_id, EventType.TOOL_FAILED)[0].data["error_kind"] == "policy_denied"
