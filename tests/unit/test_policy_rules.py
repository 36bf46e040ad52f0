"""User rules: matching, precedence, plan-mode and workspace limits, loading and storage."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from keel.core.errors import ConfigError
from keel.core.records import RunOptions
from keel.policy import Decision, Mode, Policy, load_policy

WORKSPACE = Path("/srv/work/project")
EFFECTS = {
    "read_file": "read",
    "list_dir": "read",
    "grep": "read",
    "write_file": "write",
    "edit_file": "write",
    "run_command": "execute",
}


@pytest.fixture
def make_policy(tmp_path: Path) -> Callable[[str], Policy]:
    """Write ``text`` as a policy file and load it."""

    def make(text: str) -> Policy:
        path = tmp_path / "policy.toml"
        path.write_text(text, encoding="utf-8")
        return load_policy(path)

    return make


def decide(policy: Policy, tool: str, mode: Mode = Mode.EDIT, **arguments: Any) -> Decision:
    return policy.decide(tool, EFFECTS[tool], arguments, mode=mode, workspace=WORKSPACE)


# --- precedence --------------------------------------------------------------------------

ALLOW_PUSH = '[[rule]]\naction = "allow"\ntool = "run_command"\n'
DENY_PUSH = '[[rule]]\naction = "deny"\ntool = "run_command"\nargv = "git push*"\n'


@pytest.mark.parametrize("text", [ALLOW_PUSH + DENY_PUSH, DENY_PUSH + ALLOW_PUSH])
def test_deny_rule_beats_allow_rule_whatever_their_order(
    make_policy: Callable[[str], Policy], text: str
) -> None:
    policy = make_policy(text)

    pushed = decide(policy, "run_command", mode=Mode.AUTO, argv=["git", "push", "origin"])
    tested = decide(policy, "run_command", mode=Mode.EDIT, argv=["pytest"])

    assert pushed.action == "deny"
    assert pushed.permanent is True
    assert "deny run_command argv='git push*'" in pushed.rule
    assert tested.action == "allow"  # the allow rule still loosens edit mode's "ask"


def test_ask_rule_beats_allow_rule(make_policy: Callable[[str], Policy]) -> None:
    policy = make_policy(
        '[[rule]]\naction = "allow"\ntool = "*"\n[[rule]]\naction = "ask"\npath = "*.lock"\n'
    )

    assert decide(policy, "write_file", path="poetry.lock", content="").action == "ask"
    assert decide(policy, "write_file", path="app.py", content="").action == "allow"


def test_rule_decision_names_file_and_line_and_carries_the_rule_reason(
    make_policy: Callable[[str], Policy], tmp_path: Path
) -> None:
    policy = make_policy(
        "# team policy\n\n"
        '[[rule]]\naction = "deny"\ntool = "run_command"\nargv = "git push*"\n'
        'reason = "pushing is done by CI"\n'
    )

    decision = decide(policy, "run_command", argv=["git", "push"])

    assert decision == Decision(
        action="deny",
        rule=f"{tmp_path / 'policy.toml'}:3 deny run_command argv='git push*'",
        reason="pushing is done by CI",
        permanent=True,
    )


def test_rules_can_tighten_and_loosen_the_mode_default(
    make_policy: Callable[[str], Policy],
) -> None:
    policy = make_policy(
        '[[rule]]\naction = "allow"\nargv = ["pytest"]\n'
        '[[rule]]\naction = "ask"\ntool = "edit_file"\npath = "pyproject.toml"\n'
    )

    loosened = decide(policy, "run_command", mode=Mode.EDIT, argv=["pytest", "-x"])
    tightened = decide(
        policy, "edit_file", mode=Mode.AUTO, path="pyproject.toml", old_text="a", new_text="b"
    )

    assert (loosened.action, loosened.permanent) == ("allow", False)
    assert (tightened.action, tightened.permanent) == ("ask", False)
    assert decide(policy, "run_command", mode=Mode.EDIT, argv=["make"]).rule == "mode:edit"


# --- matchers ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "argv", "matched"),
    [
        ('"git push*"', ["git", "push"], True),
        ('"git push*"', ["git", "push", "--force", "origin"], True),
        ('"git push*"', ["git", "status"], False),
        ('"git push*"', ["echo", "git push"], False),
        ('["git", "push"]', ["git", "push", "--force"], True),
        ('["git", "push"]', ["git"], False),
        ('["git", "pu*"]', ["git", "pull"], True),
        ('["rm", "-*r*"]', ["rm", "-rf", "build"], True),
        ('["rm", "-*r*"]', ["rm", "build"], False),
        ('["curl"]', ["/usr/bin/curl"], True),  # the program's name, wherever it lives
        ('["curl"]', ["curly"], False),
    ],
)
def test_argv_glob_string_matches_joined_argv_and_list_matches_a_prefix(
    make_policy: Callable[[str], Policy], pattern: str, argv: list[str], matched: bool
) -> None:
    policy = make_policy(f'[[rule]]\naction = "deny"\nargv = {pattern}\n')

    decision = decide(policy, "run_command", argv=argv)

    assert (decision.action == "deny") is matched


@pytest.mark.parametrize(
    ("path", "matched"),
    [
        ("secrets/api.key", True),
        ("./secrets/api.key", True),
        ("src/../secrets/api.key", True),
        (str(WORKSPACE / "secrets" / "api.key"), True),
        ("secrets/deep/nested.key", True),  # fnmatch's * also matches /
        ("src/secrets.py", False),
        ("Secrets/api.key", False),  # case-sensitive on every machine
    ],
)
def test_path_glob_matches_the_workspace_relative_path(
    make_policy: Callable[[str], Policy], path: str, matched: bool
) -> None:
    policy = make_policy('[[rule]]\naction = "deny"\npath = "secrets/*"\n')

    assert (decide(policy, "read_file", path=path).action == "deny") is matched


def test_path_rule_sees_the_default_path_of_list_dir_and_grep(
    make_policy: Callable[[str], Policy],
) -> None:
    policy = make_policy('[[rule]]\naction = "ask"\npath = "."\n')

    assert decide(policy, "list_dir").action == "ask"
    assert decide(policy, "grep", pattern="x").action == "ask"
    assert decide(policy, "grep", pattern="x", path="src").action == "allow"


def test_all_matchers_of_a_rule_must_match(make_policy: Callable[[str], Policy]) -> None:
    policy = make_policy('[[rule]]\naction = "deny"\ntool = "write_file"\npath = "*.md"\n')

    assert decide(policy, "write_file", path="README.md", content="").action == "deny"
    assert decide(policy, "write_file", path="app.py", content="").action == "allow"
    assert decide(policy, "read_file", path="README.md").action == "allow"


def test_argv_rule_never_matches_a_call_without_argv(
    make_policy: Callable[[str], Policy],
) -> None:
    policy = make_policy('[[rule]]\naction = "deny"\nargv = "*"\n')

    assert decide(policy, "write_file", path="a.txt", content="").action == "allow"
    assert decide(policy, "run_command", argv=["ls"]).action == "deny"


def test_argv_rules_read_the_command_as_it_runs(
    make_policy: Callable[[str], Policy], fake_path: str
) -> None:
    policy = make_policy('[[rule]]\naction = "deny"\nargv = ["git", "push"]\n')

    assert run(policy, fake_path, "env", "FOO=1", "git", "-C", ".", "push").action == "deny"
    assert run(policy, fake_path, "sh", "-c", "git --no-pager push").action == "deny"
    assert run(policy, fake_path, "git", "status").action == "ask"  # edit mode's default


# --- commands as they run ----------------------------------------------------------------

FAKE_PROGRAMS = ("git", "make", "pytest", "rm", "ls", "python3", "sh")


@pytest.fixture
def fake_path(tmp_path: Path) -> str:
    """A PATH of one folder with an executable file for each of FAKE_PROGRAMS."""
    folder = tmp_path / "bin"
    folder.mkdir()
    for name in FAKE_PROGRAMS:
        (folder / name).write_text("#!/bin/sh\n")
        (folder / name).chmod(0o755)
    return str(folder)


def run(policy: Policy, path: str, *argv: str, mode: Mode = Mode.EDIT) -> Decision:
    """Decide a run_command of ``argv`` with programs looked up in ``path``."""
    arguments = {"argv": list(argv)}
    return policy.decide(
        "run_command", "execute", arguments, mode=mode, workspace=WORKSPACE, env={"PATH": path}
    )


@pytest.mark.parametrize(
    "argv",
    [
        ("env", "git", "push"),
        ("git", "-C", ".", "push", "origin"),
        ("nice", "-n", "5", "timeout", "10", "git", "push"),
        ("sh", "-c", "make && git push"),
        ("bash", "-lc", "cd src; git --no-pager push"),
        ("git", "send-pack", "origin"),
        ("xargs", "git", "push"),
        ("sh", "-c", "git push; echo $(date)"),  # opaque too, but the push is plain to see
    ],
    ids=" ".join,
)
def test_deny_rule_matches_any_spelling_of_any_command_run(
    make_policy: Callable[[str], Policy], fake_path: str, argv: tuple[str, ...]
) -> None:
    policy = make_policy(ALLOW_PUSH + DENY_PUSH)

    decision = run(policy, fake_path, *argv, mode=Mode.AUTO)

    assert (decision.action, decision.permanent) == ("deny", True)
    assert "argv='git push*'" in decision.rule


def test_allow_rule_needs_the_normal_form_of_every_command_to_match(
    make_policy: Callable[[str], Policy], fake_path: str
) -> None:
    policy = make_policy('[[rule]]\naction = "allow"\nargv = "pytest*"\n')

    assert run(policy, fake_path, "sh", "-c", "pytest -q && pytest -x").action == "allow"
    assert run(policy, fake_path, "env", "CI=1", "pytest").action == "allow"
    mixed = run(policy, fake_path, "sh", "-c", "pytest && rm -rf build")
    assert (mixed.action, mixed.rule) == ("ask", "mode:edit")
    empty = run(policy, fake_path, "sh", "-c", "# nothing")
    assert (empty.action, empty.rule) == ("ask", "mode:edit")


def test_allow_rule_never_allows_a_command_it_cannot_read(
    make_policy: Callable[[str], Policy], fake_path: str
) -> None:
    policy = make_policy('[[rule]]\naction = "allow"\nargv = "python3*"\n')

    assert run(policy, fake_path, "python3", "tool.py").action == "allow"
    inline = run(policy, fake_path, "python3", "-c", "import os")
    assert (inline.action, inline.rule) == ("ask", "mode:edit")


@pytest.mark.parametrize("action", ["deny", "ask"])
def test_a_command_that_cannot_be_read_asks_naming_the_rule_it_cannot_be_checked_against(
    make_policy: Callable[[str], Policy], fake_path: str, action: str
) -> None:
    policy = make_policy(
        f'[[rule]]\naction = "{action}"\ntool = "run_command"\nargv = "git push*"\n'
    )

    decision = run(policy, fake_path, "python3", "-c", "import os", mode=Mode.AUTO)

    assert (decision.action, decision.permanent) == ("ask", False)
    assert f"{action} run_command argv='git push*'" in decision.rule
    assert "cannot be checked against policy rule" in decision.reason
    assert "python3 runs inline code (-c)" in decision.reason


@pytest.mark.parametrize(
    "script",
    ["F=--force; git push $F", 'set -- --force; git push "$@"', "git push --for*"],
)
def test_a_rule_cannot_be_spelled_around_with_what_the_shell_expands(
    make_policy: Callable[[str], Policy], fake_path: str, script: str
) -> None:
    # `sh -c 'F=--force; git push $F'` runs `git push --force`, which the deny rule names:
    # the argument is not known until the shell runs, so a person is asked, and no allow
    # rule lets it through.
    deny = '[[rule]]\naction = "deny"\ntool = "run_command"\nargv = ["git", "push", "--force*"]\n'
    allow = '[[rule]]\naction = "allow"\ntool = "run_command"\nargv = "sh -c git push*"\n'
    policy = make_policy(deny + allow)

    decision = run(policy, fake_path, "sh", "-c", script, mode=Mode.AUTO)

    assert (decision.action, decision.permanent) == ("ask", False)
    assert "cannot be checked against policy rule" in decision.reason
    assert "is expanded by the shell at run time" in decision.reason
    plain = run(policy, fake_path, "sh", "-c", "git push --force", mode=Mode.AUTO)
    assert plain.action == "deny"  # the same command spelled out is refused outright


def test_unreadable_commands_are_left_to_the_mode_when_no_deny_or_ask_argv_rule_applies(
    make_policy: Callable[[str], Policy], fake_path: str
) -> None:
    policy = make_policy(
        '[[rule]]\naction = "deny"\npath = "secrets/*"\n'
        '[[rule]]\naction = "allow"\nargv = "make*"\n'
        '[[rule]]\naction = "deny"\ntool = "write_file"\nargv = "*"\n'
    )

    decision = run(policy, fake_path, "python3", "-c", "import os", mode=Mode.AUTO)

    assert (decision.action, decision.rule) == ("allow", "mode:auto")


def test_asking_about_an_unreadable_command_never_loosens_plan_mode(
    make_policy: Callable[[str], Policy], fake_path: str
) -> None:
    policy = make_policy(DENY_PUSH)

    decision = run(policy, fake_path, "python3", "-c", "x", mode=Mode.PLAN)

    assert (decision.action, decision.rule) == ("deny", "mode:plan")


# --- reading tools and path lists --------------------------------------------------------


def test_read_denied_paths_are_the_deny_path_globs_that_apply_to_reading_tools(
    make_policy: Callable[[str], Policy],
) -> None:
    policy = make_policy(
        '[[rule]]\naction = "deny"\npath = "secrets/*"\n'
        '[[rule]]\naction = "deny"\ntool = "read_file"\npath = "*.key"\n'
        '[[rule]]\naction = "deny"\ntool = "gr*"\npath = "private/*"\n'
        '[[rule]]\naction = "deny"\ntool = "write_file"\npath = "docs/*"\n'
        '[[rule]]\naction = "ask"\npath = "notes/*"\n'
        '[[rule]]\naction = "allow"\npath = "public/*"\n'
        '[[rule]]\naction = "deny"\ntool = "*"\npath = "secrets/*"\n'
    )

    assert policy.read_denied_paths() == ("secrets/*", "*.key", "private/*")


def test_policy_file_lists_protected_and_secret_paths_and_stores_them(
    make_policy: Callable[[str], Policy],
) -> None:
    policy = make_policy(
        'protected = ["deploy/*"]\nsecret = ["credentials/*", "*.pem"]\n\n'
        '[[rule]]\naction = "ask"\ntool = "*"\n'
    )

    assert policy.protected == ("deploy/*",)
    assert policy.secret == ("credentials/*", "*.pem")
    stored = json.loads(json.dumps(RunOptions(policy=policy.to_dict()).to_dict()))
    assert Policy.from_dict(RunOptions.from_dict(stored).policy) == policy


# --- limits rules cannot lift ------------------------------------------------------------


@pytest.mark.parametrize(
    ("tool", "arguments"),
    [
        ("write_file", {"path": "notes.md", "content": "x"}),
        ("edit_file", {"path": "notes.md", "old_text": "a", "new_text": "b"}),
        ("run_command", {"argv": ["pytest"]}),
    ],
)
def test_plan_mode_refuses_non_read_calls_even_with_an_allow_rule(
    make_policy: Callable[[str], Policy], tool: str, arguments: dict[str, Any]
) -> None:
    policy = make_policy('[[rule]]\naction = "allow"\ntool = "*"\n')

    decision = decide(policy, tool, mode=Mode.PLAN, **arguments)

    assert decision.action == "deny"
    assert decision.rule == "mode:plan"
    assert decision.permanent is False
    assert "You are in plan mode" in decision.reason
    assert "plan_exit" in decision.reason


def test_plan_mode_allow_rule_cannot_approve_the_plan(
    make_policy: Callable[[str], Policy],
) -> None:
    policy = make_policy('[[rule]]\naction = "allow"\ntool = "plan_exit"\n')

    decision = policy.decide(
        "plan_exit", "state", {"summary": "s"}, mode=Mode.PLAN, workspace=WORKSPACE
    )

    assert decision.action == "ask"


def test_plan_mode_rules_can_still_tighten(make_policy: Callable[[str], Policy]) -> None:
    policy = make_policy('[[rule]]\naction = "deny"\npath = ".env"\n')

    decision = decide(policy, "read_file", mode=Mode.PLAN, path=".env")

    assert (decision.action, decision.permanent) == ("deny", True)


@pytest.mark.parametrize("path", ["../other/app.py", "/etc/passwd", "/srv/work/project-2/x"])
@pytest.mark.parametrize("mode", [Mode.AUTO, Mode.EDIT, Mode.ASK])
def test_no_mode_or_allow_rule_reaches_a_path_outside_the_workspace(
    make_policy: Callable[[str], Policy], path: str, mode: Mode
) -> None:
    policy = make_policy('[[rule]]\naction = "allow"\ntool = "*"\n')

    decision = decide(policy, "write_file", mode=mode, path=path, content="x")

    assert decision.action == "deny"
    assert decision.rule == "workspace"
    assert "outside the workspace" in decision.reason


# --- malformed files ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "line", "detail"),
    [
        ('[[rule]]\naction = "deny"\ntool = run_command\n', 3, "invalid TOML"),
        ('[[rule]]\ntool = "x"\naction = "allow"\n\n[[rule]]\ntool = "y"\naction = "block"\n',
         7, "action must be one of allow, ask, deny, not 'block'"),
        ('[[rule]]\naction = "allow"\ntool = "x"\n[[rule]]\naction = "deny"\ntols = "y"\n',
         6, "unknown key 'tols'"),
        ('[[rule]]\naction = "deny"\n\ntool = 3\n', 4, "tool must be a string"),
        ('[[rule]]\naction = "deny"\nargv = []\n', 3, "argv must be a glob string"),
        ('[[rule]]\naction = "deny"\nargv = ["git", 1]\n', 3, "argv must be a glob string"),
        ('mode = "auto"\n', 1, "unknown key 'mode'"),
        ('[[rule]]\ntool = "x"\n\n[[rules]]\naction = "deny"\n', 4, "unknown key 'rules'"),
        ('[[rule]]\ntool = "x"\n', 1, "action must be one of"),
        ('# x\n[[rule]]\naction = "deny"\nreason = "why"\n', 2, "at least one of tool, argv"),
        ('\nsecret = "credentials/*"\n', 2, "must be a list of path globs"),
        ('protected = ["deploy", 3]\n', 1, "must be a list of path globs"),
    ],
)  # fmt: skip
def test_malformed_policy_file_is_reported_with_file_and_line(
    tmp_path: Path, text: str, line: int, detail: str
) -> None:
    path = tmp_path / "policy.toml"
    path.write_text(text, encoding="utf-8")

    with pytest.raises(ConfigError) as caught:
        load_policy(path)

    assert str(caught.value).startswith(f"{path}:{line}: ")
    assert detail in str(caught.value)


def test_missing_policy_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="policy file not found"):
        load_policy(tmp_path / "nope.toml")


def test_empty_policy_file_has_no_rules(make_policy: Callable[[str], Policy]) -> None:
    assert make_policy("# nothing yet\n").rules == ()


# --- sources and storage -----------------------------------------------------------------


def test_from_sources_prefers_explicit_file_then_dot_keel_then_nothing(tmp_path: Path) -> None:
    cwd = tmp_path / "project"
    (cwd / ".keel").mkdir(parents=True)
    explicit = tmp_path / "strict.toml"
    explicit.write_text('[[rule]]\naction = "deny"\ntool = "*"\n', encoding="utf-8")

    assert Policy.from_sources(cwd) == Policy()
    (cwd / ".keel" / "policy.toml").write_text(
        '[[rule]]\naction = "ask"\ntool = "*"\n', encoding="utf-8"
    )
    assert Policy.from_sources(cwd).rules[0].action == "ask"
    assert Policy.from_sources(cwd, explicit).rules[0].action == "deny"
    with pytest.raises(ConfigError):
        Policy.from_sources(cwd, tmp_path / "missing.toml")


def test_policy_stored_in_run_options_decides_the_same_after_a_json_round_trip(
    make_policy: Callable[[str], Policy],
) -> None:
    policy = make_policy(
        '[[rule]]\naction = "deny"\nargv = ["git", "push"]\nreason = "CI pushes"\n'
        '[[rule]]\naction = "allow"\ntool = "run_command"\nargv = "pytest*"\n'
        '[[rule]]\naction = "ask"\npath = "*.lock"\n'
    )
    stored = json.loads(json.dumps(RunOptions(policy=policy.to_dict()).to_dict()))

    restored = Policy.from_dict(RunOptions.from_dict(stored).policy)

    assert restored == policy
    calls: list[tuple[str, dict[str, Any]]] = [
        ("run_command", {"argv": ["git", "push"]}),
        ("run_command", {"argv": ["pytest", "-q"]}),
        ("write_file", {"path": "uv.lock", "content": ""}),
    ]
    for tool, arguments in calls:
        assert decide(restored, tool, **arguments) == decide(policy, tool, **arguments)


def test_stored_policy_none_means_no_rules_and_bad_stored_rule_is_a_config_error() -> None:
    assert Policy.from_dict(None) == Policy()
    with pytest.raises(ConfigError, match="stored policy rule 1: action"):
        Policy.from_dict({"rules": [{"action": "maybe", "tool": "*"}]})
