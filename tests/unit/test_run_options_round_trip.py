"""A run's options as the store keeps them (keel.core.records.RunOptions): every field
reads back as it was set, a field left at its default is not written, and options
written before a field existed read its default."""

from __future__ import annotations

import json

from keel.core.budget import Budget
from keel.core.records import RunOptions

EVERY_FIELD = RunOptions(
    model="openai:gpt-4o",
    mode="auto",
    verify=("pytest -q", "ruff check ."),
    budget=Budget(max_steps=9, max_cost=1.5),
    approval_timeout_s=60.0,
    grant_ttl_s=90.0,
    plan_then="auto",
    policy={"rules": []},
    sandbox={"mode": "off"},
    tools=("read_file", "grep"),
    depth=2,
    root_id="run_root",
    agent={"name": "coder", "digest": "d"},
    output_schema={"type": "object"},
    workspace_kind="isolated",
    isolated={"path": "/wt"},
    workspace_git={"url": "https://example.com/r.git", "ref": "main"},
    skills=({"name": "s", "description": "d", "digest": "x"},),
    creator="token:ci",
    follows="run_before",
    context_tokens=5000,
    context_summary=True,
    verifier_names=("unit_tests", "lint"),
    signoffs=("ana",),
    reviewers=(("review", "reviewer"),),
    outcome="fixed",
    tags={"suite": "coding"},
)

BASE_KEYS = {
    "model": None,
    "mode": "edit",
    "verify": [],
    "budget": Budget().to_dict(),
    "approval_timeout_s": None,
    "grant_ttl_s": None,
    "plan_then": None,
    "policy": None,
    "sandbox": None,
}


def test_every_option_survives_the_round_trip_through_json() -> None:
    stored = json.loads(json.dumps(EVERY_FIELD.to_dict()))
    assert RunOptions.from_dict(stored) == EVERY_FIELD


def test_every_option_is_stored_under_its_own_name() -> None:
    assert EVERY_FIELD.to_dict() == {
        "model": "openai:gpt-4o",
        "mode": "auto",
        "verify": ["pytest -q", "ruff check ."],
        "budget": Budget(max_steps=9, max_cost=1.5).to_dict(),
        "approval_timeout_s": 60.0,
        "grant_ttl_s": 90.0,
        "plan_then": "auto",
        "policy": {"rules": []},
        "sandbox": {"mode": "off"},
        "tools": ["read_file", "grep"],
        "depth": 2,
        "skills": [{"name": "s", "description": "d", "digest": "x"}],
        "context_summary": True,
        "verifier_names": ["unit_tests", "lint"],
        "signoffs": ["ana"],
        "reviewers": [{"name": "review", "agent": "reviewer"}],
        "root_id": "run_root",
        "agent": {"name": "coder", "digest": "d"},
        "output_schema": {"type": "object"},
        "workspace_kind": "isolated",
        "isolated": {"path": "/wt"},
        "workspace_git": {"url": "https://example.com/r.git", "ref": "main"},
        "creator": "token:ci",
        "follows": "run_before",
        "context_tokens": 5000,
        "outcome": "fixed",
        "tags": {"suite": "coding"},
    }


def test_a_top_level_runs_options_store_only_the_base_fields() -> None:
    assert RunOptions().to_dict() == BASE_KEYS


def test_options_stored_before_the_fields_existed_read_their_defaults() -> None:
    assert RunOptions.from_dict({}) == RunOptions(budget=Budget.from_dict({}))
    assert RunOptions.from_dict(BASE_KEYS) == RunOptions()


def test_a_stored_context_size_and_depth_read_as_numbers() -> None:
    options = RunOptions.from_dict({"depth": "1", "context_tokens": "4096"})
    assert (options.depth, options.context_tokens) == (1, 4096)
    assert options.is_child and not RunOptions().is_child


def test_a_verify_command_is_filed_under_its_name_and_an_unnamed_one_under_itself() -> None:
    assert EVERY_FIELD.verifier_name("ruff check .") == "lint"
    assert EVERY_FIELD.verifier_name("make test") == "make test"
    assert RunOptions(verify=("pytest",)).verifier_name("pytest") == "pytest"
