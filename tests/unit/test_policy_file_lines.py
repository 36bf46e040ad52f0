"""Policy rules beyond the basics: path rules and symbolic links, rules stored in a run,
and a policy file's refusals naming the file, the line and the rule."""

from __future__ import annotations

import locale
import os
import re
import sys
from pathlib import Path

import pytest

from keel.core.errors import ConfigError
from keel.policy.modes import Decision, Mode, mode_default, plan_mode_message
from keel.policy.rules import (
    Policy,
    Rule,
    load_policy,
    real_relative,
    workspace_relative,
)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "policy.toml"
    path.write_text(text, encoding="utf-8")
    return path


def refused(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError, match=f"^{re.escape(message.format(path=path))}$"):
        load_policy(path)


# --- the mode defaults' words ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("effect", "mode", "reason"),
    [
        ("read", Mode.ASK, "read calls are allowed in ask mode"),
        ("write", Mode.ASK, "write calls need approval in ask mode"),
        ("execute", Mode.EDIT, "execute calls need approval in edit mode"),
        ("external", Mode.AUTO, "external calls need approval in auto mode"),
        ("write", Mode.AUTO, "write calls are allowed in auto mode"),
    ],
)
def test_a_mode_default_says_what_the_mode_does_with_the_effect(
    effect: str, mode: Mode, reason: str
) -> None:
    assert mode_default("t", effect, mode).reason == reason


def test_plan_mode_explains_how_to_leave_it() -> None:
    assert plan_mode_message("write_file") == (
        "You are in plan mode: write_file is refused until your plan is approved. Only "
        "read-only tools work now. Write your plan with plan_write, then call plan_exit with a "
        "short summary to ask for approval; once approved you may act."
    )
    assert mode_default("write_file", "write", Mode.PLAN).reason == plan_mode_message("write_file")
    assert mode_default("plan_write", "write", Mode.PLAN) == Decision(
        action="allow", rule="mode:plan", reason="writing the plan is what plan mode is for"
    )
    assert mode_default("plan_exit", "state", Mode.PLAN).reason == (
        "leaving plan mode needs a person's approval of the plan"
    )
    assert mode_default("plan_exit", "state", Mode.EDIT).reason == (
        "plan_exit only works in plan mode; this run is in edit mode, so carry on with the work"
    )


def test_an_unknown_effect_names_the_known_ones() -> None:
    with pytest.raises(Exception, match=r"^tool t has unknown effect 'fly'; one of read, write, "):
        mode_default("t", "fly", Mode.EDIT)


# --- rules: paths, links, defaults ----------------------------------------------------------


def test_a_rules_default_reason_names_the_rule_and_what_it_does() -> None:
    for action, words in (
        ("allow", "allowed by"),
        ("ask", "needs approval under"),
        ("deny", "refused by"),
    ):
        rule = Rule(action=action, tool="run_command", argv=("git", "push*"), origin="p:3")  # type: ignore[arg-type]
        assert (
            rule.decision().reason
            == f"{words} policy rule p:3 {action} run_command argv=['git', 'push*']"
        )
    assert Rule(action="deny", tool="x", argv=("a",)).to_dict() == {
        "action": "deny",
        "origin": "",
        "tool": "x",
        "argv": ["a"],
    }


@pytest.fixture
def linked(tmp_path: Path) -> Path:
    """A workspace where ``alias`` is a link to ``src``."""
    (tmp_path / "src").mkdir()
    (tmp_path / "alias").symlink_to(tmp_path / "src")
    return tmp_path


def decide(policy: Policy, path: str, workspace: Path, mode: Mode = Mode.ASK) -> Decision:
    return policy.decide(
        "write_file", "write", {"path": path, "content": ""}, mode=mode, workspace=workspace
    )


def test_an_allow_path_rule_needs_the_real_path_to_match(linked: Path) -> None:
    allow = Policy(rules=(Rule(action="allow", path="src/*", origin="p:1"),))
    assert decide(allow, "src/a.py", linked).action == "allow"
    assert decide(allow, "alias/a.py", linked).action == "allow"  # really src/a.py
    assert decide(allow, "docs/a.py", linked).action == "ask"
    assert decide(allow, f"{linked}/src/b.py", linked).action == "allow"
    via_link = Policy(rules=(Rule(action="allow", path="alias/*", origin="p:1"),))
    assert decide(via_link, "alias/a.py", linked).action == "ask"  # the spelling is not enough


def test_a_deny_path_rule_matches_either_spelling(linked: Path) -> None:
    deny = Policy(rules=(Rule(action="deny", path="alias/*", origin="p:1"),))
    assert decide(deny, "alias/a.py", linked, Mode.AUTO).action == "deny"
    real = Policy(rules=(Rule(action="deny", path="src/*", origin="p:1"),))
    assert decide(real, "alias/a.py", linked, Mode.AUTO).action == "deny"


def test_a_path_rule_does_not_apply_to_a_call_without_a_path(tmp_path: Path) -> None:
    deny = Policy(rules=(Rule(action="deny", path="*", origin="p:1"),))
    decision = deny.decide(
        "run_command", "execute", {"argv": ["ls"]}, mode=Mode.AUTO, workspace=tmp_path
    )
    assert decision.action == "allow"


def test_a_path_outside_the_workspace_is_refused_whatever_the_path_rules(tmp_path: Path) -> None:
    allow = Policy(rules=(Rule(action="allow", path="*", origin="p:1"),))
    decision = decide(allow, "../x", tmp_path, Mode.AUTO)
    assert decision == Decision(
        action="deny",
        rule="workspace",
        reason=f"path '../x' is outside the workspace {tmp_path}; use a path inside it",
    )


def test_a_relative_path_is_real_relative_to_the_workspace_wherever_the_harness_runs(
    linked: Path,
) -> None:
    assert os.getcwd() != str(linked)
    assert real_relative("alias/a.py", linked) == "src/a.py"
    assert real_relative("new.txt", linked) == "new.txt"


def test_a_workspace_whose_name_ends_in_a_space_holds_its_files() -> None:
    assert workspace_relative("a.txt", Path("/srv/my ws ")) == "a.txt"


def link_program(tmp_path: Path) -> Path:
    """``bin/g``: a link to a program named git; the rule's ``git push*`` must see it."""
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "git").write_text("#!/bin/sh\n")
    (tmp_path / "real" / "git").chmod(0o755)
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "g").symlink_to(tmp_path / "real" / "git")
    return tmp_path / "bin"


GIT_PUSH = Policy(rules=(Rule(action="deny", tool="run_command", argv="git push*", origin="p:1"),))


def test_programs_are_looked_up_in_the_path_the_run_gives(tmp_path: Path) -> None:
    bin_dir = link_program(tmp_path)
    decision = GIT_PUSH.decide(
        "run_command",
        "execute",
        {"argv": ["g", "push"]},
        mode=Mode.AUTO,
        workspace=tmp_path,
        env={"PATH": str(bin_dir)},
    )
    assert decision.action == "deny"


def test_without_a_path_programs_are_looked_up_in_the_default_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(link_program(tmp_path)))
    decision = GIT_PUSH.decide(
        "run_command",
        "execute",
        {"argv": ["g", "push"]},
        mode=Mode.AUTO,
        workspace=tmp_path,
        env={},
    )
    assert decision.action == "allow"  # os.defpath has no g


def test_a_program_in_the_workspace_is_found_from_the_workspace(tmp_path: Path) -> None:
    link_program(tmp_path)
    decision = GIT_PUSH.decide(
        "run_command",
        "execute",
        {"argv": ["./bin/g", "push"]},
        mode=Mode.AUTO,
        workspace=tmp_path,
        env={"PATH": os.defpath},
    )
    assert decision.action == "deny"


# --- a policy stored in a run ---------------------------------------------------------------


def test_a_stored_policy_without_rules_or_source_reads_as_none() -> None:
    assert Policy.from_dict({"source": 3}) == Policy()
    assert Policy.from_dict({}) == Policy()
    [rule] = Policy.from_dict({"rules": [{"action": "deny", "tool": "x"}]}).rules
    assert rule.origin == ""


@pytest.mark.parametrize(
    ("stored", "message"),
    [
        ({"rules": 3}, "stored policy: 'rules' must be a list"),
        ({"rules": [3]}, "stored policy rule 1: a rule must be a table"),
        ({"protected": 3}, "stored policy: 'protected': must be a list of path globs, not 3"),
    ],
)
def test_a_malformed_stored_policy_is_refused_saying_what(
    stored: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        Policy.from_dict(stored)


# --- a policy file --------------------------------------------------------------------------


def test_a_policy_file_is_its_rules_and_its_source(tmp_path: Path) -> None:
    path = write(
        tmp_path, '[[rule]]\naction = "deny"\ntool = "run_command"\nargv = ["git", "push*"]\n'
    )
    policy = load_policy(path)
    assert policy.source == str(path)
    assert policy.rules == (
        Rule(action="deny", tool="run_command", argv=("git", "push*"), origin=f"{path}:1"),
    )


def test_a_missing_policy_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError, match=f"^{re.escape(str(tmp_path / 'no.toml'))}: policy file not found$"
    ):
        load_policy(tmp_path / "no.toml")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "[[rule",
            "{path}:1: invalid TOML: Expected ']]' at the end of an array declaration "
            "(at end of document)",
        ),
        (
            "\n\ncolour = 1\n",
            "{path}:3: unknown key 'colour'; a policy file holds only [[rule]] tables and the path "
            "lists protected = [...] and secret = [...]",
        ),
        ("protected = []\nrule = 3\n", "{path}:2: 'rule' must be written as [[rule]] tables"),
        ("rule = [3]\n", "{path}:1: rule 1: a rule must be a table"),
        (  # rules written inline: each key points at the line of ``rule =``
            '# team rules\nrule = [{ action = "maybe", tool = "x" }]\n',
            "{path}:2: rule 1: action must be one of allow, ask, deny, not 'maybe'",
        ),
        (  # a key the line scanner cannot read points at its rule's header
            '[[rule]]\naction = "deny"\n"two words" = 1\n',
            "{path}:1: rule 1: unknown key 'two words'; allowed keys: action, tool, argv, path, "
            "reason",
        ),
        (
            '[[rule]]\naction = "deny"\ntool = "a"\n\n[[rule]]\naction = "deny"\ncolour = 1\n',
            "{path}:7: rule 2: unknown key 'colour'; allowed keys: action, tool, argv, path, "
            "reason",
        ),
        (
            '[[rule]]\ntool = "a"\n',
            "{path}:1: rule 1: action must be one of allow, ask, deny, not None",
        ),
        ('[[rule]]\naction = "deny"\npath = 3\n', "{path}:3: rule 1: path must be a string, not 3"),
        (
            '[[rule]]\naction = "deny"\ntool = "a"\nreason = 3\n',
            "{path}:4: rule 1: reason must be a string, not 3",
        ),
        (
            '[[rule]]\naction = "deny"\nreason = "r"\n',
            "{path}:1: rule 1: a rule needs at least one of tool, argv, path "
            '(use tool = "*" to match every call)',
        ),
        ('["rule"]\naction = "deny"\n', "{path}:1: 'rule' must be written as [[rule]] tables"),
        ("[protected.x]\n", "{path}:1: must be a list of path globs, not {{'x': {{}}}}"),
        (  # a dotted table header points at its first part's line
            "# paths\n[protected.x]\n",
            "{path}:2: must be a list of path globs, not {{'x': {{}}}}",
        ),
        ('# paths\n["secret"]\n', "{path}:2: must be a list of path globs, not {{}}"),
        (
            "\n\n[X11]\n",
            "{path}:3: unknown key 'X11'; a policy file holds only [[rule]] tables and the path "
            "lists protected = [...] and secret = [...]",
        ),
        (  # a dotted key the line scanner cannot read points at line 1
            "colour.shade = 1\n",
            "{path}:1: unknown key 'colour'; a policy file holds only [[rule]] tables and the path "
            "lists protected = [...] and secret = [...]",
        ),
        (  # a later rule's error points at its own header, not the first rule's
            '[[rule]]\naction = "deny"\ntool = "a"\n\n[[rule]]\naction = "deny"\n',
            "{path}:5: rule 2: a rule needs at least one of tool, argv, path "
            '(use tool = "*" to match every call)',
        ),
        (  # a line in a multi-line string that reads like a key is not where the key is
            '[[rule]]\ntool = "a"\nreason = """\naction = "deny" is for CI\n"""\n',
            "{path}:1: rule 1: action must be one of allow, ask, deny, not None",
        ),
    ],
)
def test_a_policy_file_is_refused_naming_the_line_and_the_rule(
    tmp_path: Path, text: str, message: str
) -> None:
    refused(tmp_path, text, message)


@pytest.mark.parametrize("header", ['[["rule"]]', "[['rule']]", '[[ "rule" ]]'])
def test_a_rule_under_a_quoted_header_is_placed_at_its_own_header(
    tmp_path: Path, header: str
) -> None:
    first = '[[rule]]\naction = "deny"\ntool = "a"\n\n'
    refused(
        tmp_path,
        f'{first}{header}\naction = "deny"\ncolour = 1\n',
        "{path}:7: rule 2: unknown key 'colour'; allowed keys: action, tool, argv, path, reason",
    )
    refused(
        tmp_path,
        f'{first}{header}\naction = "deny"\n',
        "{path}:5: rule 2: a rule needs at least one of tool, argv, path "
        '(use tool = "*" to match every call)',
    )
    path = write(tmp_path, f'{first}{header}\naction = "ask"\ntool = "b"\n')
    assert [rule.origin for rule in load_policy(path).rules] == [f"{path}:1", f"{path}:5"]


def test_an_unreadable_policy_file_is_refused_naming_the_file_and_why(tmp_path: Path) -> None:
    path = tmp_path / "policy.toml"
    path.write_bytes(b'[[rule]]\nreason = "\xff"\n')
    message = (
        f"{path}: cannot read policy file: 'utf-8' codec can't decode byte 0xff in position 19: "
        "invalid start byte"
    )
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        load_policy(path)


def test_a_policy_file_is_read_as_utf8_whatever_the_locale(tmp_path: Path) -> None:
    if sys.flags.utf8_mode:
        pytest.skip("in UTF-8 mode every locale reads files as UTF-8")
    path = write(tmp_path, '[[rule]]\naction = "deny"\ntool = "*"\nreason = "café only"\n')
    saved = locale.setlocale(locale.LC_CTYPE)
    locale.setlocale(locale.LC_CTYPE, "C")  # ASCII: "é" cannot be decoded in this locale
    try:
        [rule] = load_policy(path).rules
    finally:
        locale.setlocale(locale.LC_CTYPE, saved)
    assert rule.reason == "café only"
