"""What a ``run_command`` argv will run, in every spelling a rule may name.

``normalise_command(argv, cwd=...)`` reads an argv the way the programs in it
will: it looks the executable up in ``PATH`` (``./x`` against the workspace)
and follows symbolic links to its real name; it skips wrapper programs and their
options (``env``, ``nice``, ``timeout``, ``nohup``, ``stdbuf``, ``time``,
``xargs``, ``command``, ``exec``, ``setsid``, ``ionice``, ``chrt``, ``taskset``,
``sudo``, ``doas``, ``flock``: see ``wrappers``); it reads the strings of
``sh -c``/``bash -lc``/``dash``/``zsh``... as the simple commands they run (see
``shell_syntax``), ``find -exec`` commands, and the commands git itself runs
(``bisect run``, ``rebase --exec``); and it reads ``git`` with its global
options dropped and its plumbing named as porcelain (see ``git_commands``),
recursively, at most ``MAX_DEPTH`` levels deep.

The result is a ``CommandView``: one ``SimpleCommand`` per program that will run,
each with its literal argv, its ``normal`` form (real program name, git global
options dropped, plumbing mapped) and all its ``spellings`` (those two, the
name as written without its directory, the git subcommand unmapped, and the
wrapper and shell invocations around it). What cannot be known from the text —
a shell string that computes something (``$(...)``, backquotes, ``<(...)``,
parentheses, here-documents, unbalanced quotes), inline code (``python -c``,
``perl -e``, ``node -e`` ...), ``eval``, a shell reading standard input,
``xargs``, a git alias or unknown git subcommand, a variable that makes a
program run hidden code (``LD_PRELOAD``, ``BASH_ENV`` ...) — sets ``opaque``
to a one-line reason; the forms that *could* be read are still listed.
Variables and git settings holding a command line (``GIT_PAGER``,
``GIT_SSH_COMMAND``, ``core.pager`` ...) are read as shell strings. Reading
never runs anything and never raises.

A name is the program it resolves to: a symbolic link named ``ls`` that points
at ``rm`` reads as ``rm`` (the name as written stays a spelling), any link to
``git`` reads as git, and ``git-push`` reads as ``git push`` when it is git's
own program of that name. Multi-call binaries (busybox) run as the name they
were called by.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from keel.policy.git_commands import KNOWN_COMMANDS, git_writes, names, read_git
from keel.policy.programs import (
    AWKS,
    INTERPRETERS,
    SHELLS,
    awk_runs,
    family,
    find_runs,
    inline_code,
    shell_call,
)
from keel.policy.shell_syntax import read_script
from keel.policy.wrappers import WRAPPERS, Unwrapped, unwrap

MAX_DEPTH = 24  # wrappers, shells and nested substitutions read before giving up (opaque)
MAX_REASONS = 3  # opaque reasons named in full; the rest are counted

Argv = tuple[str, ...]

# Shell builtins: no program is looked up for them inside a shell string.
SHELL_BUILTINS = names(
    """
    cd echo printf test [ true false : export set unset read shift return exit local declare
    typeset readonly wait pwd umask ulimit type hash jobs fg bg kill getopts let shopt break
    continue times disown suspend caller help history logout mapfile readarray dirs pushd popd
    complete compgen compopt bind source . unalias exec command builtin time eval alias trap
    enable fc
    """
)
# Builtins that run text the rule cannot see.
_OPAQUE_BUILTINS = {
    "eval": "eval runs a string computed at run time",
    "alias": "alias redefines what a command name runs",
    "trap": "trap runs a command string later",
    "enable": "enable loads or switches shell builtins",
    "fc": "fc re-runs commands from the shell's history",
}
# Multi-call binaries: the program run is the name it was called by.
MULTI_CALL = frozenset(("busybox", "toybox", "coreutils"))
# Variables that make a program run code the command line does not show.
# (Module search paths such as PYTHONPATH are left out: the program already runs the
# workspace's code when it imports it.)
_HIDDEN_CODE_ENV = names(
    "LD_PRELOAD LD_LIBRARY_PATH LD_AUDIT BASH_ENV ENV PS4 PROMPT_COMMAND SHELLOPTS BASHOPTS "
    "GIT_CONFIG_PARAMETERS GIT_CONFIG_COUNT GIT_EXEC_PATH GIT_CONFIG_GLOBAL GIT_CONFIG_SYSTEM "
    "GIT_CONFIG GIT_TEMPLATE_DIR PYTHONHOME PERL5OPT RUBYOPT NODE_OPTIONS"
)
_HIDDEN_CODE_PREFIXES = ("GIT_CONFIG_KEY_", "GIT_CONFIG_VALUE_", "BASH_FUNC_")
# Variables holding a command line a program runs (through ``sh -c``): read as shell strings.
COMMAND_ENV = names(
    "GIT_PAGER PAGER GIT_EDITOR EDITOR VISUAL GIT_SEQUENCE_EDITOR GIT_SSH_COMMAND GIT_SSH "
    "GIT_EXTERNAL_DIFF GIT_ASKPASS SSH_ASKPASS GIT_PROXY_COMMAND MANPAGER"
)


@dataclass(frozen=True, slots=True, kw_only=True)
class SimpleCommand:
    """One program a command runs.

    ``literal`` is its argv as written (wrappers around it removed); ``normal`` is
    how a rule on the plain form sees it: the real program name (symbolic links
    followed), git's global options dropped and plumbing named as porcelain.
    ``spellings`` holds every argv a rule may name for it, ``literal`` and
    ``normal`` included, with the wrapper and shell invocations around it.
    """

    literal: Argv
    normal: Argv
    spellings: tuple[Argv, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class CommandView:
    """The programs a command runs, and why more may run than these, if so."""

    forms: tuple[SimpleCommand, ...]
    opaque: str | None = None  # one line: what could not be read (then ``forms`` may be partial)


@dataclass(frozen=True, slots=True, kw_only=True)
class _Where:
    """How the next argv is run: lookup PATH, directory, what encloses it, how deep."""

    path: str
    cwd: str | None  # None once a ``cd`` went somewhere this reading cannot follow
    via: tuple[Argv, ...] = ()
    depth: int = 0
    shell_words: bool = False  # words came from a shell string: ``$``, globs are expansions
    builtins: bool = False  # the argv is run by a shell, so builtins exist
    may_be_created: bool = False  # an earlier command of the same script may create programs


def normalise_command(
    argv: Sequence[str], *, cwd: Path | str, path: str | None = None
) -> CommandView:
    """Read ``argv`` as it will run from ``cwd`` with ``PATH=path`` (default: this process's)."""
    reader = _Reader()
    where = _Where(path=os.environ.get("PATH", os.defpath) if path is None else path, cwd=str(cwd))
    reader.command(list(argv), where)
    reasons = reader.reasons[:MAX_REASONS]
    if len(reader.reasons) > MAX_REASONS:
        reasons.append(f"and {len(reader.reasons) - MAX_REASONS} more")
    return CommandView(forms=tuple(reader.forms), opaque="; ".join(reasons) or None)


def writes_git(view: CommandView) -> bool:
    """True when any form is a git command that may write the repository.

    Only the forms that could be read are judged: an opaque view may run more.
    """
    return any(
        form.normal[:1] == ("git",)
        and git_writes(form.normal[1] if len(form.normal) > 1 else None, form.normal[2:])
        for form in view.forms
    )


class _Reader:
    """Walks wrappers, shells and git, collecting forms and opaque reasons."""

    def __init__(self) -> None:
        self.forms: list[SimpleCommand] = []
        self.reasons: list[str] = []

    def flag(self, reason: str) -> None:
        reason = " ".join(reason.split())  # one line, whatever the command held
        if reason not in self.reasons:
            self.reasons.append(reason)

    def emit(
        self,
        literal: Sequence[str],
        normal: Sequence[str],
        where: _Where,
        variants: Iterable[Argv] = (),
    ) -> None:
        literal, normal = tuple(literal), tuple(normal)
        spellings = dict.fromkeys((literal, *variants, normal, *where.via))
        self.forms.append(SimpleCommand(literal=literal, normal=normal, spellings=tuple(spellings)))

    def command(self, argv: list[str], where: _Where) -> None:
        """One argv as a program (or, inside a shell, a builtin) receives it."""
        if not argv:
            return
        name = argv[0]
        if where.depth > MAX_DEPTH:
            self.flag(f"commands nested more than {MAX_DEPTH} levels deep")
            self.emit(argv, argv, where)
            return
        if where.shell_words and _computed(name):
            self.flag(f"the program name {name!r} is computed by the shell")
            self.emit(argv, argv, where)
            return
        lexical = name.rsplit("/", 1)[-1]
        if "/" in name and not name.startswith("/") and where.cwd is None:
            self.flag(f"{name!r} is run from a directory this reading cannot follow")
        builtin = where.builtins and "/" not in name and name in SHELL_BUILTINS
        located = None if builtin else _locate(name, where)
        real = _real_name(located) if located is not None else None
        if real in MULTI_CALL:
            if lexical == real and len(argv) > 1:  # ``busybox sh -c ...``: the applet follows
                self.command(argv[1:], replace(where, via=(*where.via, tuple(argv))))
                return
            real = lexical
        if located is None and not builtin and where.may_be_created:
            self.flag(f"{name!r} is not an existing program (an earlier command may create it)")
        program = real or lexical
        own: tuple[Argv, ...] = tuple(
            dict.fromkeys((tuple(argv), (lexical, *argv[1:]), (program, *argv[1:])))
        )
        inner = replace(where, via=(*where.via, *own), depth=where.depth + 1)
        if program in WRAPPERS:
            self.wrapper(program, argv, own, where, inner)
        elif where.builtins and program in _OPAQUE_BUILTINS:
            self.flag(_OPAQUE_BUILTINS[program])
            self.emit(argv, own[-1], where, own)
        elif program == "hash" and "-p" in argv:
            self.flag("hash -p binds a command name to another program")
            self.emit(argv, own[-1], where, own)
        elif program == "git" or (program == lexical and _dashed_git(lexical)):
            self.git(argv, lexical, own, where, inner)
        else:
            self.program(argv, program, own, where, inner)

    def program(
        self, argv: list[str], program: str, own: tuple[Argv, ...], where: _Where, inner: _Where
    ) -> None:
        """Shells, interpreters, awk and find; any other program is just itself."""
        kind = family(program)
        args = argv[1:]
        if kind in SHELLS:
            string, reason = shell_call(args, fish=kind == "fish")
            if reason is not None:
                self.flag(f"{program} {reason}")
            if string is not None:  # the shell is then only a spelling of what it runs
                self.script(string, inner)
                return
        self.emit(argv, own[-1], where, own)
        if kind in INTERPRETERS:
            reason = inline_code(INTERPRETERS[kind], args)
            if reason is not None:
                self.flag(f"{program} {reason}")
        elif kind in AWKS and (reason := awk_runs(args)) is not None:
            self.flag(f"{program} {reason}")
        elif kind == "find":
            for run in find_runs(args):
                if run and "{}" in run[0]:
                    self.flag("find -exec runs a program it finds at run time")
                self.command(list(run), replace(inner, builtins=False))

    def wrapper(
        self, program: str, argv: list[str], own: tuple[Argv, ...], where: _Where, inner: _Where
    ) -> None:
        unwrapped = unwrap(program, argv[1:]) or Unwrapped()
        if unwrapped.opaque is not None:
            self.flag(unwrapped.opaque)
        child = self.environment(inner, unwrapped)
        # ``command`` and ``builtin`` run builtins too; the others exec a program.
        child = replace(child, builtins=where.builtins and program in ("command", "builtin"))
        if unwrapped.shell is not None:
            self.script(unwrapped.shell, child)
        elif unwrapped.argv:
            self.command(list(unwrapped.argv), child)
        else:
            self.emit(argv, own[-1], where, own)  # runs nothing else: ``env``, ``command -v x``

    def environment(self, where: _Where, unwrapped: Unwrapped) -> _Where:
        path = where.path
        if unwrapped.clear_env or "PATH" in unwrapped.unset or unwrapped.default_path:
            path = _default_path()
        cwd = where.cwd
        if unwrapped.cwd is not None:
            cwd = _join(cwd, unwrapped.cwd, where.shell_words)
        return self.assign(replace(where, path=path, cwd=cwd), unwrapped.env)

    def assign(self, where: _Where, assignments: Iterable[str]) -> _Where:
        """``where`` after ``NAME=value`` assignments: PATH followed, hidden-code names flagged."""
        path = where.path
        for assignment in assignments:
            name, _, value = assignment.partition("=")
            if name.endswith("+"):
                name, value = name[:-1], path + value if name[:-1] == "PATH" else value
            if name == "PATH":
                value = value.replace("${PATH}", path).replace("$PATH", path)
                if where.shell_words and _computed(value):
                    self.flag("PATH is computed by the shell")
                path = value
            elif name in COMMAND_ENV and value:
                self.script(value, replace(where, depth=where.depth + 1, builtins=False))
            elif name in _HIDDEN_CODE_ENV or name.startswith(_HIDDEN_CODE_PREFIXES):
                self.flag(f"{name} is set, which can make a program run code not shown here")
        return replace(where, path=path)

    def script(self, text: str, where: _Where) -> None:
        """A shell string: its commands in order, tracking PATH and ``cd`` between them."""
        if where.depth > MAX_DEPTH:
            self.flag(f"commands nested more than {MAX_DEPTH} levels deep")
            return
        script = read_script(text)
        for reason in script.opaque:
            self.flag(f"shell string has {reason}")
        session = replace(where, shell_words=True, builtins=True)
        for n, command in enumerate(script.commands):
            session = replace(session, may_be_created=where.may_be_created or n > 0)
            run = self.assign(session, command.assignments)
            words = list(command.words)
            if not words:
                session = replace(session, path=run.path)  # a bare assignment lasts
                continue
            if words[0] in _DECLARING:
                exported = [w for w in words[1:] if "=" in w and not w.startswith("-")]
                session = replace(session, path=self.assign(session, exported).path)
            elif words[0] == "cd":
                target = next((w for w in words[1:] if not w.startswith("-")), None)
                session = replace(session, cwd=_join(session.cwd, target, True))
            elif words[0] in ("pushd", "popd"):
                session = replace(session, cwd=None)
            # ``F=--force; git push $F`` runs ``git push --force``: what an argument the
            # shell expands becomes is known only at run time, so no argv rule can be
            # judged on it (the program name is checked in ``command``)
            arguments = [words[k] for k in command.expanded if k > 0]
            if arguments and words[0] not in _DECLARING:  # their assignments: ``assign``
                self.flag(f"the argument {arguments[0]!r} is expanded by the shell at run time")
            self.command(words, run)
        nested = replace(
            where, depth=where.depth + 1, shell_words=True, builtins=True, may_be_created=True
        )
        for body in script.nested:
            self.script(body, nested)

    def git(
        self, argv: list[str], lexical: str, own: tuple[Argv, ...], where: _Where, inner: _Where
    ) -> None:
        dashed = _dashed_git(lexical)  # ``git-push x`` is ``git push x``
        reading = read_git([lexical[4:], *argv[1:]] if dashed else argv[1:])
        if reading.opaque is not None:
            self.flag(reading.opaque)
        sub = (reading.subcommand,) if reading.subcommand is not None else ()
        porcelain = (reading.porcelain,) if reading.porcelain is not None else ()
        unmapped = ("git", *sub, *reading.args)
        normal = ("git", *porcelain, *reading.args)
        self.emit(argv, normal, where, (*own, unmapped))
        inner = replace(inner, via=(*inner.via, unmapped, normal), builtins=False)
        for run in reading.runs:
            self.command(list(run), inner)
        for string in reading.runs_shell:
            self.script(string, inner)


# --- looking programs up ----------------------------------------------------------------


_DECLARING = frozenset(("export", "readonly", "declare", "typeset", "local"))


def _computed(word: str) -> bool:
    """True when a shell would expand ``word`` (variables, substitutions, globs, ``~``)."""
    if any(c in word for c in "$`*?") or word.startswith("~"):
        return True
    return ("[" in word and word != "[") or ("{" in word and "}" in word)


def _default_path() -> str:
    """The PATH ``execvp`` uses when none is set (``env -i``, ``command -p``)."""
    try:
        return os.confstr("CS_PATH") or "/bin:/usr/bin"
    except (ValueError, OSError):
        return "/bin:/usr/bin"


def _join(cwd: str | None, target: str | None, shell_words: bool) -> str | None:
    """The directory after changing to ``target``; None when it cannot be known."""
    if cwd is None or target is None or target == "-" or (shell_words and _computed(target)):
        return None
    return os.path.normpath(os.path.join(cwd, target))


def _locate(name: str, where: _Where) -> str | None:
    """The file ``name`` runs: a path as given (relative to cwd), else the first in PATH."""
    if not name or "\0" in name:
        return None
    try:
        if "/" in name:
            if not os.path.isabs(name):
                if where.cwd is None:
                    return None
                name = os.path.join(where.cwd, name)
            return name if os.path.isfile(name) else None
        for entry in where.path.split(os.pathsep):
            folder = entry or where.cwd or ""  # an empty PATH entry is the current directory
            if not os.path.isabs(folder):
                if where.cwd is None or "\0" in folder:
                    continue
                folder = os.path.join(where.cwd, folder)
            candidate = os.path.join(folder, name)
            if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
                return candidate
    except (OSError, ValueError):
        return None
    return None


def _real_name(located: str) -> str:
    """The basename of ``located`` with every symbolic link followed."""
    try:
        return os.path.basename(os.path.realpath(located))
    except (OSError, ValueError):
        return os.path.basename(located)


def _dashed_git(name: str) -> bool:
    """True for ``git-SUBCOMMAND`` names, which git itself runs as ``git SUBCOMMAND``."""
    return name.startswith("git-") and name[4:] in KNOWN_COMMANDS


__all__ = [
    "MAX_DEPTH",
    "CommandView",
    "SimpleCommand",
    "normalise_command",
    "writes_git",
]
