"""How a writer checks a ``status_changed`` event before it is stored
(keel.store.step.checked_status_change): the refusal that names an unknown status,
and the data stored, with the reason trimmed and ``from`` filled in."""

from __future__ import annotations

import pytest

from keel.core.errors import InvalidTransition
from keel.core.status import RunStatus
from keel.store.step import checked_status_change


def test_a_move_to_an_unknown_status_is_refused_naming_the_status_given() -> None:
    with pytest.raises(InvalidTransition) as caught:
        checked_status_change(RunStatus.RUNNING, {"to": "sideways", "reason": "why not"})
    assert str(caught.value) == "cannot move a run from running to sideways: not a run status"
    assert caught.value.current is RunStatus.RUNNING
    assert caught.value.target == "sideways"


def test_a_move_naming_no_status_is_refused_as_a_move_to_none() -> None:
    with pytest.raises(InvalidTransition) as caught:
        checked_status_change(RunStatus.PAUSED, {"reason": "no target"})
    assert str(caught.value) == "cannot move a run from paused to None: not a run status"
    assert caught.value.target == "None"


def test_a_reason_is_stored_trimmed_even_when_the_data_names_where_the_run_was() -> None:
    data = {"from": "running", "to": "paused", "reason": "  a break \n"}
    assert checked_status_change(RunStatus.RUNNING, data) == {
        "from": "running",
        "to": "paused",
        "reason": "a break",
    }
    assert data["reason"] == "  a break \n"  # the caller's data is not changed


def test_a_move_to_running_drops_the_reason_given_even_with_from_named() -> None:
    data = {"from": "paused", "to": "running", "reason": "back to it"}
    assert checked_status_change(RunStatus.PAUSED, data) == {
        "from": "paused",
        "to": "running",
        "reason": None,
    }


def test_from_is_what_the_run_was_whatever_the_data_claims() -> None:
    data = {"from": "queued", "to": "paused", "reason": "a break"}
    assert checked_status_change(RunStatus.RUNNING, data) == {
        "from": "running",
        "to": "paused",
        "reason": "a break",
    }


def test_a_status_change_needing_nothing_filled_in_is_stored_as_written() -> None:
    """Nothing is added to data that already names where the run was and the reason
    to store: a move to running written without a reason keeps no ``reason`` key."""
    data = {"from": "paused", "to": "running"}
    checked = checked_status_change(RunStatus.PAUSED, data)
    assert checked == {"from": "paused", "to": "running"}
    assert "reason" not in checked
    complete = {"from": "running", "to": "paused", "reason": "a break", "note": 1}
    assert checked_status_change(RunStatus.RUNNING, complete) == complete


def test_a_status_change_without_from_gets_it_and_its_reason_key() -> None:
    assert checked_status_change(RunStatus.PAUSED, {"to": "running"}) == {
        "to": "running",
        "from": "paused",
        "reason": None,
    }
