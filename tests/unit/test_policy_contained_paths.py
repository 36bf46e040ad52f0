"""ContainedPolicy beyond the basics: a call whose written paths are in its content
(apply_patch) is judged as a write of each path, and every tightening says why."""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from keel.core.errors import ToolError
from keel.policy.containment import ContainedPolicy, path_spellings
from keel.policy.modes import Decision, Mode
from keel.policy.rules import Policy, Rule


class Paths:
    """A ``paths_of`` that knows apply_patch calls by their ``files`` argument."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, tool: str, arguments: Mapping[str, Any]) -> Sequence[str] | None:
        self.asked.append((tool, dict(arguments)))
        if tool != "apply_patch":
            return None
        files = arguments["files"]
        if files == "unreadable":
            raise ToolError("the patch artifact art_x cannot be read")
        return list(files)


def patch(gate: ContainedPolicy, files: Any, *, mode: Mode, workspace: Path) -> Decision:
    return gate.decide("apply_patch", "write", {"files": files}, mode=mode, workspace=workspace)


def test_a_patch_is_judged_as_a_write_of_each_file_it_touches(tmp_path: Path) -> None:
    paths = Paths()
    gate = ContainedPolicy(paths_of=paths)
    allowed = patch(gate, ["src/a.py", "src/b.py"], mode=Mode.EDIT, workspace=tmp_path)
    assert allowed == Decision(
        action="allow",
        rule="mode:edit",
        reason="write calls are allowed in edit mode (it writes: src/a.py, src/b.py)",
    )
    assert paths.asked == [("apply_patch", {"files": ["src/a.py", "src/b.py"]})]
    asked = patch(gate, ["src/a.py"], mode=Mode.ASK, workspace=tmp_path)
    assert (asked.action, asked.rule) == ("ask", "mode:ask")


def test_the_strictest_decision_on_any_file_stands_naming_every_file(tmp_path: Path) -> None:
    gate = ContainedPolicy(paths_of=Paths())
    decision = patch(
        gate, ["src/a.py", ".git/hooks/x", ".git/HEAD"], mode=Mode.AUTO, workspace=tmp_path
    )
    assert (decision.action, decision.rule, decision.permanent) == ("deny", "protected", True)
    assert decision.reason.endswith("(it writes: src/a.py, .git/hooks/x, .git/HEAD)")
    git = patch(gate, ["src/a.py", ".git/HEAD"], mode=Mode.AUTO, workspace=tmp_path)
    assert (git.action, git.rule) == ("ask", "git")


def test_rules_on_write_file_judge_the_files_a_patch_writes(tmp_path: Path) -> None:
    policy = Policy(rules=(Rule(action="deny", tool="write_file", path="vendor/*", origin="p:3"),))
    gate = ContainedPolicy(policy=policy, paths_of=Paths())
    decision = patch(gate, ["src/a.py", "vendor/lib.py"], mode=Mode.AUTO, workspace=tmp_path)
    assert decision.action == "deny" and decision.rule.startswith("p:3")
    assert decision.reason.endswith("(it writes: src/a.py, vendor/lib.py)")
    own = Policy(rules=(Rule(action="ask", tool="apply_patch", origin="p:4"),))
    asked = patch(
        ContainedPolicy(policy=own, paths_of=Paths()), ["a"], mode=Mode.AUTO, workspace=tmp_path
    )
    assert asked.action == "ask" and asked.rule.startswith("p:4")


def test_a_patch_of_many_files_names_the_first_forty(tmp_path: Path) -> None:
    files = [f"f{i}.py" for i in range(41)]
    decision = patch(ContainedPolicy(paths_of=Paths()), files, mode=Mode.EDIT, workspace=tmp_path)
    assert decision.reason.endswith(f"(it writes: {', '.join(files[:40])} … (1 more))")
    forty = patch(ContainedPolicy(paths_of=Paths()), files[:40], mode=Mode.EDIT, workspace=tmp_path)
    assert forty.reason.endswith(f"(it writes: {', '.join(files[:40])})")


def test_a_patch_whose_files_cannot_be_known_is_refused_saying_why(tmp_path: Path) -> None:
    refused = Decision(
        action="deny",
        rule="policy_error",
        reason="the files apply_patch would write cannot be read here, so the call cannot be "
        "judged",
    )
    assert patch(ContainedPolicy(), ["a"], mode=Mode.AUTO, workspace=tmp_path) == refused
    assert (
        patch(
            ContainedPolicy(paths_of=lambda t, a: None), ["a"], mode=Mode.AUTO, workspace=tmp_path
        )
        == refused
    )
    empty = patch(ContainedPolicy(paths_of=Paths()), [], mode=Mode.AUTO, workspace=tmp_path)
    assert empty == Decision(
        action="deny", rule="policy_error", reason="apply_patch writes no file"
    )
    with pytest.raises(ToolError, match="cannot be read"):
        patch(ContainedPolicy(paths_of=Paths()), "unreadable", mode=Mode.AUTO, workspace=tmp_path)


# --- what each tightening says ---------------------------------------------------------------


def test_a_protected_write_is_refused_with_the_guards_reason(tmp_path: Path) -> None:
    decision = ContainedPolicy().decide(
        "write_file",
        "write",
        {"path": ".keel/x", "content": ""},
        mode=Mode.AUTO,
        workspace=tmp_path,
    )
    assert decision.reason.startswith(".keel/x is protected ('.keel'): ")


def test_a_users_deny_is_kept_as_it_is_even_on_a_protected_path(tmp_path: Path) -> None:
    policy = Policy(rules=(Rule(action="deny", tool="write_file", origin="p:1", reason="no"),))
    decision = ContainedPolicy(policy=policy).decide(
        "write_file",
        "write",
        {"path": ".keel/x", "content": ""},
        mode=Mode.AUTO,
        workspace=tmp_path,
    )
    assert decision.rule.startswith("p:1") and "protected" not in decision.reason


def test_a_write_below_git_asks_saying_it_changes_the_repository(tmp_path: Path) -> None:
    decision = ContainedPolicy().decide(
        "write_file",
        "write",
        {"path": ".git/HEAD", "content": ""},
        mode=Mode.AUTO,
        workspace=tmp_path,
    )
    assert decision.reason == (
        "writing .git/HEAD changes the repository's history or state; writes below .git need "
        "approval in every mode"
    )


def test_reading_a_secret_asks_saying_it_may_hold_credentials(tmp_path: Path) -> None:
    decision = ContainedPolicy().decide(
        "read_file", "read", {"path": ".env"}, mode=Mode.AUTO, workspace=tmp_path
    )
    assert decision.reason == (
        ".env may hold secrets (credentials, keys); reading it needs approval in every mode"
    )


def test_a_command_writing_git_asks_saying_so_and_gets_a_writable_git(tmp_path: Path) -> None:
    decision = ContainedPolicy().decide(
        "run_command",
        "execute",
        {"argv": ["git", "commit", "-m", "x"]},
        mode=Mode.AUTO,
        workspace=tmp_path,
    )
    assert decision == Decision(
        action="ask",
        rule="git",
        reason="this command writes the git repository (commit, branch, reset …); writes below "
        ".git need approval in every mode",
        writes_git=True,
    )


@pytest.mark.parametrize("mode", [Mode.ASK, Mode.EDIT])
def test_a_git_writing_command_asked_for_by_the_mode_gets_a_writable_git_too(
    tmp_path: Path, mode: Mode
) -> None:
    decision = ContainedPolicy().decide(
        "run_command",
        "execute",
        {"argv": ["git", "commit", "-m", "x"]},
        mode=mode,
        workspace=tmp_path,
    )
    assert (decision.action, decision.rule, decision.writes_git) == ("ask", f"mode:{mode}", True)


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git on PATH")
def test_git_run_through_a_link_in_the_workspace_is_recognised(tmp_path: Path) -> None:
    (tmp_path / "g").symlink_to(str(shutil.which("git")))
    decision = ContainedPolicy().decide(
        "run_command",
        "execute",
        {"argv": ["./g", "commit", "-m", "x"]},
        mode=Mode.AUTO,
        workspace=tmp_path,
    )
    assert (decision.action, decision.writes_git) == ("ask", True)


def test_without_a_sandbox_auto_mode_asks_before_a_command_saying_why(tmp_path: Path) -> None:
    decision = ContainedPolicy(sandboxed=False).decide(
        "run_command", "execute", {"argv": ["make"]}, mode=Mode.AUTO, workspace=tmp_path
    )
    assert decision.reason == (
        "no OS sandbox confines commands here (bubblewrap is missing or the sandbox is off), "
        "so in auto mode they need approval"
    )


def test_the_sandbox_rule_is_about_run_command_only(tmp_path: Path) -> None:
    decision = ContainedPolicy(sandboxed=False).decide(
        "mcp_build", "execute", {}, mode=Mode.AUTO, workspace=tmp_path
    )
    assert (decision.action, decision.rule) == ("allow", "mode:auto")


def test_a_path_has_one_spelling_unless_a_link_leads_elsewhere(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert path_spellings("src/a.py", tmp_path) == ("src/a.py",)
    assert path_spellings("./src/../a.py", tmp_path) == ("a.py",)
    assert path_spellings("link/a.py", tmp_path) == ("link/a.py", "real/a.py")
    assert path_spellings("../outside", tmp_path) == ()
