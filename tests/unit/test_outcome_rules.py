"""Outcome-shaped results (pure): named evidence, a declared outcome, the actions left,
people's sign-offs bound to a revision, and gaps the agent cannot fix."""

from __future__ import annotations

from typing import Any

import pytest
from test_decide import Run

from keel.core.errors import ConfigError
from keel.core.events import EventType, NewEvent
from keel.core.records import ValidationRecord
from keel.core.state import transition
from keel.core.status import RunStatus
from keel.core.verifiers import (
    check_outcome,
    check_signoffs,
    evidence_map,
    named_verifiers,
    split_verifier,
)
from keel.loop.actions import CallModel, RunVerifiers
from keel.loop.outcomes import after_verification


def record(command: str, revision: int, code: int, artifact: str = "art_1") -> ValidationRecord:
    return ValidationRecord(
        command=command,
        exit_code=code,
        duration_s=0.1,
        artifact=artifact,
        mutation_revision=revision,
        file_hashes={},
        passed=code == 0,
    )


def run_with(**options: Any) -> Run:
    run = Run(verify=options.pop("verify", ()), options=options)
    run.add(
        transition(
            run.state,
            RunStatus.VERIFYING,
            "completion requested",
            result={"summary": "bumped the dependency", "remaining_actions": ["release it"]},
        )
    )
    return run


def test_split_names_a_verifier_only_with_a_lowercase_name() -> None:
    assert split_verifier("unit_tests=pytest -q") == ("unit_tests", "pytest -q")
    assert split_verifier("FOO=1 pytest") == (None, "FOO=1 pytest")  # an env assignment
    assert split_verifier("pytest -q") == (None, "pytest -q")
    assert split_verifier("lint=") == (None, "lint=")
    commands, names = named_verifiers(["unit_tests=pytest -q", "ruff check ."])
    assert commands == ("pytest -q", "ruff check .")
    assert names == ("unit_tests", "ruff check .")
    assert named_verifiers(["pytest -q"]) == (("pytest -q",), None)
    assert named_verifiers({"unit": "pytest"}) == (("pytest",), ("unit",))


@pytest.mark.parametrize(
    ("verify", "message"),
    [
        (["a=x", "a=y"], "two verifiers are named 'a'"),
        (["pytest", "pytest"], "two verifiers are named 'pytest'"),
        (["a=pytest", "b=pytest"], "the verifier command 'pytest' is given twice"),
        ({"Bad Name": "x"}, "a verifier's name is lowercase"),
        ([" "], "command is empty"),
    ],
)
def test_bad_verifiers_are_precise_errors(verify: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        named_verifiers(verify)


def test_bad_signoffs_and_outcomes_are_precise_errors() -> None:
    with pytest.raises(ConfigError, match="names both a command verifier and a sign-off"):
        check_signoffs(["unit"], ["unit"])
    with pytest.raises(ConfigError, match="two sign-offs are named 'ana'"):
        check_signoffs(["ana", "ana"], [])
    with pytest.raises(ConfigError, match="an outcome is a lowercase name"):
        check_outcome("Ready!")
    check_outcome("change_ready_for_approval")


def test_a_completed_result_files_evidence_by_name_with_its_outcome_and_remaining_actions() -> None:
    run = run_with(
        verify=("pytest -q", "ruff check ."),
        verifier_names=("unit_tests", "ruff check ."),
        outcome="change_ready_for_approval",
    )
    checks = [record("pytest -q", 0, 0, "art_u"), record("ruff check .", 0, 0, "art_l")]
    run.add(*after_verification(run.state, checks, elapsed_s=0.1, diff_artifact="art_d"))
    result = run.state.result
    assert run.state.status is RunStatus.COMPLETED and result is not None
    assert result["outcome"] == "change_ready_for_approval"
    assert result["evidence"] == {
        "unit_tests": "artifact:art_u",
        "ruff check .": "artifact:art_l",
        "code_diff": "artifact:art_d",
    }
    assert result["remaining_actions"] == ["release it"]
    assert evidence_map(result) == result["evidence"]
    assert evidence_map({"evidence": ["artifact:a", "artifact:b"]}) == {
        "evidence_1": "artifact:a",
        "evidence_2": "artifact:b",
    }


def test_when_only_a_signoff_is_missing_the_run_waits_for_that_person() -> None:
    run = run_with(verify=("pytest -q",), signoffs=("security",))
    events = after_verification(run.state, [record("pytest -q", 0, 0)], elapsed_s=0.1)
    run.add(*events)
    assert [e.type for e in events] == [
        EventType.STATUS_CHANGED,
        EventType.SIGNOFF_REQUESTED,
        EventType.STATUS_CHANGED,
    ]
    assert run.state.status is RunStatus.WAITING
    assert run.state.reason == "signoff:security"
    assert run.state.pending is not None and run.state.pending.kind == "signoff"
    assert run.state.latest_validation("pytest -q") is not None  # the records are kept

    signed = NewEvent(
        type=EventType.SIGNOFF_RECORDED,
        data={
            "verifier": "security",
            "passed": True,
            "by": "ana",
            "artifact": "art_s",
            "mutation_revision": 0,
        },
    )
    run.add(signed, transition(run.state, RunStatus.RUNNING, None))
    run.add(transition(run.state, RunStatus.VERIFYING, "signed off by ana"))
    action = run.decide()
    assert isinstance(action, RunVerifiers) and action.commands == ()  # tests passed already
    run.add(*after_verification(run.state, [], elapsed_s=0.0))
    assert run.state.status is RunStatus.COMPLETED
    assert run.state.result is not None
    assert run.state.result["evidence"] == {
        "pytest -q": "artifact:art_1",
        "security": "artifact:art_s",
    }


def test_a_signoff_goes_stale_when_files_change_after_it() -> None:
    run = run_with(signoffs=("security",))
    run.add(
        NewEvent(
            type=EventType.SIGNOFF_RECORDED,
            data={"verifier": "security", "passed": True, "mutation_revision": 0},
        )
    )
    assert run.state.unsigned() == []
    run.add(NewEvent(type=EventType.WORKSPACE_CHANGED, data={"changed_files": {"a": "h"}}))
    assert run.state.unsigned() == ["security"]
    assert any("needs a person's sign-off" in g for g in run.state.verification_gaps())


def test_a_declined_signoff_is_a_gap_with_the_persons_reason() -> None:
    run = run_with(signoffs=("security",))
    run.add(
        NewEvent(
            type=EventType.SIGNOFF_RECORDED,
            data={
                "verifier": "security",
                "passed": False,
                "note": "declined by ana: the token is logged",
                "mutation_revision": 0,
            },
        )
    )
    assert run.state.unsigned() == ["security"]
    assert "security: declined by ana: the token is logged" in run.state.verification_gaps()


def test_a_verifier_that_cannot_run_ends_the_run_blocked_instead_of_looping() -> None:
    run = run_with(verify=("pytest -q", "mypy ."), verifier_names=("unit_tests", "types"))
    checks = [record("pytest -q", 0, 1), record("mypy .", 0, 127)]
    run.add(*after_verification(run.state, checks, elapsed_s=0.1))
    assert run.state.status is RunStatus.BLOCKED
    assert run.state.reason == "unfixable_gap: types: the command was not found"
    assert run.state.result is not None
    assert run.state.result["unfixable"] == ["types: the command was not found"]


def test_a_failing_verifier_that_ran_is_fixable_and_goes_back_to_the_model() -> None:
    run = run_with(verify=("pytest -q",), verifier_names=("unit_tests",))
    run.add(*after_verification(run.state, [record("pytest -q", 0, 1)], elapsed_s=0.1))
    assert run.state.status is RunStatus.RUNNING
    assert "unit_tests (pytest -q): failed with exit code 1" in run.notes()[-1]
    assert isinstance(run.decide(), CallModel)
