"""How shells, language interpreters, awk and find take the code they run.

``shell_call`` finds the ``-c`` string of ``sh``/``bash``/``dash``/``zsh``... (flags
combined as ``-lc``, ``-ec``, options such as ``-o pipefail`` skipped);
``inline_code`` says why an interpreter runs code that no file names
(``python -c``, ``perl -ne``, ``node -e``, ``php -r``, a program read from
standard input); ``awk_runs`` flags awk programs that can start commands;
``find_runs`` lists the commands of ``find -exec``. A script file given by name
is not opaque: it is a command like any other.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from keel.policy.git_commands import names

SHELLS = names("sh bash dash zsh ksh ksh93 mksh ash yash posh fish csh tcsh")
_VERSIONED = re.compile(r"(python|pypy|perl|ruby|php|lua|luajit|nodejs|node|bash|zsh)[0-9.]*$")
_FAMILY_ALIASES = {"pypy": "python", "nodejs": "node", "luajit": "lua"}


@dataclass(frozen=True, slots=True)
class Interpreter:
    """Option grammar of a language interpreter, enough to find inline code."""

    inline: frozenset[str]  # options whose value is program text
    valued: frozenset[str] = frozenset()  # options taking the next argument (or the rest)
    attached: frozenset[str] = frozenset()  # short options taking the rest of their cluster
    ends: frozenset[str] = frozenset()  # after these the program is named (``-m MOD``)
    info: frozenset[str] = frozenset()  # these print and exit: nothing is read
    words: bool = False  # options are whole words, any case (``-Command``), never clusters


def _i(
    inline: str, valued: str = "", attached: str = "", ends: str = "", info: str = ""
) -> Interpreter:
    return Interpreter(names(inline), names(valued), names(attached), names(ends), names(info))


_POWERSHELL = Interpreter(
    inline=names("-c -command -encodedcommand -ec -e -enc"),
    valued=names(
        "-executionpolicy -ep -windowstyle -outputformat -of -inputformat -if -workingdirectory "
        "-wd -configurationname -custompipename -settingsfile -configurationfile "
        "-encodedarguments -ea -psconsolefile"
    ),
    ends=names("-file -f"),
    info=names("-version -v -help -h"),
    words=True,
)


_HELP = "-h --help --version"
INTERPRETERS: dict[str, Interpreter] = {
    "python": _i("-c", "-W -X --check-hash-based-pycs", ends="-m", info=f"-V -? {_HELP}"),
    "perl": _i("-e -E", "-I", "-i -l -0 -x -C -d -D -M -m -F -V", info="-v -h --help"),
    "ruby": _i("-e", "-I -r -C -E --encoding", "-0 -K -T -W -x -F -i -l", info=_HELP),
    "node": _i(
        "-e --eval -p --print",
        "-r --require --import --loader -C --conditions --input-type",
        info=f"-v {_HELP}",
    ),
    "bun": _i("-e --eval -p --print", info=f"-v {_HELP}"),
    "php": _i("-r -R -B -E", "-c -d -z -t", ends="-f", info="-v -h -i -m"),
    "lua": _i("-e", "-l", info="-v"),
    "Rscript": _i("-e", info="--version"),
    "R": _i("-e", ends="-f --file", info="--version"),
    "osascript": _i("-e"),
    "pwsh": _POWERSHELL,
    "powershell": _POWERSHELL,
    "tclsh": _i(""),
}
AWKS = names("awk gawk mawk nawk")


def family(program: str) -> str:
    """``python3.11`` → ``python``, ``nodejs`` → ``node``; other names unchanged."""
    found = _VERSIONED.fullmatch(program)
    if found is None:
        return program
    return _FAMILY_ALIASES.get(found.group(1), found.group(1))


def shell_call(args: Sequence[str], *, fish: bool = False) -> tuple[str | None, str | None]:
    """(the ``-c`` string, or None; why the call is opaque, or None) for ``sh ARGS``.

    ``fish``: the shell is fish, which reads its options as ``_fish_call`` says."""
    if fish:
        return _fish_call(args)
    i, command_mode, stdin, reason = 0, False, False, None
    while i < len(args):
        arg = args[i]
        if arg in ("--", "-"):
            i += 1
            break
        if arg.startswith("--"):
            if arg in ("--rcfile", "--init-file"):
                reason, i = "runs a startup file given on its command line", i + 1
            i += 1 + (arg == "--emulate")  # zsh: --emulate MODE
            continue
        if arg[:1] not in ("-", "+") or len(arg) < 2:
            break
        letters = arg[1:]
        command_mode = command_mode or (arg[0] == "-" and "c" in letters)
        stdin = stdin or "s" in letters
        i += 1 + sum(letters.count(c) for c in "oO")  # ``-o pipefail``: a name follows
    rest = args[i:]
    if command_mode:
        return (rest[0], reason) if rest else (None, reason)
    if rest and not stdin:
        return None, reason  # a script file: a command like any other
    return None, reason or "reads commands from standard input"


_FISH_VALUED = "cCpdfDo"  # fish's short options taking a value, attached or the next argument
_FISH_LONG_VALUED = names(
    "--command --init-command --debug-output --debug-stack-frames --features --profile "
    "--profile-startup"
)
_FISH_INIT = "runs a command given on its command line (-C, --init-command) first"


def _fish_call(args: Sequence[str]) -> tuple[str | None, str | None]:
    """``shell_call`` for fish: options until the first operand, every ``-c`` command run
    (joined, one a line), a value attached (``-cCMD``, ``--command=CMD``) or next; an
    ``-C``/``--init-command`` command runs first and is not read here (opaque)."""
    i, commands, reason = 0, [], None
    while i < len(args):
        arg = args[i]
        nxt = args[i + 1] if i + 1 < len(args) else None
        if arg == "--":  # a lone "-" is an operand: fish opens a script file named "-"
            i += 1
            break
        if arg.startswith("--"):  # any unambiguous prefix of a name is that option
            name, eq, value = arg.partition("=")
            if _abbreviates(name, frozenset({"--command"})):
                commands.append(value if eq else nxt or "")
            elif _abbreviates(name, frozenset({"--init-command"})):
                reason = _FISH_INIT
            i += 1 + (not eq and _abbreviates(name, _FISH_LONG_VALUED))
            continue
        if arg[:1] != "-" or len(arg) < 2:
            break
        i += 1
        for k, letter in enumerate(arg[1:], start=2):
            if letter in _FISH_VALUED:
                optarg = arg[k:] if k < len(arg) else nxt
                i += k >= len(arg)
                if letter == "c":
                    commands.append(optarg or "")
                elif letter == "C":
                    reason = _FISH_INIT
                break
    if commands:
        return "\n".join(commands), reason
    if i < len(args):
        return None, reason  # a script file: a command like any other
    return None, reason or "reads commands from standard input"


def inline_code(grammar: Interpreter, args: Sequence[str]) -> str | None:
    """Why an interpreter call runs code not named by a file, or None.

    A long option the grammar does not know may take the next argument as its value
    (``node --title T -e CODE``) or be a flag before the script (``node --flag app.js``):
    the arguments after it are read both ways, and inline code found either way is named."""
    if grammar.words:
        return _inline_words(grammar, args)
    i, unsure = 0, False
    while i < len(args):
        arg = args[i]
        if arg == "-":
            return None if unsure else "reads its program from standard input"
        if arg == "--" or not arg.startswith("-"):
            if unsure or arg != "--" or i + 1 < len(args):
                return None
            return "reads from standard input"
        name = arg.split("=", 1)[0]
        if arg.startswith("--") or name in grammar.inline | grammar.ends | grammar.info:
            if name in grammar.inline:
                return f"runs inline code ({name})"
            if name in grammar.ends or name in grammar.info:
                return None
            if "=" in arg:
                i += 1
            elif name in grammar.valued:
                i += 2
            elif i + 1 < len(args) and not args[i + 1].startswith("-"):
                unsure, i = True, i + 2  # the next argument: this option's value, or the script
            else:
                i += 1
            continue
        for k, letter in enumerate(arg[1:]):
            option = "-" + letter
            if option in grammar.inline:
                return f"runs inline code ({option})"
            if option in grammar.ends or option in grammar.info:
                return None
            if option in grammar.attached:
                break
            if option in grammar.valued:
                i += 1 if k == len(arg) - 2 else 0
                break
        i += 1
    return None if unsure else "reads its program from standard input"


def _inline_words(grammar: Interpreter, args: Sequence[str]) -> str | None:
    """``inline_code`` for options that are whole words in any case, each also spelled as
    any prefix of its name (``-Comm``, ``-ex Bypass``), its value after it or a colon
    (``-ExecutionPolicy Bypass``, ``-Command:ls``)."""
    skip = False
    for arg in args:
        if skip:
            skip = False
            continue
        word = arg.lower().split(":", 1)[0]
        if _abbreviates(word, grammar.inline):
            return f"runs inline code ({arg})"
        if not arg.startswith("-") or _abbreviates(word, grammar.ends | grammar.info):
            return None
        skip = ":" not in arg and _abbreviates(word, grammar.valued)
    return "reads its program from standard input"


def _abbreviates(word: str, options: frozenset[str]) -> bool:
    """True when ``word`` (``-`` and at least a letter) starts one of the ``options``."""
    return len(word) > 1 and any(option.startswith(word) for option in options)


# gawk's -i/--include and -l/--load name a library, mawk's and gawk's -W an option: each
# takes the next argument, which is not the program.
_AWK_VALUED = ("-i", "--include", "-l", "--load", "-W")


def awk_runs(args: Sequence[str]) -> str | None:
    """Why an awk program may run commands (``system()``, pipes), or None.

    Every ``-e``/``--source`` program is judged (gawk runs them all, with the ``-f``
    files, in order); the first operand is the program only when no ``-e`` or ``-f``
    gave one (``-E``/``--exec`` is gawk's ``-f`` that ends the options). A program file
    is not read: it is a file like any other the command names."""
    i, programs, from_file = 0, [], False
    while i < len(args):
        arg = args[i]
        if arg in ("-f", "--file", "-E", "--exec"):
            from_file, i = True, i + 2
            continue
        if arg.startswith(("--file=", "-f", "--exec=", "-E")):
            from_file, i = True, i + 1
            continue
        if arg in ("-e", "--source"):
            programs.append(args[i + 1] if i + 1 < len(args) else "")
            i += 2
            continue
        if arg.startswith("--source="):
            programs.append(arg.removeprefix("--source="))
            i += 1
            continue
        if arg in ("-F", "-v", "--assign", "--field-separator", *_AWK_VALUED):
            i += 2
            continue
        if arg == "--":
            i += 1
            break
        if not arg.startswith("-") or arg == "-":
            break
        i += 1
    if not programs and not from_file and i < len(args):
        programs.append(args[i])
    if any("system" in program or "|" in program for program in programs):
        return "program may run commands (system() or a pipe)"
    return None


def find_runs(args: Sequence[str]) -> list[tuple[str, ...]]:
    """The commands of ``-exec``, ``-execdir``, ``-ok`` and ``-okdir``.

    A command ends at ``;``, or at a ``+`` — but finds disagree on which ``+``: GNU and
    BSD find end ``-exec`` and ``-execdir`` only at a ``+`` right after ``{}`` (elsewhere
    it is an argument, and GNU's ``-ok`` and ``-okdir`` end only at ``;``), busybox at any
    ``+``. The commands of both readings are listed (the second's after the first's, when
    not among them), so none runs unseen whichever find runs them."""
    whole = _find_reading(args, lambda action, before: action in _PLUS_ENDS and before == "{}")
    cut = _find_reading(args, lambda action, before: True)
    return whole + [run for run in cut if run not in whole]


_FIND_ACTIONS = ("-exec", "-execdir", "-ok", "-okdir")
_PLUS_ENDS = ("-exec", "-execdir")  # GNU: the actions a ``{} +`` ends


def _find_reading(
    args: Sequence[str], plus_ends: Callable[[str, str], bool]
) -> list[tuple[str, ...]]:
    """The commands find runs when a ``+`` ends an action's command if ``plus_ends(action,
    the argument before it)``."""
    runs, i = [], 0
    while i < len(args):
        if args[i] in _FIND_ACTIONS:
            end = i + 1
            while end < len(args) and not (
                args[end] == ";" or (args[end] == "+" and plus_ends(args[i], args[end - 1]))
            ):
                end += 1
            runs.append(tuple(args[i + 1 : end]))
            i = end
        i += 1
    return runs


__all__ = [
    "AWKS",
    "INTERPRETERS",
    "SHELLS",
    "Interpreter",
    "awk_runs",
    "family",
    "find_runs",
    "inline_code",
    "shell_call",
]
