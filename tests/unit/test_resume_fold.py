"""What a resume records folds into the run's state: outside edits void earlier passes,
a re-read policy governs from then on, and a take-over changes nothing else."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

from keel.core.events import Event, EventType, NewEvent
from keel.core.records import RunOptions
from keel.core.state import RunState
from keel.policy.rules import Policy, Rule
from keel.runtime.resume import policy_events, policy_summary

T0 = datetime(2025, 1, 1, tzinfo=UTC)
PASSED = {
    "command": "make test",
    "exit_code": 0,
    "duration_s": 1.0,
    "artifact": None,
    "mutation_revision": 1,
    "file_hashes": {},
    "passed": True,
}


def fold(*new: NewEvent, options: RunOptions | None = None) -> RunState:
    created = NewEvent(
        type=EventType.RUN_CREATED,
        data={"goal": "g", "options": (options or RunOptions(verify=("make test",))).to_dict()},
    )
    state = RunState(run_id="run_000000000001")
    for seq, n in enumerate((created, *new), start=1):
        state = state.apply(
            Event(
                run_id=state.run_id,
                seq=seq,
                event_id=f"e{seq}",
                type=n.type,
                recorded_at=T0,
                data=n.data,
            )
        )
    return state


WROTE_A = NewEvent(
    type=EventType.TOOL_FINISHED,
    data={"call_id": "c1", "tool": "write_file", "arguments": {}, "changed_files": {"a": "h1"}},
)
VERIFIED = NewEvent(type=EventType.VERIFICATION_PASSED, data={"records": [PASSED]})


def test_an_outside_edit_moves_the_revision_on_so_an_earlier_pass_no_longer_counts() -> None:
    before = fold(WROTE_A, VERIFIED)
    assert before.verification_gaps() == []

    edited = NewEvent(type=EventType.WORKSPACE_CHANGED, data={"changed_files": {"a": ""}})
    after = fold(WROTE_A, VERIFIED, edited)

    assert after.changed_files == {"a": ""}
    assert after.mutation_revision == 2
    assert after.verification_gaps() == [
        "make test: last run at revision 1, files changed since (now 2)"
    ]
    assert RunState.from_dict(after.to_dict()) == after


def test_a_reread_policy_replaces_the_stored_rules_and_survives_the_snapshot() -> None:
    old = Policy(rules=(Rule(action="allow", tool="run_command", origin="p.toml:1"),))
    new = Policy(
        rules=(Rule(action="deny", tool="write_file", path="notes/*", origin="p.toml:4"),),
        source="/ws/.keel/policy.toml",
        protected=("deploy/*",),
    )
    options = RunOptions(policy=old.to_dict())
    stopped = fold(options=options)

    changed = fold(*policy_events(stopped, new), options=options)

    assert changed.options.policy == new.to_dict()
    assert Policy.from_dict(changed.options.policy) == new
    assert changed.options.mode == options.mode and changed.options.budget == options.budget
    assert changed.notes and "deny write_file path='notes/*'" in changed.notes[-1]
    assert RunState.from_dict(changed.to_dict()) == changed


def test_the_policy_summary_names_what_decides_differently_and_ignores_moved_lines() -> None:
    rule = Rule(action="deny", tool="run_command", argv="git push*", reason="people push")
    before = Policy(rules=(replace(rule, origin="p.toml:2"),), secret=("keys/*",))
    moved = Policy(rules=(replace(rule, origin="p.toml:9"),), secret=("keys/*",))
    after = Policy(
        rules=(Rule(action="ask", tool="write_file", origin="q.toml:1"),),
        source=str(Path("/ws/q.toml")),
        protected=("deploy/*",),
    )

    assert policy_summary(before, moved) == []
    assert policy_events(fold(options=RunOptions(policy=before.to_dict())), moved) == []
    assert policy_summary(before, after) == [
        "policy file: none -> /ws/q.toml",
        "- deny run_command argv='git push*' (people push)",
        "+ ask write_file",
        "+ protected 'deploy/*'",
        "- secret 'keys/*'",
    ]


def test_a_lease_take_over_is_recorded_without_changing_the_state() -> None:
    before = fold(WROTE_A)
    taken = NewEvent(type=EventType.LEASE_TAKEN_OVER, data={"owner": "a", "reason": "gone"})
    after = fold(WROTE_A, taken)
    assert replace(after, last_seq=before.last_seq) == before
