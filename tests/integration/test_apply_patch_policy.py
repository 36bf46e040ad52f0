"""apply_patch through the real loop: the gate judges every path inside the patch.

A run's call names only an artifact id; the patch (made by real git from an isolated
workspace, or written by hand where a hostile patch is the point) sits in a real
SQLite store, and the policy file on disk decides. Each test checks what the model
was told and that the workspace is unchanged when the patch was refused.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from keel.core.errors import ToolError
from keel.core.events import Event, EventType
from keel.core.status import RunStatus
from keel.models.scripted import ScriptedModel
from keel.policy import Mode
from keel.policy.containment import ContainedPolicy
from keel.runtime.harness import Harness
from keel.runtime.worktrees import create
from keel.store.base import Store
from keel.store.url import open_store
from keel.testing.stores import make_run
from keel.tools.base import ToolContext
from keel.tools.builtin import default_registry
from keel.tools.patches import PatchPaths, apply_patch


def git(ws: Path, *args: str) -> str:
    base = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com"]
    done = subprocess.run([*base, *args], cwd=ws, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    for rel in ("src/app.py", "docs/guide.md", "secret/key.txt"):
        (ws / rel).parent.mkdir(parents=True, exist_ok=True)
        (ws / rel).write_text(f"{rel} v1\n")
    git(tmp_path, "init", "-q", str(ws))
    git(ws, "add", "-A")
    git(ws, "commit", "-qm", "first")
    return ws


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'keel.db'}"


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    with open_store(store_url) as opened:
        yield opened


def child_patch(parent: Path, tmp_path: Path, change: dict[str, str]) -> bytes:
    child = create(parent, root=tmp_path / "children", name="c1")
    try:
        for rel, text in change.items():
            (child.path / rel).parent.mkdir(parents=True, exist_ok=True)
            (child.path / rel).write_text(text)
        return child.patch()
    finally:
        child.remove()


def hand_patch(path: str) -> bytes:
    return (
        f"diff --git a/{path} b/{path}\nnew file mode 100644\n--- /dev/null\n+++ b/{path}\n"
        "@@ -0,0 +1 @@\n+planted\n"
    ).encode()


def stored(store: Store, repo: Path, patch: bytes) -> str:
    """The id of ``patch`` as an artifact of another run (a child's, say)."""
    owner = make_run(store, workspace=str(repo))
    return store.put_artifact(owner.run_id, "patch.diff", patch).id


def policy(ws: Path, text: str) -> None:
    (ws / ".keel").mkdir(exist_ok=True)
    (ws / ".keel" / "policy.toml").write_text(text)


def applying(artifact: str) -> ScriptedModel:
    return ScriptedModel(
        [
            {"tool_calls": [{"name": "apply_patch", "arguments": {"artifact": artifact}}]},
            {"tool_calls": [{"name": "request_completion", "arguments": {"summary": "done"}}]},
        ]
    )


def failures(events: list[Event]) -> list[dict[str, Any]]:
    return [e.data for e in events if e.type is EventType.TOOL_FAILED]


def files_of(ws: Path) -> dict[str, str]:
    return {
        p.relative_to(ws).as_posix(): p.read_text()
        for p in sorted(ws.rglob("*"))
        if p.is_file() and ".git" not in p.relative_to(ws).parts
    }


def test_apply_patch_is_a_builtin_write_tool_taking_an_artifact() -> None:
    tool = default_registry().get("apply_patch")
    assert tool.effect.value == "write"
    assert list(tool.args_model.model_fields) == ["artifact"]


def test_a_clean_patch_applies_through_the_loop(
    repo: Path, tmp_path: Path, store: Store, store_url: str
) -> None:
    patch = child_patch(repo, tmp_path, {"src/app.py": "src/app.py v2\n", "new.txt": "new\n"})
    artifact = stored(store, repo, patch)
    with Harness(store=store_url, model=applying(artifact)) as h:
        outcome = h.run("integrate the child's work", cwd=repo)
        assert outcome.status is RunStatus.COMPLETED
        events = list(h.events(outcome.state.run_id))
    assert (repo / "src" / "app.py").read_text() == "src/app.py v2\n"
    assert (repo / "new.txt").read_text() == "new\n"
    assert not failures(events)
    assert set(outcome.state.changed_files) == {"src/app.py", "new.txt"}


def test_a_deny_rule_on_one_touched_path_refuses_the_whole_patch(
    repo: Path, tmp_path: Path, store: Store, store_url: str
) -> None:
    policy(repo, '[[rule]]\naction = "deny"\npath = "secret/*"\nreason = "keys stay put"\n')
    patch = child_patch(
        repo, tmp_path, {"src/app.py": "src/app.py v2\n", "secret/key.txt": "stolen\n"}
    )
    artifact = stored(store, repo, patch)
    before = files_of(repo)
    with Harness(store=store_url, model=applying(artifact)) as h:
        outcome = h.run("integrate", cwd=repo)
        events = list(h.events(outcome.state.run_id))
    [failed] = failures(events)
    assert failed["error_kind"] == "policy_denied"
    assert "keys stay put" in failed["message"]
    assert "secret/key.txt" in failed["message"] and "src/app.py" in failed["message"]
    assert files_of(repo) == before


def test_a_deny_rule_written_for_write_file_also_stops_a_patch(
    repo: Path, tmp_path: Path, store: Store, store_url: str
) -> None:
    policy(repo, '[[rule]]\naction = "deny"\ntool = "write_file"\npath = "docs/*"\n')
    patch = child_patch(repo, tmp_path, {"docs/guide.md": "rewritten\n"})
    artifact = stored(store, repo, patch)
    with Harness(store=store_url, model=applying(artifact)) as h:
        outcome = h.run("integrate", cwd=repo)
        events = list(h.events(outcome.state.run_id))
    [failed] = failures(events)
    assert failed["error_kind"] == "policy_denied" and "docs/guide.md" in failed["message"]
    assert (repo / "docs" / "guide.md").read_text() == "docs/guide.md v1\n"


@pytest.mark.parametrize("path", [".keel/policy.toml", ".git/hooks/pre-commit", ".git/config"])
def test_a_patch_touching_a_protected_path_is_refused_by_the_gate(
    repo: Path, store: Store, store_url: str, path: str
) -> None:
    hooks = sorted((repo / ".git" / "hooks").iterdir())
    artifact = stored(store, repo, hand_patch("fine.txt") + hand_patch(path))
    with Harness(store=store_url, model=applying(artifact)) as h:
        outcome = h.run("integrate", cwd=repo, mode="auto")
        events = list(h.events(outcome.state.run_id))
    [failed] = failures(events)
    assert failed["error_kind"] == "policy_denied"
    assert "(rule: protected)" in failed["message"] and path in failed["message"]
    assert not (repo / "fine.txt").exists()
    assert sorted((repo / ".git" / "hooks").iterdir()) == hooks
    assert not (repo / ".keel" / "policy.toml").exists()


def test_an_ask_rule_asks_showing_every_touched_path_and_the_grant_applies_it(
    repo: Path, tmp_path: Path, store: Store, store_url: str
) -> None:
    policy(repo, '[[rule]]\naction = "ask"\npath = "docs/*"\n')
    patch = child_patch(repo, tmp_path, {"docs/guide.md": "v2\n", "src/app.py": "v2\n"})
    artifact = stored(store, repo, patch)
    with Harness(store=store_url, model=applying(artifact)) as h:
        waiting = h.run("integrate", cwd=repo)
        assert waiting.status is RunStatus.WAITING
        run_id = waiting.state.run_id
        [asked] = [e.data for e in h.events(run_id) if e.type is EventType.APPROVAL_REQUESTED]
        assert asked["tool"] == "apply_patch" and asked["arguments"] == {"artifact": artifact}
        assert "docs/guide.md" in asked["reason"] and "src/app.py" in asked["reason"]
        assert (repo / "docs" / "guide.md").read_text() == "docs/guide.md v1\n"
        h.approve(run_id)
        assert h.resume(run_id).status is RunStatus.COMPLETED
    assert (repo / "docs" / "guide.md").read_text() == "v2\n"


def test_a_conflicting_patch_is_the_models_error_with_the_hunk_shown(
    repo: Path, tmp_path: Path, store: Store, store_url: str
) -> None:
    patch = child_patch(repo, tmp_path, {"src/app.py": "child version\n"})
    (repo / "src" / "app.py").write_text("parent version\n")
    artifact = stored(store, repo, patch)
    with Harness(store=store_url, model=applying(artifact)) as h:
        outcome = h.run("integrate", cwd=repo)
        events = list(h.events(outcome.state.run_id))
    [failed] = failures(events)
    assert "src/app.py: 1 of 1 hunk(s) do not apply" in failed["message"]
    assert "+child version" in failed["message"]
    assert (repo / "src" / "app.py").read_text() == "parent version\n"


def test_a_missing_artifact_is_refused_with_its_id(repo: Path, store_url: str) -> None:
    with Harness(store=store_url, model=applying("art_nothing")) as h:
        outcome = h.run("integrate", cwd=repo)
        events = list(h.events(outcome.state.run_id))
    [failed] = failures(events)
    assert "art_nothing" in failed["message"]


def test_without_a_way_to_read_the_patch_the_gate_refuses(repo: Path) -> None:
    decision = ContainedPolicy().decide(
        "apply_patch", "write", {"artifact": "art_x"}, mode=Mode.AUTO, workspace=repo
    )
    assert decision.action == "deny" and "cannot be judged" in decision.reason


def test_plan_mode_refuses_a_patch_like_any_write(repo: Path, store: Store) -> None:
    gate = ContainedPolicy(paths_of=PatchPaths(store))
    artifact = stored(store, repo, hand_patch("fine.txt"))
    decision = gate.decide(
        "apply_patch", "write", {"artifact": artifact}, mode=Mode.PLAN, workspace=repo
    )
    assert decision.action == "deny" and "fine.txt" in decision.reason


def test_with_an_approved_plan_a_patch_may_not_rewrite_the_plan_file(
    repo: Path, store: Store
) -> None:
    run = make_run(store, workspace=str(repo))
    artifact = store.put_artifact(run.run_id, "p.diff", hand_patch("plans/PLAN.md")).id
    approved = replace(run, approved_plan_sha256="0" * 64)
    ctx = ToolContext(
        workspace=repo.resolve(),
        run_id=run.run_id,
        call_id="c1",
        owner="t",
        store=store,
        state=approved,
    )
    with pytest.raises(ToolError, match="holds the approved plan"):
        apply_patch.run(ctx, {"artifact": artifact})
    with pytest.raises(ToolError, match="holds the approved plan"):
        apply_patch.intent(ctx, {"artifact": artifact})
    assert not (repo / "plans").exists()
    apply_patch.run(replace(ctx, state=run), {"artifact": artifact})  # no plan approved
    assert (repo / "plans" / "PLAN.md").read_text() == "planted\n"
