"""How a shell string is split into commands (keel.policy.shell_syntax): brackets and
quotes, backquotes, subshells and arithmetic, and what cannot be read."""

from __future__ import annotations

import pytest

from keel.policy.shell_syntax import closing, read_script


def words(text: str) -> list[tuple[str, ...]]:
    return [c.words for c in read_script(text).commands]


@pytest.mark.parametrize(
    ("text", "end"),
    [
        ("(a \\) b)", 7),  # an escaped bracket does not close
        ('(a ")" b)', 8),  # nor one in quotes
        ("((a) b)", 6),
        ("('a\\')", 5),  # no escapes inside single quotes
        ('("a\\"b")', 7),  # but inside double quotes
        ('("")', 3),  # an empty quoted string ends at its second quote
        ('("\\a")', 5),  # a backslash in double quotes escapes one character only
        ("(\\a)", 3),  # and so does one outside quotes
        ('(a "b', None),
        ("(a (b)", None),
    ],
)
def test_the_bracket_closing_an_opening_one(text: str, end: int | None) -> None:
    assert closing(text, 0) == end


def test_a_backquoted_command_is_read_as_a_script_of_its_own() -> None:
    script = read_script("echo `ls \\`x\\`` done; pwd")
    assert words("echo `ls \\`x\\`` done; pwd") == [("echo", "`ls \\`x\\``", "done"), ("pwd",)]
    assert script.nested == ("ls `x`",)
    assert script.opaque == ("command substitution `...`",)


def test_an_unbalanced_backquote_keeps_the_rest_as_the_word() -> None:
    script = read_script("echo `ls -l")
    assert words("echo `ls -l") == [("echo", "`ls -l")]
    assert (script.nested, script.opaque) == ((), ("unbalanced backquote",))
    escaped = read_script("echo `a\\`")  # the last backquote is escaped: nothing closes
    assert (escaped.nested, escaped.opaque) == ((), ("unbalanced backquote",))


def test_in_backquotes_a_backslash_escapes_only_backquote_backslash_and_dollar() -> None:
    script = read_script("echo `a\\Xb \\$c`")
    assert script.nested == ("a\\Xb $c",)


def test_an_unbalanced_expansion_runs_to_the_end() -> None:
    script = read_script("echo $((1+2")
    assert words("echo $((1+2") == [("echo", "$((1+2")]
    assert script.opaque == ("arithmetic expansion $((...))", "unbalanced parentheses or braces")
    # to the very end: a last character is part of the word, not an operator or a quote
    assert words("echo $(ls;") == [("echo", "$(ls;")]
    assert read_script("echo $(ls '").opaque == ("unbalanced parentheses or braces",)


def test_control_operators_separate_commands() -> None:
    assert words("a; b && c || d | e & f") == [("a",), ("b",), ("c",), ("d",), ("e",), ("f",)]


def test_a_subshell_is_a_script_of_its_own_and_what_follows_is_read_on() -> None:
    script = read_script("(cd x; ls) ; b")
    assert words("(cd x; ls) ; b") == [("b",)]
    assert script.nested == ("cd x; ls",)
    assert script.opaque == ("parentheses (a subshell or function definition)",)
    arithmetic = read_script("((x++)); y")
    assert arithmetic.nested == ("(x++)",)  # dash runs ((...)) as two subshells
    assert arithmetic.opaque == ("arithmetic command ((...))",)
    assert words("((x++)); y") == [("y",)]
    # each parenthesis is judged where it stands, not by how the string starts
    later = read_script("((x)); (rm y)")
    assert later.nested == ("(x)", "rm y")
    assert later.opaque == (
        "arithmetic command ((...))",
        "parentheses (a subshell or function definition)",
    )
    assert read_script("a; ((x))").opaque == ("arithmetic command ((...))",)
    # what follows the closing parenthesis is read on: here a redirection, not a command
    assert words("(ls)>out; pwd") == [("pwd",)]
    unbalanced = read_script("(ls; b")
    assert unbalanced.commands == () and unbalanced.opaque == (
        "parentheses (a subshell or function definition)",
        "unbalanced parentheses",
    )


def test_and_and_or_inside_a_test_are_not_command_separators() -> None:
    assert words("if [[ a && b ]]; then c; fi") == [("c",)]
    assert words("[[ -f x || -d x ]] && ls") == [("ls",)]


def test_a_command_after_a_dollar_single_quote_is_read_as_bash_reads_it() -> None:
    # bash, zsh, ksh (and POSIX.1-2024) read $'\'' as one quote character: the commands
    # after it run, and must not be read as the inside of a quoted word
    text = "echo $'\\'' ; rm -rf x ; echo \\'"
    script = read_script(text)
    assert [c.words for c in script.commands] == [
        ("echo", "$'\\''"),
        ("rm", "-rf", "x"),
        ("echo", "'"),
    ]
    assert script.opaque == ("dollar-single-quotes $'...' (shells read them differently)",)


def test_a_command_dash_runs_after_a_dollar_single_quote_is_read_too() -> None:
    # dash reads $'\' as $ then '\': `rm -rf x` runs there, and bash reads it as quoted text
    text = "echo $'\\' ; rm -rf x ; echo '\\'"
    script = read_script(text)
    assert [c.words for c in script.commands] == [("echo", "$'\\' ; rm -rf x ; echo ''")]
    assert [c.words for c in read_script(script.nested[-1]).commands] == [
        ("echo", "$\\"),
        ("rm", "-rf", "x"),
        ("echo", "\\"),
    ]
    assert "dollar-single-quotes $'...' (shells read them differently)" in script.opaque


def test_a_dollar_quote_without_escapes_is_the_text_bash_reads() -> None:
    script = read_script("git push $'--force' $\"--all\"")
    assert [c.words for c in script.commands] == [("git", "push", "--force", "--all")]
    assert script.nested == ()
    assert script.opaque == (
        "dollar-single-quotes $'...' (shells read them differently)",
        'locale translation $"..."',
    )
    inside = read_script("echo \"$'a'\"")  # in double quotes, $' is a dollar and a quote
    assert ([c.words for c in inside.commands], inside.opaque) == ([("echo", "$'a'")], ())


def test_double_parentheses_that_run_commands_are_read() -> None:
    # dash has no ((...)) command: these are subshells, and `rm -rf x` runs
    assert [c.words for c in read_script(read_script("((rm -rf x))").nested[0]).commands] == []
    assert read_script(read_script("((rm -rf x))").nested[0]).nested == ("rm -rf x",)
    # bash too runs them when the inner parenthesis is not closed by "))"
    assert read_script("((rm -rf x) )").nested == ("(rm -rf x) ",)
    substituted = read_script("echo $((rm -rf x) )")
    assert substituted.nested == ("(rm -rf x) ",)
    assert substituted.opaque == ("arithmetic expansion $((...))", "command substitution $(...)")
    assert words("echo $((rm -rf x) )") == [("echo", "$((rm -rf x) )")]
    plain = read_script("echo $((1 + (2 * 3)))")  # arithmetic: nothing runs
    assert (plain.nested, plain.opaque) == ((), ("arithmetic expansion $((...))",))


def test_an_unbalanced_dollar_single_quote_is_read_as_dash_reads_it_too() -> None:
    # bash: $'\' ; rm -rf x never closes; dash: $, '\', then `rm -rf x` runs
    script = read_script("echo $'\\' ; rm -rf x")
    assert words("echo $'\\' ; rm -rf x") == [("echo", "$'\\' ; rm -rf x")]
    assert script.opaque == (
        "dollar-single-quotes $'...' (shells read them differently)",
        "unbalanced quotes",
    )
    assert script.nested == ("echo \\$'\\' ; rm -rf x",)
    assert [c.words for c in read_script(script.nested[0]).commands] == [
        ("echo", "$\\"),
        ("rm", "-rf", "x"),
    ]


def test_a_dollar_quoted_word_is_no_reserved_word_nor_assignment() -> None:
    assert words("$'then' x") == [("then", "x")]
    assert [(c.assignments, c.words) for c in read_script("$'A=1' x").commands] == [
        ((), ("A=1", "x"))
    ]


def test_a_coprocess_and_zsh_precommand_modifiers_run_the_command_after_them() -> None:
    assert words("coproc rm -rf x") == [("rm", "-rf", "x")]
    assert words("coproc job { rm -rf x; }") == [("rm", "-rf", "x")]
    assert words("coproc job {\n rm -rf x\n}") == [("rm", "-rf", "x")]
    assert words("coproc ls") == [("ls",)]
    assert words("coproc job while true; do rm -rf x; done") == [("true",), ("rm", "-rf", "x")]
    assert words("noglob rm -rf *; nocorrect rm y") == [("rm", "-rf", "*"), ("rm", "y")]
    assert words("'coproc' x; echo coproc") == [("coproc", "x"), ("echo", "coproc")]


def test_a_loop_over_the_arguments_runs_the_command_after_its_do() -> None:
    # ``for NAME do ...`` (no ``in``: the positional arguments) is one segment up to ``;``
    assert words("for x do rm -rf y; done") == [("rm", "-rf", "y")]
    assert words("select x do rm -rf y; done") == [("rm", "-rf", "y")]
    assert words("for x in a b; do rm -rf y; done") == [("rm", "-rf", "y")]
    assert words("for x in a do b; done") == []  # here ``do`` is one of the words looped over


def test_a_single_quote_in_a_double_quoted_expansion_is_read_as_dash_reads_it_too() -> None:
    # bash: "${x:-'}"; ...'}" is one word; dash: ' is a character there, } ends the
    # expansion, and `rm -rf y` runs
    text = "echo \"${x:-'}\"; rm -rf y; echo '}\"\\'"
    script = read_script(text)
    assert [c.words for c in script.commands] == [("echo", "${x:-'}\"; rm -rf y; echo '}'")]
    assert script.opaque == ('a single quote inside "${...}" (shells read it differently)',)
    assert [c.words for c in read_script(script.nested[-1]).commands] == [
        ("echo", "${x:-\\'}"),
        ("rm", "-rf", "y"),
        ("echo", '}"\\'),
    ]
    agreed = read_script("echo \"${x:-'a'}\" ${y:-'}'} \"${X:-a}\"")  # both end them alike
    assert (agreed.nested, agreed.opaque) == ((), ())


@pytest.mark.parametrize(
    ("text", "dash_runs"),
    [
        # dash: '...' ends before the expansion, whose ' is a character; the quote before
        # the expansion stays a quote (`rm -rf x` is only echoed)
        (
            "echo '; rm -rf x' \"${y:-'}\"; echo \"'\"",
            [("echo", "; rm -rf x", "${y:-\\'}"), ("echo", "'")],
        ),
        # dash: $'\' is $ then '\', so `rm -rf x` runs there (bash: quoted text); the
        # expansion after it must not make that reading forgotten
        (
            "echo $'\\' ; rm -rf x ; echo '\\' \"${y:-'}\"; echo \"'\"",
            [("echo", "$\\"), ("rm", "-rf", "x"), ("echo", "\\", "${y:-\\'}"), ("echo", "'")],
        ),
    ],
)
def test_dash_reading_of_a_quote_in_an_expansion_keeps_the_quotes_around_it(
    text: str, dash_runs: list[tuple[str, ...]]
) -> None:
    script = read_script(text)
    assert 'a single quote inside "${...}" (shells read it differently)' in script.opaque
    # the commands dash runs (the expansion is kept raw: it is computed)
    assert [c.words for c in read_script(script.nested[-1]).commands] == dash_runs


def test_an_expansion_dash_never_closes_is_read_without_raising() -> None:
    # dash: the " inside "${x:-'"'}" opens a string that never ends (a syntax error, so
    # nothing runs); bash: '"' is quoted, } closes, and `rm -rf y` runs
    script = read_script('echo "${x:-\'"\'}"; rm -rf y')
    assert [c.words for c in script.commands] == [("echo", "${x:-'\"'}"), ("rm", "-rf", "y")]
    assert script.opaque == ('a single quote inside "${...}" (shells read it differently)',)
    assert "unbalanced quotes" in read_script(script.nested[-1]).opaque


def test_a_command_substitution_inside_an_expansion_makes_the_script_opaque() -> None:
    # ``${y:-$(cmd)}`` runs cmd when y is unset: the reason shown to the approver names it
    for text in ("echo ${y:-$(rm -rf x)}", 'echo "${y:-`rm -rf x`}"', "echo ${y:-`id`}"):
        assert read_script(text).opaque == ("command substitution inside ${...}",)
    assert read_script("echo ${y:-a} \"${z#'$'}\"").opaque == ()


def test_a_command_substitution_is_named_as_one() -> None:
    script = read_script("echo $(rm -rf x)")
    assert (script.nested, script.opaque) == (("rm -rf x",), ("command substitution $(...)",))


def test_an_arithmetic_expansion_is_closed_wherever_it_stands() -> None:
    # at the very start of the text, and right after the opening double quote
    script = read_script("$((rm -rf x) )")
    assert [c.words for c in script.commands] == [("$((rm -rf x) )",)]
    assert script.nested == ("(rm -rf x) ",)
    assert script.opaque == ("arithmetic expansion $((...))", "command substitution $(...)")
    quoted = read_script('echo "$((1 + 2))" done')
    assert [c.words for c in quoted.commands] == [("echo", "$((1 + 2))", "done")]
    assert (quoted.nested, quoted.opaque) == ((), ("arithmetic expansion $((...))",))


def test_the_body_of_a_function_keyword_definition_is_read() -> None:
    script = read_script("function f { rm -rf x; }; f")
    assert [c.words for c in script.commands] == [("rm", "-rf", "x"), ("f",)]
    assert script.opaque == ("function definition",)
    assert words("function f") == []


def test_zsh_repeat_and_dash_precommand_run_the_command_after_them() -> None:
    assert words("repeat 3 rm -rf x") == [("rm", "-rf", "x")]
    assert words("- rm -rf x") == [("rm", "-rf", "x")]
    assert words("repeat 3; do rm -rf x; done") == [("rm", "-rf", "x")]
    assert words("echo repeat 3 -") == [("echo", "repeat", "3", "-")]


def test_a_zsh_always_block_is_read() -> None:
    assert words("{ make; } always { rm -rf x; }") == [("make",), ("rm", "-rf", "x")]


@pytest.mark.timeout(60)  # a quadratic scan of these takes many minutes: the hang is the failure
@pytest.mark.parametrize(
    ("word", "expanded"),
    [
        ("[" * 1_000_000, False),  # no closing bracket: no pattern
        ("{" + "," * 1_000_000, False),  # no closing brace: no braces
        ("{," * 500_000, False),
        ("{" * 500_000 + "}" * 500_000, False),
        ("[" * 500_000 + "]", True),
        ("{" * 500_000 + "a,b}", True),
    ],
    ids=["brackets", "commas", "brace-commas", "nested-braces", "a-pattern", "braces"],
)
def test_a_megabyte_word_the_model_writes_is_judged_in_one_pass(word: str, expanded: bool) -> None:
    (command,) = read_script(f"git push {word}").commands

    assert command.words == ("git", "push", word)
    assert command.expanded == ((2,) if expanded else ())
