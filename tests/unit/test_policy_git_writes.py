"""Which git command lines only read the repository (keel.policy.git_commands): an allowlist
of read-only uses, everything else a write; and the shell commands git will run."""

from __future__ import annotations

import pytest

from keel.policy.git_commands import GitReading, git_writes, program_key, read_git


def writes(*argv: str) -> bool:
    reading = read_git(argv)
    return git_writes(reading.porcelain, reading.args)


BRANCH_WRITES = [
    "-d",
    "-D",
    "--delete",
    "-m",
    "-M",
    "--move",
    "-c",
    "-C",
    "--copy",
    "-u",
    "--set-upstream-to",
    "--unset-upstream",
    "--edit-description",
    "-f",
    "--force",
    "--track",
    "-t",
    "--no-track",
    "--create-reflog",
]
TAG_WRITES = [
    "-d",
    "--delete",
    "-a",
    "--annotate",
    "-s",
    "--sign",
    "-u",
    "--local-user",
    "-m",
    "--message",
    "-F",
    "--file",
    "-f",
    "--force",
    "-e",
    "--edit",
]


@pytest.mark.parametrize("option", BRANCH_WRITES)
def test_each_writing_option_of_branch_is_a_write_even_without_a_name(option: str) -> None:
    assert writes("branch", option)


@pytest.mark.parametrize("option", TAG_WRITES)
def test_each_writing_option_of_tag_is_a_write_even_without_a_name(option: str) -> None:
    assert writes("tag", option)


@pytest.mark.parametrize(
    "argv",
    [
        ("branch",),
        ("branch", "--"),
        ("branch", "--contains", "HEAD"),
        ("branch", "--sort", "committerdate"),
        ("branch", "-rl", "origin/*"),
        ("branch", "-lq", "feat*"),
        ("branch", "-a"),
        ("tag",),
        ("tag", "--contains", "HEAD"),
        ("tag", "-l", "v1.*"),
        ("tag", "--sort", "version:refname"),  # an option's value is not a tag name
        ("tag", "--format", "%(refname:short)"),
        ("config", "user.name"),
        ("config", "-f", "x.cfg", "user.name"),
        ("config", "--file", "x.cfg", "--type", "bool", "core.bare"),
        ("config", "get", "user.name"),
        ("config", "list"),
        ("config", "list", "user.name"),  # ``list`` never writes, whatever follows it
        ("config", "--get", "user.name", "^B"),
        ("config", "--list", "--show-origin"),
        ("remote",),
        ("remote", "show", "origin"),
        ("remote", "get-url", "origin"),
        ("stash", "list"),
        ("worktree", "list"),
    ],
)
def test_read_only_uses(argv: tuple[str, ...]) -> None:
    assert not writes(*argv)


@pytest.mark.parametrize(
    "argv",
    [
        ("branch", "--set-upstream-to=origin/main"),
        ("branch", "--set-upstream-to=origin/a=b"),  # the option's name ends at the first =
        ("branch", "-vd"),
        ("branch", "--", "--list"),
        ("branch", "--", "-weird"),
        ("branch", "new"),
        ("tag", "--message=a=b", "v1"),
        ("tag", "v1"),
        ("config", "user.name", "Bob"),
        ("config", "user.name", "-"),
        ("config", "--global", "user.name", "Bob"),
        ("config", "-f", "x.cfg", "user.name", "Bob"),
        ("config", "set"),
        ("config", "unset", "--global"),
        ("config", "rename-section"),
        ("config", "remove-section"),
        ("config", "--unset", "user.name"),
        ("remote", "add", "up", "https://example.com/x.git"),
        ("remote", "-"),
        ("stash",),
        ("stash", "pop"),
        ("worktree",),
        ("commit", "-m", "x"),
    ],
)
def test_writing_uses(argv: tuple[str, ...]) -> None:
    assert writes(*argv)


@pytest.mark.parametrize(
    ("argv", "shell"),
    [
        (("rebase", "--exec", "make test", "main"), ("make test",)),
        (("rebase", "--exec=make test", "main"), ("make test",)),
        (("rebase", "-x", "make"), ("make",)),
        (("rebase", "-xmake", "main"), ("make",)),
        (("rebase", "-xw", "main"), ("w",)),
        (("rebase", "main", "--exec"), ()),  # no value: nothing to run
        (("filter-branch", "--tree-filter", "rm -f x", "-xfoo"), ("rm -f x",)),
    ],
)
def test_the_shell_commands_git_will_run_are_read_from_every_spelling(
    argv: tuple[str, ...], shell: tuple[str, ...]
) -> None:
    assert read_git(argv).runs_shell == shell


def test_an_alias_value_with_equals_signs_is_named_by_its_key() -> None:
    assert program_key("alias.st=!f() { x=1; }; f") == "alias.st"
    assert program_key("core.pager") == "core.pager"
    assert program_key("user.name=Bob") is None


def test_a_global_option_ending_the_line_takes_the_last_argument_as_its_value() -> None:
    assert read_git(["-C"]) == GitReading(subcommand=None, porcelain=None, args=())
    assert read_git(["-C", "repo"]) == GitReading(subcommand=None, porcelain=None, args=())
    assert read_git(["-c", "alias.st=!sh"]).opaque == (
        "git -c alias.st sets a program or alias git will run"
    )


def test_only_config_options_are_read_for_program_keys_and_a_command_keeps_its_equals_signs() -> (
    None
):
    assert read_git(["-C", "hook.d", "status"]).opaque is None  # a directory, not a key
    assert read_git(["-c", "core.pager=env LESS=R less", "log"]).runs_shell == ("env LESS=R less",)


def test_an_exec_path_is_opaque_and_an_empty_config_command_runs_nothing() -> None:
    assert read_git(["--exec-path=/tmp/x", "status"]).opaque == (
        "git --exec-path= changes where git finds its programs"
    )
    assert read_git(["-c", "core.pager=", "log"]).runs_shell == ()
