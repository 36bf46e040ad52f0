"""Programs that run another program: what each one runs, once its own options are skipped.

``unwrap(program, args)`` knows the option grammar of ``env``, ``nice``,
``timeout``, ``nohup``, ``stdbuf``, ``time``, ``xargs``, ``command``, ``exec``,
``builtin``, ``setsid``, ``ionice``, ``chrt``, ``taskset``, ``sudo``, ``doas``
and ``flock`` (GNU/util-linux spellings: short clusters, ``--long=value``,
unambiguous long prefixes, options ending at the first operand as these programs
do). It returns the argv the wrapper runs, or the shell string (``flock -c``),
with the environment and directory changes a program lookup depends on. An
option it does not know makes the result opaque rather than guessed.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field

_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")


@dataclass(frozen=True, slots=True, kw_only=True)
class Unwrapped:
    """What a wrapper runs: ``argv`` (empty: nothing) or a ``shell`` string."""

    argv: tuple[str, ...] = ()
    shell: str | None = None
    env: tuple[str, ...] = ()  # NAME=value set for the command
    clear_env: bool = False  # env -i: the command starts from an empty environment
    unset: tuple[str, ...] = ()
    cwd: str | None = None  # the directory the command starts in, relative to the current one
    default_path: bool = False  # command -p: looked up in the system's default PATH
    opaque: str | None = None


@dataclass(frozen=True, slots=True)
class _Grammar:
    flags: frozenset[str] = frozenset()  # take no value: "-i", "--foreground"
    valued: frozenset[str] = frozenset()  # take a value: "-s X", "-sX", "--signal[=]X"
    optional: frozenset[str] = frozenset()  # take a value only when attached: "-e[X]", "--eof[=X]"
    operands: int = 0  # positional arguments before the command (timeout's DURATION)
    no_command: frozenset[str] = field(default_factory=frozenset)  # options meaning "run nothing"


def _g(
    flags: str = "", valued: str = "", optional: str = "", operands: int = 0, none: str = ""
) -> _Grammar:
    return _Grammar(
        frozenset(flags.split()),
        frozenset(valued.split()),
        frozenset(optional.split()),
        operands,
        frozenset(none.split()),
    )


GRAMMARS: dict[str, _Grammar] = {
    "env": _g(
        "-i --ignore-environment -0 --null -v --debug --list-signal-handling",
        "-u --unset -C --chdir -S --split-string",
        "--block-signal --default-signal --ignore-signal",
    ),
    "nice": _g(valued="-n --adjustment"),
    "timeout": _g(
        "--foreground --preserve-status -v --verbose", "-s --signal -k --kill-after", operands=1
    ),
    "nohup": _g(),
    "stdbuf": _g(valued="-i --input -o --output -e --error"),
    "time": _g("-p --portability -v --verbose -a --append -q --quiet", "-f --format -o --output"),
    "xargs": _g(
        "-0 --null -p --interactive -r --no-run-if-empty -t --verbose -x --exit -o --open-tty "
        "--show-limits",
        "-a --arg-file -d --delimiter -E -I -L -n --max-args -P --max-procs -s --max-chars "
        "--process-slot-var",
        "-e --eof -i --replace -l --max-lines",
    ),
    "command": _g("-p -v -V", none="-v -V"),
    "exec": _g("-c -l", "-a"),
    "builtin": _g(),
    "setsid": _g("-c --ctty -f --fork -w --wait"),
    "ionice": _g(
        "-t --ignore",
        "-c --class -n --classdata -p --pid -P --pgid -u --uid",
        none="-p --pid -P --pgid -u --uid",
    ),
    "chrt": _g(
        "-a --all-tasks -b --batch -d --deadline -e --ext -f --fifo -i --idle -o --other "
        "-r --rr -R --reset-on-fork -v --verbose -m --max -p --pid",
        "-T --sched-runtime -P --sched-period -D --sched-deadline",
        operands=1,
        none="-m --max -p --pid",
    ),
    "taskset": _g("-a --all-tasks -c --cpu-list -p --pid", operands=1, none="-p --pid"),
    "sudo": _g(
        "-A --askpass -b --background -E -H --set-home -i --login -K --remove-timestamp "
        "-k --reset-timestamp -n --non-interactive -P --preserve-groups -S --stdin -s --shell "
        "-N --no-update -B --bell -l --list -v --validate -V --version -e --edit",
        "-C --close-from -D --chdir -g --group -p --prompt -R --chroot -r --role -t --type "
        "-T --command-timeout -U --other-user -u --user",
        "-h --host --preserve-env",
        none="-l --list -v --validate -V --version -e --edit -K --remove-timestamp",
    ),
    "doas": _g("-n -s -L", "-u -C", none="-L -C"),
    "flock": _g(
        "-s --shared -x -e --exclusive -u --unlock -n --nb --nonblock -o --close -F --no-fork "
        "--verbose",
        "-w --wait --timeout -E --conflict-exit-code -c --command",
        operands=1,
    ),
}
WRAPPERS = frozenset(GRAMMARS)
_NUMERIC = re.compile(r"-[+-]?\d+$")  # nice's old ``-5`` spelling


@dataclass
class _Parsed:
    options: list[tuple[str, str | None]]
    rest: list[str]  # operands, then the command
    opaque: str | None = None


def _parse(program: str, grammar: _Grammar, args: Sequence[str]) -> _Parsed:
    """Options up to the first operand (or ``--``), GNU style; the rest as given."""
    options: list[tuple[str, str | None]] = []
    longs = [o for o in (*grammar.flags, *grammar.valued, *grammar.optional) if o[:2] == "--"]
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            return _Parsed(options, list(args[i + 1 :]))
        if program == "nice" and _NUMERIC.match(arg):
            options.append(("-n", arg.lstrip("-")))
        elif arg.startswith("--"):
            name, eq, value = arg.partition("=")
            if name not in longs:
                matches = [o for o in longs if o.startswith(name)]
                if len(matches) != 1:
                    return _Parsed(options, [], f"{program}: unknown option {name!r}")
                name = matches[0]
            if name in grammar.valued and not eq:
                if i + 1 >= len(args):
                    return _Parsed(options, [], f"{program}: {name} needs a value")
                i += 1
                value = args[i]
            options.append((name, value if eq or name in grammar.valued else None))
        elif arg.startswith("-") and arg != "-":
            k = 1
            while k < len(arg):
                name = "-" + arg[k]
                if name in grammar.valued:
                    value = arg[k + 1 :]
                    if not value:
                        if i + 1 >= len(args):
                            return _Parsed(options, [], f"{program}: {name} needs a value")
                        i += 1
                        value = args[i]
                    options.append((name, value))
                    break
                if name in grammar.optional:
                    options.append((name, arg[k + 1 :] or None))
                    break
                if name not in grammar.flags:
                    return _Parsed(options, [], f"{program}: unknown option {name!r}")
                options.append((name, None))
                k += 1
        else:
            return _Parsed(options, list(args[i:]))
        i += 1
    return _Parsed(options, [])


def unwrap(program: str, args: Sequence[str]) -> Unwrapped | None:
    """What wrapper ``program`` runs with ``args``; None when it is not a wrapper."""
    grammar = GRAMMARS.get(program)
    if grammar is None:
        return None
    if program == "env":
        return _env(list(args))
    parsed = _parse(program, grammar, args)
    if parsed.opaque is not None:
        return Unwrapped(opaque=parsed.opaque)
    names = {name for name, _ in parsed.options}
    if names & grammar.no_command:
        return Unwrapped()
    command = parsed.rest[grammar.operands :]  # after operands such as timeout's DURATION
    if program == "xargs":
        return Unwrapped(
            argv=tuple(command) or ("echo",),
            opaque="xargs appends arguments read from standard input",
        )
    if program == "exec" and "-a" in names:
        return Unwrapped(opaque="exec -a runs the program under another name")
    if program == "flock":
        return _flock(parsed.options, command)
    if program == "sudo":
        env, start = _assignments(command)
        if not command[start:] and names & {"-s", "--shell", "-i", "--login"}:
            return Unwrapped(opaque="sudo runs a shell reading standard input")
        cwd = next((v for n, v in parsed.options if n in ("-D", "--chdir")), None)
        return Unwrapped(argv=tuple(command[start:]), env=env, cwd=cwd)
    if program == "doas" and "-s" in names:
        return Unwrapped(opaque="doas -s runs a shell reading standard input")
    return Unwrapped(argv=tuple(command), default_path=program == "command" and "-p" in names)


def _assignments(args: Sequence[str]) -> tuple[tuple[str, ...], int]:
    """Leading ``NAME=value`` arguments and where the command starts after them."""
    i = 0
    while i < len(args) and _ASSIGNMENT.match(args[i]):
        i += 1
    return tuple(args[:i]), i


def _env(args: list[str]) -> Unwrapped:
    """``env``: options (``-S`` splits its string into more arguments), assignments, command."""
    grammar = GRAMMARS["env"]
    clear, unset, cwd = False, [], None
    while True:
        if args[:1] == ["-"]:
            clear, args = True, args[1:]
        parsed = _parse("env", grammar, args)
        if parsed.opaque is not None:
            return Unwrapped(opaque=parsed.opaque)
        split = None
        for name, value in parsed.options:
            if name in ("-i", "--ignore-environment"):
                clear = True
            elif name in ("-u", "--unset") and value is not None:
                unset.append(value)
            elif name in ("-C", "--chdir"):
                cwd = value
            elif name in ("-S", "--split-string") and value is not None:
                split = value
        if split is None:
            break
        try:
            args = shlex.split(split) + parsed.rest
        except ValueError:
            return Unwrapped(opaque="env -S string has unbalanced quotes")
    env, start = _assignments(parsed.rest)
    return Unwrapped(
        argv=tuple(parsed.rest[start:]), env=env, clear_env=clear, unset=tuple(unset), cwd=cwd
    )


def _flock(options: list[tuple[str, str | None]], command: list[str]) -> Unwrapped:
    """``flock [opts] FILE CMD...``, ``flock [opts] FILE -c STRING``, ``flock [opts] FD``."""
    shell = next((v for n, v in options if n in ("-c", "--command")), None)
    if command[:1] in (["-c"], ["--command"]):
        shell = command[1] if len(command) > 1 else ""
        command = []
    elif command[:1] and command[0].startswith("--command="):
        shell, command = command[0].partition("=")[2], []
    if shell is not None:
        return Unwrapped(shell=shell)
    return Unwrapped(argv=tuple(command))


__all__ = ["GRAMMARS", "WRAPPERS", "Unwrapped", "unwrap"]
