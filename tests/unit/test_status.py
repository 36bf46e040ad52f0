"""The transition table is exactly SPEC.md's, and reasons are enforced."""

from __future__ import annotations

import itertools

import pytest

from keel.core.errors import InvalidTransition
from keel.core.state import RunState, transition
from keel.core.status import TERMINAL, RunStatus, check_transition

S = RunStatus
SPEC_TABLE: dict[RunStatus, set[RunStatus]] = {
    S.QUEUED: {S.RUNNING, S.CANCELLED},
    S.RUNNING: {S.WAITING, S.PAUSED, S.VERIFYING, S.FAILED, S.BLOCKED, S.CANCELLED},
    S.WAITING: {S.RUNNING, S.FAILED, S.CANCELLED},
    S.PAUSED: {S.RUNNING, S.CANCELLED},
    S.VERIFYING: {S.COMPLETED, S.RUNNING, S.FAILED, S.CANCELLED},
    S.COMPLETED: set(),
    S.FAILED: set(),
    S.BLOCKED: set(),
    S.CANCELLED: set(),
}


def test_the_nine_statuses_have_their_spec_names() -> None:
    assert [s.value for s in RunStatus] == [
        "queued",
        "running",
        "waiting",
        "paused",
        "verifying",
        "completed",
        "failed",
        "blocked",
        "cancelled",
    ]


@pytest.mark.parametrize(("current", "target"), list(itertools.product(RunStatus, RunStatus)))
def test_every_pair_is_allowed_exactly_when_the_spec_table_says(
    current: RunStatus, target: RunStatus
) -> None:
    if target in SPEC_TABLE[current]:
        check_transition(current, target, "because")
    else:
        with pytest.raises(InvalidTransition) as err:
            check_transition(current, target, "because")
        assert current.value in str(err.value) and target.value in str(err.value)
        assert (err.value.current, err.value.target) == (current, target)


def test_terminal_states_never_leave() -> None:
    assert {S.COMPLETED, S.FAILED, S.BLOCKED, S.CANCELLED} == TERMINAL
    for status in TERMINAL:
        assert status.terminal
        for target in RunStatus:
            with pytest.raises(InvalidTransition, match="terminal"):
                check_transition(status, target, "because")
    assert not any(s.terminal for s in set(RunStatus) - TERMINAL)


@pytest.mark.parametrize("blank", [None, "", "   ", "\n\t"])
def test_a_blank_reason_is_refused_for_every_move_but_to_running(blank: str | None) -> None:
    for current, targets in SPEC_TABLE.items():
        for target in targets - {S.RUNNING}:
            with pytest.raises(InvalidTransition, match="reason"):
                check_transition(current, target, blank)


def test_a_move_to_running_needs_no_reason_and_clears_it() -> None:
    for current in (S.QUEUED, S.WAITING, S.PAUSED, S.VERIFYING):
        assert check_transition(current, S.RUNNING, None) is None
        assert check_transition(current, S.RUNNING, "left over") is None


def test_the_stored_reason_is_trimmed() -> None:
    assert check_transition(S.RUNNING, S.FAILED, "  out of budget \n") == "out of budget"


def test_transition_builds_the_status_changed_event() -> None:
    state = RunState(run_id="run_000000000001", status=S.RUNNING)
    event = transition(state, S.WAITING, "approval of write_file")
    assert event.data == {"from": "running", "to": "waiting", "reason": "approval of write_file"}
    with pytest.raises(InvalidTransition):
        transition(state, S.QUEUED, "x")


def test_a_refused_move_says_which_moves_are_allowed_or_that_the_run_ended() -> None:
    with pytest.raises(InvalidTransition) as err:
        check_transition(RunStatus.QUEUED, RunStatus.COMPLETED, "done")
    assert str(err.value) == (
        "cannot move a run from queued to completed: allowed: cancelled, running"
    )
    with pytest.raises(InvalidTransition) as err:
        check_transition(RunStatus.FAILED, RunStatus.RUNNING, None)
    assert str(err.value) == "cannot move a run from failed to running: failed is terminal"


def test_a_move_without_a_reason_names_both_statuses() -> None:
    with pytest.raises(InvalidTransition) as err:
        check_transition(RunStatus.RUNNING, RunStatus.FAILED, " ")
    assert str(err.value) == (
        "cannot move a run from running to failed: a non-empty reason is required"
    )
    assert (err.value.current, err.value.target) == (RunStatus.RUNNING, RunStatus.FAILED)
