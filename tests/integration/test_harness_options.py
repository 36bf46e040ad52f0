"""``Harness.create`` checks budgets and times before anything is stored (real SQLite file)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from keel.core.budget import Budget
from keel.core.errors import ConfigError
from keel.models.scripted import ScriptedModel
from keel.runtime.harness import Harness

DONE = {"content": "done"}


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"approval_timeout": -5}, "approval_timeout must be a number of seconds above 0"),
        ({"approval_timeout": 0}, "approval_timeout must be a number of seconds above 0"),
        ({"approval_timeout": math.inf}, "approval_timeout must be a number of seconds"),
        ({"grant_ttl": 0}, "grant_ttl must be a number of seconds above 0"),
        ({"grant_ttl": math.nan}, "grant_ttl must be a number of seconds above 0"),
        ({"budget": Budget(max_steps=0)}, "max_steps must be a whole number from 1 to"),
        ({"budget": Budget(max_tool_calls=-1)}, "max_tool_calls must be a whole number"),
        ({"budget": Budget(max_tokens=0)}, "max_tokens must be a whole number from 1 to"),
        ({"budget": Budget(max_cost=math.nan)}, "max_cost must be a finite number above 0"),
        ({"budget": Budget(max_cost=0.0)}, "max_cost must be a finite number above 0"),
        ({"budget": Budget(max_wall_seconds=-1)}, "max_wall_seconds must be a number of seconds"),
    ],
)
def test_an_argument_out_of_range_is_a_config_error_and_nothing_is_stored(
    tmp_path: Path, arguments: dict[str, Any], message: str
) -> None:
    with Harness(store=f"sqlite:///{tmp_path}/keel.db", model=ScriptedModel([DONE])) as h:
        with pytest.raises(ConfigError, match=message):
            h.create("fix it", cwd=tmp_path, **arguments)
        with pytest.raises(ConfigError, match=message):
            h.run("fix it", cwd=tmp_path, queued=True, **arguments)

        assert h.store.list_runs() == []


def test_limits_in_range_are_stored_as_given(tmp_path: Path) -> None:
    budget = Budget(max_steps=3, max_tool_calls=9, max_tokens=1000, max_cost=0.5)
    with Harness(store=f"sqlite:///{tmp_path}/keel.db", model=ScriptedModel([DONE])) as h:
        state = h.create("fix it", cwd=tmp_path, budget=budget, approval_timeout=60, grant_ttl=0.25)

    assert state.options.budget == budget
    assert (state.options.approval_timeout_s, state.options.grant_ttl_s) == (60, 0.25)
