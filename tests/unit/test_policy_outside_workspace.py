"""A path outside the workspace is refused by the workspace check itself, whatever rules match."""

from __future__ import annotations

from pathlib import Path

from keel.policy import Decision, Mode, Policy
from keel.policy.rules import Rule


def test_an_outside_path_is_refused_as_outside_even_when_a_deny_rule_matches_too() -> None:
    policy = Policy(rules=(Rule(action="deny", tool="*", origin="team.toml:1"),))

    decision = policy.decide(
        "read_file", "read", {"path": "../x"}, mode=Mode.EDIT, workspace=Path("/srv/w")
    )

    assert decision == Decision(
        action="deny",
        rule="workspace",
        reason="path '../x' is outside the workspace /srv/w; use a path inside it",
    )
