"""How interpreters, awk and find take the code they run (keel.policy.programs): which
calls run code no file names, and which commands ``find -exec`` starts."""

from __future__ import annotations

import pytest

from keel.policy.commands import normalise_command, writes_git
from keel.policy.programs import INTERPRETERS, awk_runs, find_runs, inline_code, shell_call

PYTHON, PERL, PWSH = INTERPRETERS["python"], INTERPRETERS["perl"], INTERPRETERS["pwsh"]
STDIN = "reads its program from standard input"


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["-c", "print(1)"], "runs inline code (-c)"),
        (["-cprint(1)"], "runs inline code (-c)"),
        (["-bc", "x"], "runs inline code (-c)"),
        (["-W", "ignore", "-c", "x"], "runs inline code (-c)"),
        (["-Wignore", "-c", "x"], "runs inline code (-c)"),
        (["-W", "-c"], STDIN),  # -c is -W's value here
        (["-X", "dev", "x.py"], None),
        (["--check-hash-based-pycs", "always", "x.py"], None),
        (["--check-hash-based-pycs=always", "x.py"], None),
        (["--check-hash-based-pycs=always", "-c", "x"], "runs inline code (-c)"),
        (["--unknown", "x.py"], None),
        (["-m", "http.server"], None),
        (["-mcompileall", "."], None),  # the module's name is no cluster of options
        (["-V"], None),
        (["--version"], None),
        (["x.py", "-c"], None),
        ([], STDIN),
        (["-"], STDIN),
        (["-u"], STDIN),
        (["--", "x.py"], None),
        (["--"], "reads from standard input"),
        (["-", "x.py"], STDIN),  # the program comes from standard input, x.py is its argument
        # after a long option and its value, the options are still read
        (["-u", "--check-hash-based-pycs", "always", "-c", "x"], "runs inline code (-c)"),
        (["-W", "ignore", "--check-hash-based-pycs=never", "-c", "x"], "runs inline code (-c)"),
    ],
)
def test_which_python_calls_run_code_no_file_names(args: list[str], why: str | None) -> None:
    assert inline_code(PYTHON, args) == why


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["-ne", "print"], "runs inline code (-e)"),
        (["-i.bak", "-pe", "s/a/b/"], "runs inline code (-e)"),
        (["-Ilib", "-e", "1"], "runs inline code (-e)"),
        (["-I", "lib", "x.pl"], None),
        (["-MFile::Basename", "x.pl"], None),  # -M takes the rest of its argument
        (["-v"], None),
    ],
)
def test_which_perl_calls_run_code_no_file_names(args: list[str], why: str | None) -> None:
    assert inline_code(PERL, args) == why


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["--require", "./hook.js", "-e", "x"], "runs inline code (-e)"),
        (["--no-warnings", "--require", "./hook.js", "-e", "x"], "runs inline code (-e)"),
        (["--require=./hook.js", "-e", "x"], "runs inline code (-e)"),
        (["--eval=a=1", "app.js"], "runs inline code (--eval)"),  # the name ends at the first =
        (["--require", "./hook.js", "app.js"], None),
        # an option not known here may take a value: code after it is seen either way
        (["--title", "t", "-e", "x"], "runs inline code (-e)"),
        (["--env-file", ".env", "--eval", "x"], "runs inline code (--eval)"),
        (["--experimental-vm-modules", "test.js"], None),  # a flag before the script
        (["--title", "t"], None),
        (["--title=t", "-e", "x"], "runs inline code (-e)"),
        (["--title", "t", "-"], None),  # t may be the script, its argument -
        (["--title", "t", "--"], None),
        (["--no-warnings"], STDIN),
        # the options are still read after a long one that follows a value
        (["-r", "./hook.js", "--no-warnings", "-e", "x"], "runs inline code (-e)"),
        (["-r", "./hook.js", "--input-type=module", "-e", "x"], "runs inline code (-e)"),
        (["-C", "dev", "--no-warnings", "app.js"], None),
    ],
)
def test_which_node_calls_run_code_no_file_names(args: list[str], why: str | None) -> None:
    assert inline_code(INTERPRETERS["node"], args) == why


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["-NoProfile", "-Command", "Get-Date"], "runs inline code (-Command)"),
        (["-c:ls"], "runs inline code (-c:ls)"),
        (["-c:Get-Item c:/x", "x.ps1"], "runs inline code (-c:Get-Item c:/x)"),  # name ends at :
        (["-File", "x.ps1"], None),
        (["-Version"], None),
        (["x.ps1"], None),
        (["-NoProfile"], STDIN),
        # a parameter's value is no script: the code after it is seen
        (["-ExecutionPolicy", "Bypass", "-Command", "x"], "runs inline code (-Command)"),
        (["-ep", "Bypass", "-c", "x"], "runs inline code (-c)"),
        (["-ExecutionPolicy:Bypass", "-c", "x"], "runs inline code (-c)"),
        (["-wd", "/tmp", "-EncodedCommand", "eA=="], "runs inline code (-EncodedCommand)"),
        (["-ExecutionPolicy", "Bypass", "-File", "x.ps1"], None),
        (["-ExecutionPolicy", "Bypass", "x.ps1"], None),  # Bypass is a value, x.ps1 the script
        # any prefix of a parameter's name is that parameter
        (["-Comm", "Get-Date"], "runs inline code (-Comm)"),
        (["-nop", "-enco", "eA=="], "runs inline code (-enco)"),
        (["-Exec", "Bypass", "-com", "x"], "runs inline code (-com)"),
        (["-fi", "x.ps1", "-c", "x"], None),
        (["-ver"], None),
        (["-"], STDIN),  # a lone dash abbreviates nothing: the commands come from standard input
    ],
)
def test_which_powershell_calls_run_code_no_file_names(args: list[str], why: str | None) -> None:
    assert inline_code(PWSH, args) == why


SYSTEM = "program may run commands (system() or a pipe)"


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["{ print }"], None),
        (['{ system("x") }'], SYSTEM),
        (['{ print | "sh" }'], SYSTEM),
        (["-F", ",", '{ system("x") }'], SYSTEM),
        (["--field-separator", ",", '{ system("x") }'], SYSTEM),
        (["-v", "a=1", '{ system("x") }'], SYSTEM),
        (["--assign", "a=1", '{ system("x") }'], SYSTEM),
        (["-e", '{ system("x") }'], SYSTEM),
        (["--source", '{ system("x") }'], SYSTEM),
        (["-e", "{ print }", "system.log"], None),  # a data file's name is no program
        (["-e", "{ print }", "-e", '{ system("x") }'], SYSTEM),  # every -e program is run
        (["--source", "{ print }", "--source", '{ system("x") }'], SYSTEM),
        (["-F", ",", "-e", '{ system("x") }'], SYSTEM),
        (["-v", "a=1", "-e", '{ system("x") }'], SYSTEM),
        (["--posix", "-F", ",", '{ system("x") }'], SYSTEM),
        (["-v", "a=1", "--posix", '{ system("x") }'], SYSTEM),
        (["-v", "a=1", "--", '{ system("x") }'], SYSTEM),
        (["--", '-1 == $1 { system("x") }'], SYSTEM),  # after --, a program may start with -
        (["-e"], None),
        (["-x", '{ system("x") }'], SYSTEM),
        (["--", '{ system("x") }'], SYSTEM),
        (["-f", "p.awk", "system.log"], None),
        (["--file", "system.awk"], None),
        (["--file=p.awk", "system.log"], None),
        (["-fp.awk", "system.log"], None),
        # gawk runs every -e program and every -f file, in order: each -e is judged
        (["-e", 'BEGIN { system("x") }', "-e", "{ print }"], SYSTEM),
        (['--source=BEGIN { system("x") }', "{ print }"], SYSTEM),
        (["--source={ print }", "system.log"], None),
        (["-e", 'BEGIN { system("x") }', "-f", "p.awk"], SYSTEM),
        (["-f", "p.awk", "-e", '{ print | "sh" }'], SYSTEM),
        (["-fp.awk", "-e", "{ print }", "system.log"], None),
        # a program file named in the same argument does not hide the -e after it
        (["-fp.awk", "-e", 'BEGIN { system("x") }'], SYSTEM),
        (["--file=p.awk", "-e", '{ print | "sh" }'], SYSTEM),
        # nor does a --source= program hide the programs after it
        (["--source={ print }", "-e", 'BEGIN { system("x") }'], SYSTEM),
        (["-v", "a=1", "--source={ print }", "-e", 'BEGIN { system("x") }'], SYSTEM),
        (["-f", "p.awk", '{ system("x") }'], None),  # after -f, an operand is a data file
        (["-", "system.log"], None),
        ([], None),
        # a library or option name taking the next argument is no program: the one after is
        (["-i", "inplace", 'BEGIN { system("x") }'], SYSTEM),
        (["--include", "inplace", 'BEGIN { system("x") }'], SYSTEM),
        (["-l", "filefuncs", 'BEGIN { system("x") }'], SYSTEM),
        (["--load", "filefuncs", 'BEGIN { system("x") }'], SYSTEM),
        (["-W", "interactive", 'BEGIN { system("x") }'], SYSTEM),
        (["-i", "system.awk", "{ print }"], None),
        # gawk -E names the program file (and ends the options): operands are data files
        (["-E", "p.awk", "system.log"], None),
        (["--exec", "p.awk", "system.log"], None),
        (["--exec=p.awk", "system.log"], None),
        (["-Ep.awk", "system.log"], None),
        (["--exec", "system.awk", "data"], None),  # a program file's name is no program
        # what follows -E goes to the program, but a -e there is judged all the same
        # (erring towards asking): it is never let through unread
        (["-E", "p.awk", "-e", 'BEGIN { system("x") }'], SYSTEM),
    ],
)
def test_which_awk_programs_may_run_commands(args: list[str], why: str | None) -> None:
    assert awk_runs(args) == why


@pytest.mark.parametrize(
    ("args", "runs"),
    [
        (["-exec", "ls", ";"], [("ls",)]),
        ([".", "-name", "*.py", "-exec", "rm", "{}", ";"], [("rm", "{}")]),
        (
            [".", "-execdir", "wc", "{}", "+", "-ok", "cat", "{}", ";"],
            [("wc", "{}"), ("cat", "{}")],
        ),
        ([".", "-okdir", "echo", "{}", ";", "-print"], [("echo", "{}")]),
        ([".", "-exec", "rm", "-rf", "{}"], [("rm", "-rf", "{}")]),
        ([".", "-name", "x"], []),
        ([".", "-exec", ";", "-exec", "ls", ";"], [(), ("ls",)]),  # an empty command ends at once
    ],
)
def test_the_commands_find_starts(args: list[str], runs: list[tuple[str, ...]]) -> None:
    assert find_runs(args) == runs


@pytest.mark.parametrize(
    ("args", "runs"),
    [
        # GNU and BSD find end -exec at a "+" only right after "{}": elsewhere it is an argument
        (
            [".", "-exec", "git", "--namespace", "+", "push", ";"],
            [("git", "--namespace", "+", "push"), ("git", "--namespace")],
        ),
        # GNU's -ok and -okdir end only at ";"
        (
            [".", "-ok", "rm", "{}", "+", "-rf", "x", ";"],
            [("rm", "{}", "+", "-rf", "x"), ("rm", "{}")],
        ),
        # busybox ends -exec at any "+": what follows is find's expression again
        (
            [".", "-exec", "echo", "{}", "x", "+", "-exec", "rm", "y", ";"],
            [("echo", "{}", "x", "+", "-exec", "rm", "y"), ("echo", "{}", "x"), ("rm", "y")],
        ),
        ([".", "-exec", "wc", "{}", "+", "-exec", "ls", ";"], [("wc", "{}"), ("ls",)]),
    ],
)
def test_find_commands_are_read_as_every_find_reads_them(
    args: list[str], runs: list[tuple[str, ...]]
) -> None:
    assert find_runs(args) == runs


def test_a_git_write_after_a_plus_that_is_no_terminator_is_seen() -> None:
    argv = ["find", ".", "-maxdepth", "0", "-exec", "git", "--namespace", "+", "push", ";"]
    view = normalise_command(argv, cwd=".")
    assert ("git", "push") in [form.normal for form in view.forms]
    assert writes_git(view)


FISH_INIT = "runs a command given on its command line (-C, --init-command) first"


@pytest.mark.parametrize(
    ("args", "call"),
    [
        (["-C", "rm -rf x", "s.fish"], (None, FISH_INIT)),
        (["-Crm -rf x", "s.fish"], (None, FISH_INIT)),  # the command attached, no -c in it
        (["--init-command=rm -rf x", "s.fish"], (None, FISH_INIT)),
        (["--init-command", "rm -rf x", "s.fish"], (None, FISH_INIT)),
        (["-i", "-C", "rm -rf x", "-c", "ls"], ("ls", FISH_INIT)),
        (["-c", "ls"], ("ls", None)),
        (["s.fish"], (None, None)),
        (["-crm -rf x"], ("rm -rf x", None)),  # -c's value attached
        (["--command=rm -rf x"], ("rm -rf x", None)),
        (["--comm", "rm -rf x"], ("rm -rf x", None)),  # any prefix of a long name
        (["-c", "ls", "-c", "rm -rf x"], ("ls\nrm -rf x", None)),  # every -c is run
        (["-c", "ls", "-C", "rm -rf x"], ("ls", FISH_INIT)),  # options go on after a value
        (["-f", "no-x", "-c", "rm -rf x"], ("rm -rf x", None)),  # -f takes a value
        (["--features", "no-x", "-c", "rm -rf x"], ("rm -rf x", None)),
        (["--feat", "no-x", "-c", "rm -rf x"], ("rm -rf x", None)),
        (["-ilc", "rm -rf x"], ("rm -rf x", None)),
        ([], (None, "reads commands from standard input")),
    ],
)
def test_a_fish_init_command_is_not_hidden(
    args: list[str], call: tuple[str | None, str | None]
) -> None:
    assert shell_call(args, fish=True) == call


FISH_STDIN = "reads commands from standard input"


@pytest.mark.parametrize(
    ("args", "call"),
    [
        # after "--" the first argument is the script file, even one spelled as an option
        (["--", "s.fish"], (None, None)),
        (["--", "-c", "rm -rf x"], (None, None)),
        (["--", "--command=rm -rf x"], (None, None)),
        (["-i", "--", "s.fish"], (None, None)),
        (["-c", "ls", "--", "-c", "rm -rf x"], ("ls", None)),  # $argv of the command
        # "--" with nothing after it: the commands come from standard input
        (["--"], (None, FISH_STDIN)),
        (["-i", "--"], (None, FISH_STDIN)),
        (["--login", "--"], (None, FISH_STDIN)),
        # fish has no "-" for standard input: it opens a script file named "-"
        (["-"], (None, None)),
        (["-i", "-"], (None, None)),
        (["-", "-c", "rm -rf x"], (None, None)),
        # a long option's value follows it or "=": the options go on after it
        (["--features=no-x", "-c", "rm -rf x"], ("rm -rf x", None)),
        (["-i", "--features", "no-x", "-c", "rm -rf x"], ("rm -rf x", None)),
        (["-l", "--debug-output", "/tmp/log", "s.fish"], (None, None)),
        # a long flag takes no value: the options go on after it
        (["--login", "-c", "rm -rf x"], ("rm -rf x", None)),
        (["-i", "--no-config", "-c", "rm -rf x"], ("rm -rf x", None)),
        (["--login", "s.fish"], (None, None)),
    ],
)
def test_fish_options_end_where_fish_ends_them(
    args: list[str], call: tuple[str | None, str | None]
) -> None:
    assert shell_call(args, fish=True) == call


@pytest.mark.parametrize(
    "argv",
    [
        ["fish", "-c"],
        ["fish", "-c", ""],
        ["fish", "-ic"],
        ["fish", "--command"],
        ["fish", "--command", ""],
        ["fish", "--comm="],
    ],
)
def test_fish_given_no_command_runs_nothing(argv: list[str]) -> None:
    # fish exits on a missing -c value and runs nothing for an empty one
    view = normalise_command(argv, cwd=".")
    assert view.forms == ()
    assert view.opaque is None


def test_the_noclobber_flag_of_other_shells_takes_no_command() -> None:
    assert shell_call(["-C", "s.sh"]) == (None, None)
    assert shell_call(["-Cc", "ls"]) == ("ls", None)


def test_zsh_emulate_takes_a_mode_before_the_command() -> None:
    assert shell_call(["--emulate", "sh", "-c", "rm -rf x"]) == ("rm -rf x", None)


def test_fish_runs_its_init_command_unseen_no_more() -> None:
    view = normalise_command(["fish", "-C", "rm -rf x", "s.fish"], cwd=".")
    assert view.opaque is not None and "fish runs a command" in view.opaque
