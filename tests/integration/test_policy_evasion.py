"""Rules that hold: a rule on the plain form stops every evasive spelling, on real files.

A policy file on disk denies ``git push*``; programs are real executables in a
folder on PATH (a stand-in ``git`` so nothing can reach a remote), and symbolic
links are real links in a real workspace. Each test is one category of evasion
from issue 10.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from keel.core.guard import PathGuard
from keel.policy import Decision, Mode, Policy, load_policy

POLICY = """\
[[rule]]
action = "allow"
tool = "run_command"

[[rule]]
action = "deny"
argv = "git push*"
reason = "pushing is done by CI"

[[rule]]
action = "deny"
path = "secrets/*"
"""


@dataclass(frozen=True)
class Site:
    """A workspace, a folder of programs on PATH, and the policy."""

    workspace: Path
    tools: Path
    policy: Policy

    @property
    def path(self) -> str:
        return f"{self.tools}{os.pathsep}{os.environ.get('PATH', os.defpath)}"

    def run(self, *argv: str, mode: Mode = Mode.AUTO, search: str | None = None) -> Decision:
        """Decide ``run_command(argv)``, programs looked up in ``search`` (default: ``path``)."""
        return self.decide("run_command", mode=mode, search=search, argv=list(argv))

    def decide(
        self, tool: str, *, mode: Mode = Mode.AUTO, search: str | None = None, **arguments: Any
    ) -> Decision:
        effect = {"run_command": "execute", "write_file": "write"}.get(tool, "read")
        return self.policy.decide(
            tool,
            effect,
            arguments,
            mode=mode,
            workspace=self.workspace,
            env={"PATH": search or self.path},
        )


def executable(path: Path, text: str = "#!/bin/sh\nexit 0\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


@pytest.fixture
def make_site(tmp_path: Path) -> Callable[[str], Site]:
    def make(policy_text: str = POLICY) -> Site:
        workspace = tmp_path / "workspace"
        workspace.mkdir(exist_ok=True)
        tools = tmp_path / "tools"
        executable(tools / "git")  # a stand-in: nothing here can push anywhere
        executable(tools / "rm")
        policy_file = tmp_path / "policy.toml"
        policy_file.write_text(policy_text)
        return Site(workspace=workspace, tools=tools, policy=load_policy(policy_file))

    return make


@pytest.fixture
def site(make_site: Callable[[str], Site]) -> Site:
    return make_site(POLICY)


def assert_denied(decision: Decision) -> None:
    assert (decision.action, decision.permanent) == ("deny", True), decision
    assert "argv='git push*'" in decision.rule
    assert decision.reason == "pushing is done by CI"


def test_the_plain_form_is_denied_and_other_commands_run(site: Site) -> None:
    assert_denied(site.run("git", "push", "origin", "main"))
    assert site.run("git", "status").action == "allow"


@pytest.mark.parametrize(
    "argv",
    [("git", "-C", ".", "push"), ("git", "--git-dir=.git", "--work-tree", ".", "push")],
    ids=" ".join,
)
def test_git_global_options_before_the_subcommand(site: Site, argv: tuple[str, ...]) -> None:
    assert_denied(site.run(*argv))


def test_git_called_by_its_full_path(site: Site) -> None:
    assert_denied(site.run(str(site.tools / "git"), "push"))


@pytest.mark.parametrize(
    "wrapper",
    [
        ("env",),
        ("env", "-i", "HOME=/nowhere"),
        ("env", "-S", "GIT_TRACE=0"),
        ("nice", "-n", "5"),
        ("timeout", "-s", "KILL", "30"),
        ("nohup",),
        ("stdbuf", "-oL"),
        ("time", "-p"),
        ("setsid", "-w"),
        ("nice", "timeout", "5", "env", "A=1"),
    ],
    ids=" ".join,
)
def test_wrapper_programs_and_their_options(site: Site, wrapper: tuple[str, ...]) -> None:
    absolute = ("env", "PATH=" + str(site.tools)) if wrapper[:2] == ("env", "-i") else ()
    assert_denied(site.run(*wrapper, *absolute, "git", "push"))


def test_xargs_is_denied_for_what_it_shows_and_opaque_for_the_rest(site: Site) -> None:
    assert_denied(site.run("xargs", "git", "push"))
    unknown = site.run("xargs", "git")  # the subcommand comes from standard input
    assert unknown.action == "ask"
    assert "xargs appends arguments read from standard input" in unknown.reason


@pytest.mark.parametrize(
    "argv",
    [
        ("sh", "-c", "git push"),
        ("bash", "-lc", "cd . && git push origin main"),
        ("bash", "-ec", "make || git push"),
        ("dash", "-c", "FOO=1 git push >/dev/null 2>&1"),
        ("sh", "-c", "sh -c 'env git \"pu\"sh'"),
        ("env", "bash", "-c", "nice git push"),
    ],
    ids=" ".join,
)
def test_shell_strings(site: Site, argv: tuple[str, ...]) -> None:
    assert_denied(site.run(*argv))


@pytest.mark.parametrize(
    ("argv", "why"),
    [
        (("python3", "-c", "import subprocess; subprocess.run(['git', 'push'])"), "inline code"),
        (("perl", "-e", "system('git push')"), "inline code"),
        (("sh", "-c", "$(printf git) push"), "command substitution"),
        (("sh", "-c", "eval 'git push'"), "eval"),
        (("git", "-c", "alias.p=push", "p"), "alias"),
        (("sh", "-c", "S=push; git $S"), "the argument '$S' is expanded by the shell"),
        (("sh", "-c", "touch push; git pu*"), "the argument 'pu*' is expanded by the shell"),
    ],
    ids=lambda v: v if isinstance(v, str) else v[0],
)
def test_inline_code_and_what_cannot_be_read_ask(
    site: Site, argv: tuple[str, ...], why: str
) -> None:
    decision = site.run(*argv)

    assert (decision.action, decision.permanent) == ("ask", False)
    assert "argv='git push*'" in decision.rule
    assert why in decision.reason


@pytest.mark.parametrize(
    "argv", [("git", "-c", "user.name=x", "push"), ("git", "--no-pager", "push")], ids=" ".join
)
def test_git_configuration_and_pager_options(site: Site, argv: tuple[str, ...]) -> None:
    assert_denied(site.run(*argv))


def test_a_symlink_to_git_in_the_workspace_or_on_path(site: Site) -> None:
    (site.workspace / "bin").mkdir()
    (site.workspace / "bin" / "g").symlink_to(site.tools / "git")
    innocent = site.workspace.parent / "innocent"
    innocent.mkdir()
    (innocent / "ls").symlink_to(site.tools / "git")
    (innocent / "git-send-pack").symlink_to(site.tools / "git")

    assert_denied(site.run("./bin/g", "push"))
    assert_denied(site.run("bin/g", "-C", ".", "push"))
    assert_denied(site.run("ls", "push", search=f"{innocent}{os.pathsep}{site.path}"))
    assert_denied(site.run("git-send-pack", "origin", search=str(innocent)))
    assert site.run("ls", "push", search=os.defpath).action == "allow"  # the system's ls


@pytest.mark.parametrize(
    "argv",
    [("git", "send-pack", "origin", "main"), ("git", "http-push", "https://example.test/r")],
    ids=" ".join,
)
def test_plumbing_that_pushes(site: Site, argv: tuple[str, ...]) -> None:
    assert_denied(site.run(*argv))


def test_a_symlink_named_like_an_allowed_program_is_judged_as_its_target(
    make_site: Callable[[str], Site],
) -> None:
    site = make_site('[[rule]]\naction = "allow"\nargv = "ls*"\n')
    (site.workspace / "ls").symlink_to(site.tools / "rm")

    disguised = site.run("./ls", "-rf", "src", mode=Mode.EDIT)

    assert (disguised.action, disguised.rule) == ("ask", "mode:edit")
    assert site.run("ls", "-la", mode=Mode.EDIT, search=os.defpath).action == "allow"


def test_a_git_dashed_name_on_another_program_is_that_program(
    make_site: Callable[[str], Site],
) -> None:
    site = make_site('[[rule]]\naction = "allow"\nargv = "git push*"\n')
    (site.workspace / "git-push").symlink_to(site.tools / "rm")

    disguised = site.run("./git-push", "-rf", "src", mode=Mode.EDIT)

    assert (disguised.action, disguised.rule) == ("ask", "mode:edit")


def test_a_program_the_command_creates_before_running_it_asks(site: Site) -> None:
    decision = site.run("sh", "-c", f"cp {site.tools / 'git'} ./g && ./g push")

    assert decision.action == "ask"
    assert "'./g' is not an existing program (an earlier command may create it)" in (
        decision.reason
    )


# --- paths -------------------------------------------------------------------------------


@pytest.fixture
def secrets(site: Site) -> Path:
    folder = site.workspace / "secrets"
    folder.mkdir()
    (folder / "api.key").write_text("k\n")
    return folder


def test_a_path_rule_holds_through_a_symlinked_folder_and_file(site: Site, secrets: Path) -> None:
    (site.workspace / "innocent").symlink_to(secrets, target_is_directory=True)
    (site.workspace / "notes.txt").symlink_to(secrets / "api.key")

    for path in ("secrets/api.key", "innocent/api.key", "notes.txt", "./innocent/../notes.txt"):
        decision = site.decide("read_file", path=path)
        assert (decision.action, decision.permanent) == ("deny", True), path
        assert "path='secrets/*'" in decision.rule
    assert site.decide("read_file", path="README.md").action == "allow"


def test_an_allow_path_rule_needs_the_real_path(make_site: Callable[[str], Site]) -> None:
    site = make_site('[[rule]]\naction = "allow"\ntool = "write_file"\npath = "docs/*"\n')
    (site.workspace / "docs").mkdir()
    (site.workspace / "src").mkdir()
    (site.workspace / "src" / "app.py").write_text("")
    (site.workspace / "docs" / "app.py").symlink_to(site.workspace / "src" / "app.py")
    (site.workspace / "manual").symlink_to(site.workspace / "docs", target_is_directory=True)

    def write(path: str) -> Decision:
        return site.decide("write_file", mode=Mode.ASK, path=path, content="x")

    assert write("docs/guide.md").action == "allow"
    assert write("manual/guide.md").action == "allow"  # really docs/guide.md
    leading_out = write("docs/app.py")  # really src/app.py
    assert (leading_out.action, leading_out.rule) == ("ask", "mode:ask")


def test_a_deny_path_rule_still_matches_the_spelling_of_a_link_leading_outside(
    site: Site, tmp_path: Path
) -> None:
    (tmp_path / "elsewhere").mkdir()
    (site.workspace / "secrets").symlink_to(tmp_path / "elsewhere", target_is_directory=True)

    assert site.decide("read_file", path="secrets/x").action == "deny"


def test_directory_wide_tools_leave_out_what_a_read_deny_rule_names(
    site: Site, secrets: Path
) -> None:
    guard = PathGuard(hidden=site.policy.read_denied_paths())

    assert site.policy.read_denied_paths() == ("secrets/*",)
    assert guard.listable("secrets/api.key") is False
    assert guard.listable("src/app.py") is True
