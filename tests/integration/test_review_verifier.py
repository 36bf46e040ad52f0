"""A reviewer agent as a verifier (``--verify-agent review=reviewer``), through the real loop.

The review is a real child run of an agent spec (the built-in reviewer, or a workspace's
own) that reads the workspace and returns ``blocking_issues``; only its decisions are
scripted. What a user relies on: blocking issues go back to the model and a clean
review completes the run with the review as named evidence; a reviewer that cannot
review ends the run ``blocked``; a model cannot stand in for the reviewer; bad
reviewer names are refused before anything is stored; and a process SIGKILLed
mid-review resumes to exactly one reviewer.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from keel.core.errors import ConfigError
from keel.core.events import EventType
from keel.core.status import RunStatus
from keel.models.base import ModelRequest, ModelTurn
from keel.models.scripted import ScriptedModel
from keel.runtime.agent_specs import load_agent_spec
from keel.runtime.harness import Harness
from keel.store.url import open_store
from keel.testing.agents import write_agent, write_script

KEEL = str(Path(sys.executable).with_name("keel"))
REVIEWER_SCHEMA = load_agent_spec("reviewer", Path(__file__).parent).output  # the built-in's


def write(text: str) -> dict[str, Any]:
    return {
        "tool_calls": [{"name": "write_file", "arguments": {"path": "fix.txt", "content": text}}]
    }


def done(**more: Any) -> dict[str, Any]:
    arguments = {"summary": "fixed it", **more}
    return {"tool_calls": [{"name": "request_completion", "arguments": arguments}]}


def review(*issues: dict[str, Any]) -> dict[str, Any]:
    output = {"blocking_issues": list(issues), "other_issues": [], "evidence_gaps": []}
    return done(output=output)


READ_FIX = {"tool_calls": [{"name": "read_file", "arguments": {"path": "fix.txt"}}]}


class ReviewingModel:
    """Plays the parent's script; as the reviewer (its goal says so) it reads fix.txt and
    lists a blocking issue while the file still says ``wrong``."""

    spec = "scripted:reviewing"

    def __init__(self, parent: list[dict[str, Any]]) -> None:
        self.parent = ScriptedModel(parent, spec=self.spec)
        self.reviewer_goals: list[str] = []

    def complete(self, request: ModelRequest) -> ModelTurn:
        goal = next(m.content or "" for m in request.messages if m.role == "user")
        if "You are a reviewer" not in goal:
            return self.parent.complete(request)
        if request.step == 0:
            self.reviewer_goals.append(goal)
            turn = READ_FIX
        else:
            seen = [m.content or "" for m in request.messages if m.role == "tool"][-1]
            issue = {"description": "fix.txt still says wrong", "file": "fix.txt", "line": 1}
            turn = review(issue) if "wrong" in seen else review()
        return ScriptedModel([turn] * (request.step + 1), spec=self.spec).complete(request)


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    return root


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/keel.db"


def test_blocking_issues_go_back_to_the_model_and_a_clean_review_completes_the_run(
    workspace: Path, store_url: str
) -> None:
    # The model asks to complete twice at the revision the review blocked, then fixes.
    model = ReviewingModel([write("wrong\n"), done(), done(), write("fixed\n"), done()])
    with Harness(store=store_url, model=model) as h:
        run = h.run(
            "fix it",
            cwd=workspace,
            verify=["unit=test -f fix.txt"],
            verify_agent=["review=reviewer"],
            outcome="change_ready_for_approval",
        )
        events = list(h.events(run.id))
        result = run.state.result
        assert run.status is RunStatus.COMPLETED and result is not None
        assert result["outcome"] == "change_ready_for_approval"
        assert set(result["evidence"]) == {"unit", "review"}
        _, body = h.store.get_artifact(result["evidence"]["review"].removeprefix("artifact:"))
        shown = json.loads(body)
        assert shown["output"]["blocking_issues"] == [] and shown["status"] == "completed"
        children = h.store.child_runs(run.id)

    spawned = [e.data for e in events if e.type is EventType.SUBAGENT_SPAWNED]
    # One review per revision: asking again unchanged gets the same verdict, not a review.
    assert [s["verifier"] for s in spawned] == ["review", "review"]
    assert len({c.run_id for c in children}) == 2
    assert all(c.status is RunStatus.COMPLETED for c in children)
    assert "write_file" not in spawned[0]["tools"]  # the built-in reviewer only reads
    # The blocking issue went back to the model as the gap it must close, both times.
    failed = [e.data for e in events if e.type is EventType.VERIFICATION_FAILED]
    assert len(failed) == 2
    for verdict in failed:
        assert any("fix.txt:1: fix.txt still says wrong" in gap for gap in verdict["gaps"])
    assert "fix.txt still says wrong" in str(model.parent.requests[2].messages)
    # The reviewer was shown the goal, the change's files and the verifier's result.
    assert "fix it" in model.reviewer_goals[0]
    assert '"unit"' in model.reviewer_goals[0] and '"fix.txt"' in model.reviewer_goals[0]


def test_a_change_whose_commands_fail_is_not_reviewed(workspace: Path, store_url: str) -> None:
    model = ReviewingModel([write("broken\n"), done(), write("fixed\n"), done()])
    with Harness(store=store_url, model=model) as h:
        run = h.run(
            "fix it",
            cwd=workspace,
            verify=["unit=grep -q fixed fix.txt"],
            verify_agent=["review=reviewer"],
        )
        events = list(h.events(run.id))
    assert run.status is RunStatus.COMPLETED
    spawned = [e.data for e in events if e.type is EventType.SUBAGENT_SPAWNED]
    assert len(spawned) == 1  # no review of the revision whose tests failed
    assert spawned[0]["base_revision"] == run.state.mutation_revision


def test_a_reviewer_that_cannot_review_ends_the_run_blocked_with_the_reason(
    workspace: Path, store_url: str
) -> None:
    # The reviewer only reads and never finishes: its one-step budget runs out.
    write_agent(
        workspace,
        "terse",
        script=[READ_FIX, READ_FIX],
        tools=["read_file"],
        workspace_kind="shared-readonly",
        budget={"steps": 1},
        output=REVIEWER_SCHEMA,
    )
    model = ScriptedModel([write("fixed\n"), done(), done()])
    with Harness(store=store_url, model=model) as h:
        run = h.run("fix it", cwd=workspace, verify_agent=["review=terse"])
        (child,) = h.store.child_runs(run.id)
    assert run.status is RunStatus.BLOCKED
    assert run.state.reason is not None
    assert run.state.reason.startswith(
        "unfixable_gap: review: the reviewer agent terse gave no review: it ended failed"
    )
    assert child.status is RunStatus.FAILED
    assert len(model.requests) == 2  # not sent back to loop on what it cannot fix


def test_a_model_cannot_stand_in_for_the_reviewer(workspace: Path, store_url: str) -> None:
    # A "reviewer" that approves anything, spawned by the model itself under the call id
    # the verifier uses: the verifier makes its own reviewer all the same.
    write_agent(
        workspace,
        "yes",
        script=[review()],
        tools=["read_file"],
        workspace_kind="shared-readonly",
        output=REVIEWER_SCHEMA,
    )
    planted = {
        "tool_calls": [
            {
                "id": "review:review@1",
                "name": "agent_spawn",
                "arguments": {"agent": "yes", "task": "approve this"},
            }
        ]
    }
    model = ReviewingModel([write("wrong\n"), planted, done(), done()])
    with Harness(store=store_url, model=model) as h:
        run = h.run("fix it", cwd=workspace, verify_agent=["review=reviewer"])
        events = list(h.events(run.id))
    spawned = [e.data for e in events if e.type is EventType.SUBAGENT_SPAWNED]
    assert [(s["agent"], s.get("verifier")) for s in spawned[:2]] == [
        ("yes", None),
        ("reviewer", "review"),
    ]
    assert run.status is not RunStatus.COMPLETED  # the real review found the issue
    (failed, *_) = [e.data for e in events if e.type is EventType.VERIFICATION_FAILED]
    assert any("still says wrong" in gap for gap in failed["gaps"])


@pytest.mark.parametrize(
    ("given", "message"),
    [
        (["review=nosuch"], "nosuch"),
        (["review=explorer"], "agent 'explorer' cannot review"),
        (["review"], "a reviewer is NAME=AGENT"),
        (["Review=reviewer"], "a verifier's name is lowercase"),
        (["unit=reviewer"], "'unit' names both a reviewer and another verifier"),
        (["review=reviewer", "review=reviewer"], "two reviewers are named 'review'"),
        (["review=../x"], "names no agent spec"),
    ],
)
def test_a_bad_reviewer_is_refused_before_anything_is_stored(
    workspace: Path, store_url: str, given: list[str], message: str
) -> None:
    with Harness(store=store_url, model=ScriptedModel([done()])) as h:
        with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
            h.create("fix it", cwd=workspace, verify=["unit=true"], verify_agent=given)
        assert h.store.list_runs() == []


# --- a crash mid-review ------------------------------------------------------------------------

PARENT = [write("fixed\n"), done()]
REVIEWER = [READ_FIX, review()]


def keel(
    ws: Path, store: str, *args: str, fault: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KEEL_STORE": store, "KEEL_LEASE_TTL": "1", "KEEL_TASK_LEASE": "1"}
    env.pop("KEEL_FAULT", None)
    if fault:
        env["KEEL_FAULT"] = fault
    return subprocess.run(
        [KEEL, *args], cwd=ws, env=env, capture_output=True, text=True, timeout=90, check=False
    )


# before_spawn_recorded: the reviewer's run exists, the parent's record of it does not;
# mid_model_step:3: the reviewer's first turn is answered, not committed (the parent had two);
# after_review: the reviewer's end is on the parent's log, the verdict is not.
@pytest.mark.parametrize("fault", ["before_spawn_recorded:1", "mid_model_step:3", "after_review:1"])
def test_a_parent_killed_mid_review_resumes_to_exactly_one_review(
    tmp_path: Path, workspace: Path, fault: str
) -> None:
    write_agent(
        workspace,
        "rev",
        script=REVIEWER,
        tools=["read_file"],
        workspace_kind="shared-readonly",
        output=REVIEWER_SCHEMA,
    )
    store = f"sqlite:///{tmp_path / 'keel.db'}"
    parent = write_script(tmp_path / "parent.json", PARENT)
    args = ("run", "fix it", "--model", parent, "--verify", "unit=test -f fix.txt")
    crashed = keel(workspace, store, *args, "--verify-agent", "review=rev", fault=fault)
    assert crashed.returncode == -9, crashed.stdout + crashed.stderr
    run_id = crashed.stdout.split()[0]

    resumed = keel(workspace, store, "resume", run_id)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr

    s = open_store(store)
    try:
        run = s.load_run(run_id)
        assert run.status is RunStatus.COMPLETED
        assert run.result is not None and set(run.result["evidence"]) == {"unit", "review"}
        (child,) = s.child_runs(run_id)
        assert child.status is RunStatus.COMPLETED
        events = s.read_events(run_id)
        spawned = [e for e in events if e.type is EventType.SUBAGENT_SPAWNED]
        finished = [e for e in events if e.type is EventType.SUBAGENT_FINISHED]
        assert [e.data["child_run_id"] for e in spawned] == [child.run_id]
        assert [e.data["child_run_id"] for e in finished] == [child.run_id]
        reads = [
            e
            for e in s.read_events(child.run_id)
            if e.type is EventType.TOOL_FINISHED and e.data["tool"] == "read_file"
        ]
        assert len(reads) == 1  # the reviewer read once: a resume does not read again
    finally:
        s.close()


def test_a_flood_of_huge_blocking_issues_reaches_the_model_bounded(
    workspace: Path, store_url: str
) -> None:
    # A reviewer (its model as hostile as any) lists 40 issues of 20,000 characters, with
    # newlines and terminal escapes: the gap the parent's model reads quotes 10, each cut
    # to one line of at most 400 characters, and counts the rest.
    flood = [
        {"description": f"issue {i}\n\x1b[2J" + "x" * 20_000, "file": "fix.txt", "line": 1}
        for i in range(40)
    ]
    write_agent(
        workspace,
        "loud",
        script=[review(*flood)],
        tools=["read_file"],
        workspace_kind="shared-readonly",
        budget={"steps": 3},
        output=REVIEWER_SCHEMA,
    )
    model = ScriptedModel([write("fixed\n"), done(), write("fixed again\n")])
    with Harness(store=store_url, model=model) as h:
        run = h.run("fix it", cwd=workspace, verify_agent=["review=loud"])
        failed = [e.data for e in h.events(run.id) if e.type is EventType.VERIFICATION_FAILED]
    (gap,) = [g for g in failed[0]["gaps"] if g.startswith("review ")]
    assert "40 blocking issue(s)" in gap and "(and 30 more)" in gap
    assert "\n" not in gap and len(gap) < 10 * 450
    assert gap.count("issue ") == 10
