"""The harness's own rules on top of the user's policy: no mode or rule loosens them."""

from __future__ import annotations

from pathlib import Path

import pytest

from keel.core.guard import PathGuard
from keel.policy.containment import ContainedPolicy
from keel.policy.modes import Mode
from keel.policy.rules import Policy, Rule

ALL_MODES = (Mode.PLAN, Mode.ASK, Mode.EDIT, Mode.AUTO)
ALLOW_EVERYTHING = Policy(rules=(Rule(action="allow", tool="*", origin="test:1"),))


def gate(guard: PathGuard | None = None) -> ContainedPolicy:
    return ContainedPolicy(policy=ALLOW_EVERYTHING, guard=guard or PathGuard())


@pytest.mark.parametrize("mode", [Mode.ASK, Mode.EDIT, Mode.AUTO])
@pytest.mark.parametrize(
    "path",
    [
        ".keel/keel.db",
        ".keel/policy.toml",
        "./.keel/config.toml",
        "src/../.keel/x",
        ".git/config",
        ".git/hooks/pre-commit",
    ],
)
def test_protected_paths_are_never_written_whatever_the_mode_or_rules(
    tmp_path: Path, mode: Mode, path: str
) -> None:
    decision = gate().decide(
        "write_file", "write", {"path": path, "content": "x"}, mode=mode, workspace=tmp_path
    )
    assert decision.action == "deny"
    assert decision.permanent
    assert decision.rule == "protected"


def test_a_symlink_to_a_protected_path_is_refused_too(tmp_path: Path) -> None:
    (tmp_path / ".git" / "hooks").mkdir(parents=True)
    (tmp_path / "innocent").symlink_to(tmp_path / ".git" / "hooks")
    decision = gate().decide(
        "write_file",
        "write",
        {"path": "innocent/pre-commit", "content": "x"},
        mode=Mode.AUTO,
        workspace=tmp_path,
    )
    assert (decision.action, decision.rule) == ("deny", "protected")


def test_the_store_inside_the_workspace_is_protected(tmp_path: Path) -> None:
    guarded = gate(guard=PathGuard(store_paths=("data/keel.db", "data/keel.db-wal")))
    decision = guarded.decide(
        "edit_file",
        "write",
        {"path": "data/keel.db-wal", "old_text": "a", "new_text": "b"},
        mode=Mode.AUTO,
        workspace=tmp_path,
    )
    assert decision.action == "deny"


@pytest.mark.parametrize("mode", [Mode.ASK, Mode.EDIT, Mode.AUTO])
def test_other_writes_below_git_need_approval_in_every_mode(tmp_path: Path, mode: Mode) -> None:
    decision = gate().decide(
        "write_file", "write", {"path": ".git/HEAD", "content": "x"}, mode=mode, workspace=tmp_path
    )
    assert (decision.action, decision.rule) == ("ask", "git")


@pytest.mark.parametrize("mode", ALL_MODES)
@pytest.mark.parametrize("path", [".env", "config/.env.production", ".env.local"])
def test_reading_secret_files_needs_approval_in_every_mode(
    tmp_path: Path, mode: Mode, path: str
) -> None:
    decision = gate().decide("read_file", "read", {"path": path}, mode=mode, workspace=tmp_path)
    assert (decision.action, decision.rule) == ("ask", "secret")


def test_the_policy_can_name_more_secret_paths(tmp_path: Path) -> None:
    guarded = gate(guard=PathGuard(secret=(".env", "credentials/*")))
    decision = guarded.decide(
        "grep",
        "read",
        {"pattern": "x", "path": "credentials/aws"},
        mode=Mode.AUTO,
        workspace=tmp_path,
    )
    assert decision.action == "ask"
    plain = guarded.decide(
        "read_file", "read", {"path": "README"}, mode=Mode.AUTO, workspace=tmp_path
    )
    assert plain.action == "allow"


@pytest.mark.parametrize(
    "argv",
    [
        ["git", "commit", "-m", "x"],
        ["git", "-C", ".", "branch", "feature"],
        ["sh", "-c", "git add . && git commit -m wip"],
        ["env", "GIT_AUTHOR_NAME=x", "git", "reset", "--hard"],
    ],
)
def test_commands_that_write_the_repository_need_approval_even_in_auto(
    tmp_path: Path, argv: list[str]
) -> None:
    decision = gate().decide(
        "run_command", "execute", {"argv": argv}, mode=Mode.AUTO, workspace=tmp_path
    )
    assert decision.action == "ask"
    assert decision.writes_git


@pytest.mark.parametrize("argv", [["git", "status"], ["git", "log", "-3"], ["pytest", "-q"]])
def test_read_only_commands_do_not_get_a_writable_git(tmp_path: Path, argv: list[str]) -> None:
    decision = ContainedPolicy().decide(
        "run_command", "execute", {"argv": argv}, mode=Mode.AUTO, workspace=tmp_path
    )
    assert decision.action == "allow"
    assert not decision.writes_git


def test_auto_mode_asks_before_commands_when_no_sandbox_confines_them(tmp_path: Path) -> None:
    unconfined = ContainedPolicy(sandboxed=False)
    decision = unconfined.decide(
        "run_command", "execute", {"argv": ["pytest"]}, mode=Mode.AUTO, workspace=tmp_path
    )
    assert (decision.action, decision.rule) == ("ask", "sandbox")
    confined = ContainedPolicy(sandboxed=True).decide(
        "run_command", "execute", {"argv": ["pytest"]}, mode=Mode.AUTO, workspace=tmp_path
    )
    assert confined.action == "allow"


def test_an_explicit_allow_rule_still_lets_a_command_run_without_a_sandbox(tmp_path: Path) -> None:
    policy = Policy(rules=(Rule(action="allow", tool="run_command", argv="pytest*"),))
    decision = ContainedPolicy(policy=policy, sandboxed=False).decide(
        "run_command", "execute", {"argv": ["pytest", "-q"]}, mode=Mode.AUTO, workspace=tmp_path
    )
    assert decision.action == "allow"


def test_plan_write_is_a_write_of_the_plan_file(tmp_path: Path) -> None:
    plain = ContainedPolicy()
    in_plan = plain.decide(
        "plan_write", "write", {"content": "x"}, mode=Mode.PLAN, workspace=tmp_path
    )
    assert in_plan.action == "allow"
    in_ask = plain.decide(
        "plan_write", "write", {"content": "x"}, mode=Mode.ASK, workspace=tmp_path
    )
    assert in_ask.action == "ask"
    denied = ContainedPolicy(
        policy=Policy(rules=(Rule(action="deny", path="plans/*", origin="p:1"),))
    ).decide("plan_write", "write", {"content": "x"}, mode=Mode.PLAN, workspace=tmp_path)
    assert denied.action == "deny"


def test_a_deny_rule_of_the_user_is_kept(tmp_path: Path) -> None:
    policy = Policy(rules=(Rule(action="deny", tool="write_file", origin="p:1"),))
    decision = ContainedPolicy(policy=policy).decide(
        "write_file",
        "write",
        {"path": "a.txt", "content": ""},
        mode=Mode.AUTO,
        workspace=tmp_path,
    )
    assert decision.action == "deny"
    assert decision.rule.startswith("p:1")


def test_a_protected_path_spelled_absolute_inside_the_workspace_is_held_the_same(
    tmp_path: Path,
) -> None:
    def decide(tool: str, effect: str, path: str) -> tuple[str, str]:
        decision = gate().decide(
            tool,
            effect,
            {"path": str(tmp_path / path), "content": "x"},
            mode=Mode.AUTO,
            workspace=tmp_path,
        )
        return decision.action, decision.rule

    assert decide("write_file", "write", ".keel/policy.toml") == ("deny", "protected")
    assert decide("write_file", "write", ".git/HEAD") == ("ask", "git")
    assert decide("read_file", "read", ".env") == ("ask", "secret")
    assert decide("write_file", "write", "src/app.py") == ("allow", "test:1 allow *")
