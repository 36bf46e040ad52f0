"""How a ``git`` command line reads to a rule: global options dropped, plumbing named as porcelain.

``read_git(args)`` takes the arguments after the ``git`` program name and returns
the subcommand as written and as the porcelain it performs, the arguments after
it, the commands git will run on the model's behalf (``bisect run``,
``rebase --exec``, ``submodule foreach`` ...), and an *opaque* reason when what
git will do cannot be known from the command line (an alias, a configuration
value that names a program, an unknown subcommand or global option).

Plumbing and synonyms, and the porcelain a rule on the plain form sees instead::

    send-pack, http-push               push
    fetch-pack, http-fetch             fetch
    commit-tree                        commit
    update-index, stage                add
    checkout-index                     checkout
    merge-recursive, merge-ours, merge-octopus, merge-resolve, merge-subtree,
    merge-index, merge-one-file, merge-file, merge-tree,
    merge-recursive-ours, merge-recursive-theirs
                                       merge
    mktag                              tag
    rev-list, whatchanged              log
    diff-files, diff-index, diff-tree  diff
    upload-archive                     archive
    init-db                            init
    annotate, pickaxe                  blame
    fsck-objects                       fsck

``git_writes(subcommand, args)`` says whether a (porcelain) subcommand may write
the repository. It is an allowlist of read-only uses; everything else is a write.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass


def names(text: str) -> frozenset[str]:
    """The whitespace-separated names in ``text``."""
    return frozenset(text.split())


PLUMBING: dict[str, str] = {
    "send-pack": "push",
    "http-push": "push",
    "fetch-pack": "fetch",
    "http-fetch": "fetch",
    "commit-tree": "commit",
    "update-index": "add",
    "stage": "add",
    "checkout-index": "checkout",
    **dict.fromkeys(
        (
            "merge-recursive",
            "merge-recursive-ours",
            "merge-recursive-theirs",
            "merge-ours",
            "merge-octopus",
            "merge-resolve",
            "merge-subtree",
            "merge-index",
            "merge-one-file",
            "merge-file",
            "merge-tree",
        ),
        "merge",
    ),
    "mktag": "tag",
    "rev-list": "log",
    "whatchanged": "log",
    "diff-files": "diff",
    "diff-index": "diff",
    "diff-tree": "diff",
    "upload-archive": "archive",
    "init-db": "init",
    "annotate": "blame",
    "pickaxe": "blame",
    "fsck-objects": "fsck",
}

# git --list-cmds=main (2.39) plus commands added since and common add-ons shipped with git.
KNOWN_COMMANDS = names(
    """
    add am annotate apply archive backfill bisect blame branch bugreport bundle cat-file
    check-attr check-ignore check-mailmap check-ref-format checkout checkout-index cherry
    cherry-pick citool clean clone column commit commit-graph commit-tree config count-objects
    credential credential-cache credential-store daemon describe diagnose diff diff-files
    diff-index diff-tree difftool fast-export fast-import fetch fetch-pack filter-branch
    fmt-merge-msg for-each-ref for-each-repo format-patch fsck fsck-objects gc
    get-tar-commit-id grep gui hash-object help hook http-backend http-fetch http-push
    imap-send index-pack init init-db instaweb interpret-trailers last-modified log ls-files
    ls-remote ls-tree mailinfo mailsplit maintenance merge merge-base merge-file merge-index
    merge-octopus merge-one-file merge-ours merge-recursive merge-recursive-ours
    merge-recursive-theirs merge-resolve merge-subtree merge-tree mergetool mktag mktree
    multi-pack-index mv name-rev notes p4 pack-objects pack-redundant pack-refs patch-id
    pickaxe prune prune-packed pull push quiltimport range-diff read-tree rebase receive-pack
    reflog refs remote remote-ext remote-fd remote-ftp remote-ftps remote-http remote-https
    repack replace replay repo request-pull rerere reset restore rev-list rev-parse revert rm
    send-email send-pack shell shortlog show show-branch show-index show-ref sparse-checkout
    stage stash status stripspace submodule subtree svn switch symbolic-ref tag unpack-file
    unpack-objects update-index update-ref update-server-info upload-archive upload-pack var
    verify-commit verify-pack verify-tag version web--browse whatchanged worktree write-tree
    """
)

# Global options before the subcommand: those taking a value (``--opt v`` or ``--opt=v``),
# and flags. ``-c``/``--config-env`` values are checked for program-running keys.
_GLOBAL_WITH_VALUE = names(
    "-C -c --git-dir --work-tree --namespace --config-env --super-prefix --attr-source --list-cmds"
)
_GLOBAL_FLAGS = names(
    "--no-pager -p --paginate -P --bare --literal-pathspecs --glob-pathspecs "
    "--noglob-pathspecs --icase-pathspecs --no-replace-objects --no-optional-locks "
    "--no-advice --no-lazy-fetch --exec-path --html-path --man-path --info-path --version -v "
    "--help -h"
)

# Configuration keys (lower-cased) whose value is a program or a command line git runs,
# or which pull in more configuration: set on the command line, they make git opaque.
_PROGRAM_KEYS = re.compile(
    r"""^(?:
        alias\..* | include\.path | includeif\..*\.path
      | core\.(?:sshcommand|pager|editor|askpass|fsmonitor|hookspath|gitproxy
               |alternaterefscommand|attributesfile)
      | diff\.external | diff\..*\.(?:textconv|command) | difftool\..*\.cmd | diff\.tool
      | merge\..*\.driver | mergetool\..*\.cmd | merge\.tool
      | filter\..*\.(?:clean|smudge|process) | credential\.(?:.*\.)?helper
      | sequence\.editor | gpg\.(?:.*\.)?program | pager\..* | protocol\..*allow
      | uploadpack\.packobjectshook | remote\..*\.(?:receivepack|uploadpack|proxy|vcs)
      | sendemail\..* | web\.browser | browser\..*\.cmd | man\..*\.cmd
      | interactive\.difffilter | init\.templatedir | hook\..* | trailer\..*\.(?:cmd|command)
      | ssh\.variant | http\.proxy.* | url\..*
    )$""",
    re.VERBOSE,
)
# Keys whose value is a command line git runs through the shell: read, not opaque.
_COMMAND_KEYS = re.compile(
    r"^(?:core\.(?:pager|editor|sshcommand|askpass)|sequence\.editor|pager\..*"
    r"|gpg\.(?:.*\.)?program|diff\.external)$"
)
# Subcommand options naming a program git runs (locally, for a local remote).
_PROGRAM_OPTIONS = names(
    "--upload-pack --receive-pack --exec --extcmd --open-files-in-pager --to-cmd --cc-cmd "
    "--header-cmd --smtp-server"
)
_REMOTE_HELPERS = names("remote-ext remote-fd remote-ftp remote-ftps remote-http remote-https")


@dataclass(frozen=True, slots=True, kw_only=True)
class GitReading:
    """One git command line as a rule reads it; see the module docstring."""

    subcommand: str | None  # as written (None: no subcommand, e.g. ``git --version``)
    porcelain: str | None  # the subcommand with plumbing and synonyms mapped
    args: tuple[str, ...]  # after the subcommand
    runs: tuple[tuple[str, ...], ...] = ()  # argv git will run (``bisect run CMD...``)
    runs_shell: tuple[str, ...] = ()  # shell strings git will run (``rebase --exec S``)
    opaque: str | None = None


def program_key(assignment: str) -> str | None:
    """The key of ``key=value`` (or ``key``) if it names a program or alias, else None."""
    key = assignment.split("=", 1)[0].strip().lower()
    return key if _PROGRAM_KEYS.match(key) else None


def read_git(args: Sequence[str]) -> GitReading:
    """Read ``git ARGS``: drop global options, map plumbing, find what git runs."""
    i, opaque, config_shell = 0, None, []
    while i < len(args) and args[i].startswith("-"):
        opt, eq, value = args[i].partition("=")
        if opt in _GLOBAL_WITH_VALUE:
            if not eq and i + 1 < len(args):
                i += 1
                value = args[i]
            key = program_key(value) if opt in ("-c", "--config-env") else None
            if key is not None and opt == "-c" and _COMMAND_KEYS.match(key):
                command = value.partition("=")[2]
                config_shell.extend([command] if command else [])
            elif key is not None:
                opaque = opaque or f"git {opt} {key} sets a program or alias git will run"
        elif opt == "--exec-path" and eq:
            opaque = opaque or "git --exec-path= changes where git finds its programs"
        elif opt not in _GLOBAL_FLAGS:
            opaque = opaque or f"unknown git option {opt!r} before the subcommand"
        i += 1
    if i >= len(args):
        return GitReading(
            subcommand=None, porcelain=None, args=(), runs_shell=tuple(config_shell), opaque=opaque
        )
    sub, rest = args[i], tuple(args[i + 1 :])
    porcelain = PLUMBING.get(sub, sub)
    if sub not in KNOWN_COMMANDS:
        opaque = opaque or f"git {sub!r} is not a git command (it may be an alias)"
    elif sub in _REMOTE_HELPERS:
        opaque = opaque or f"git {sub} is a remote helper that takes its commands from input"
    runs, runs_shell = _what_git_runs(porcelain, rest)
    return GitReading(
        subcommand=sub,
        porcelain=porcelain,
        args=rest,
        runs=runs,
        runs_shell=(*config_shell, *runs_shell),
        opaque=opaque or _program_option(porcelain, rest),
    )


def _program_option(sub: str, args: Sequence[str]) -> str | None:
    """Why ``git SUB ARGS`` is opaque because an option names a program to run, or None."""
    for n, arg in enumerate(args):
        if arg == "--":
            return None
        name = arg.split("=", 1)[0]
        if sub == "rebase" and name in ("--exec", "-x"):
            continue  # read as a shell string by _what_git_runs
        short = (sub == "grep" and arg.startswith("-O")) or (sub == "difftool" and name == "-x")
        if name in _PROGRAM_OPTIONS or short:
            return f"git {sub} {name} names a program git runs"
        cloning = sub == "clone" and name in ("-u", "-c", "--config") and n + 1 < len(args)
        if cloning and (name == "-u" or program_key(args[n + 1]) is not None):
            return f"git clone {name} {args[n + 1]!r} names a program git runs"
    return None


def _what_git_runs(
    sub: str, args: tuple[str, ...]
) -> tuple[tuple[tuple[str, ...], ...], tuple[str, ...]]:
    """The commands a subcommand runs: argv lists and shell strings."""
    runs: list[tuple[str, ...]] = []
    shell: list[str] = []
    if sub == "bisect" and args[:1] == ("run",):
        runs.append(args[1:])
    elif sub == "rebase":
        shell.extend(_option_values(args, ("-x", "--exec")))
    elif sub == "submodule" and "foreach" in args:
        command = list(args[args.index("foreach") + 1 :])
        while command and command[0].startswith("-"):
            command.pop(0)  # --recursive, --quiet
        if len(command) == 1:
            shell.append(command[0])
        elif command:
            runs.append(tuple(command))
    elif sub == "filter-branch":
        filters = tuple(a for a in args if a.startswith("--") and a.endswith("-filter"))
        shell.extend(_option_values(args, filters))
    elif sub == "for-each-repo":
        rest, skip = [], False
        for arg in args:
            if skip:
                skip = False
            elif arg.startswith("--config") or arg == "--keep-going":
                skip = arg == "--config"
            else:
                rest.append(arg)
        runs.append(("git", *rest))
    return tuple(runs), tuple(s for s in shell if s)


def _option_values(args: Sequence[str], names: tuple[str, ...]) -> list[str]:
    """The values given to options in ``names`` (``--opt v``, ``--opt=v``, ``-xv``)."""
    values = []
    for n, arg in enumerate(args):
        opt, eq, value = arg.partition("=")
        if opt in names:
            if eq:
                values.append(value)
            elif n + 1 < len(args):
                values.append(args[n + 1])
        elif "-x" in names and arg.startswith("-x") and len(arg) > 2:
            values.append(arg[2:])
    return values


# --- which uses only read the repository ------------------------------------------------

_ALWAYS_READ = names(
    """
    status log diff show blame ls-files ls-tree rev-parse cat-file grep describe shortlog
    for-each-ref show-ref show-branch name-rev merge-base count-objects check-ignore
    check-attr check-ref-format check-mailmap var version help cherry range-diff ls-remote
    verify-commit verify-tag verify-pack show-index get-tar-commit-id column stripspace
    mailinfo mailsplit patch-id fmt-merge-msg archive format-patch request-pull
    interpret-trailers bugreport diagnose
    """
)


def _positionals(args: Sequence[str], with_value: frozenset[str] = frozenset()) -> list[str]:
    """Arguments that are not options (nor the values of options in ``with_value``)."""
    out: list[str] = []
    skip = False
    for n, arg in enumerate(args):
        if skip:
            skip = False
        elif arg == "--":
            return out + list(args[n + 1 :])
        elif arg.startswith("-") and arg != "-":
            skip = arg in with_value
        else:
            out.append(arg)
    return out


def _has(args: Sequence[str], options: str) -> bool:
    """True when an argument is one of the space-separated ``options`` (``--opt=v`` and short
    clusters such as ``-vd`` count)."""
    wanted = names(options)
    for arg in args:
        if arg == "--":
            return False
        if arg.split("=", 1)[0] in wanted:
            return True
        cluster = arg.startswith("-") and not arg.startswith("--")
        if cluster and any(f"-{c}" in wanted for c in arg[1:]):
            return True
    return False


_LISTING_VALUES = names(
    "--contains --no-contains --merged --no-merged --points-at --sort --format --color --column "
    "--abbrev"
)
_LISTING = "-l --list --contains --no-contains --merged --no-merged --points-at"


def _branch_reads(args: Sequence[str]) -> bool:
    writes = (
        "-d -D --delete -m -M --move -c -C --copy -u --set-upstream-to --unset-upstream "
        "--edit-description -f --force --track -t --no-track --create-reflog"
    )
    if _has(args, writes):
        return False
    listing = f"{_LISTING} -a --all -r --remotes -v --verbose --show-current"
    return _has(args, listing) or not _positionals(args, _LISTING_VALUES)


def _tag_reads(args: Sequence[str]) -> bool:
    writes = "-d --delete -a --annotate -s --sign -u --local-user -m --message -F --file -f --force"
    if _has(args, f"{writes} -e --edit"):
        return False
    listing = f"{_LISTING} -n -v --verify"
    return _has(args, listing) or not _positionals(args, _LISTING_VALUES)


def _config_reads(args: Sequence[str]) -> bool:
    writes = "--unset --unset-all --add --replace-all --rename-section --remove-section -e --edit"
    if _has(args, writes):
        return False
    positional = _positionals(args, names("-f --file --blob --type --default --comment"))
    if positional[:1] and positional[0] in ("get", "list"):
        return True
    if positional[:1] and positional[0] in ("set", "unset", "rename-section", "remove-section"):
        return False
    if _has(
        args, "--get --get-all --get-regexp --get-urlmatch --get-color --get-colorbool -l --list"
    ):
        return True
    return len(positional) <= 1  # ``git config KEY`` reads; ``KEY VALUE`` writes


def _first_is(*reading: str, empty: bool = True) -> Callable[[Sequence[str]], bool]:
    """Reads when the first positional argument (a sub-subcommand) is one of ``reading``."""

    def reads(args: Sequence[str]) -> bool:
        positional = _positionals(args)
        return positional[0] in reading if positional else empty

    return reads


_READ_WHEN: dict[str, Callable[[Sequence[str]], bool]] = {
    "branch": _branch_reads,
    "tag": _tag_reads,
    "config": _config_reads,
    "stash": _first_is("list", "show", empty=False),
    "remote": _first_is("show", "get-url"),
    "notes": _first_is("list", "show"),
    "worktree": _first_is("list", empty=False),
    "submodule": _first_is("status", "summary"),
    "reflog": _first_is("show", "list", "exists"),
    "sparse-checkout": _first_is("list", empty=False),
    "bundle": _first_is("verify", "list-heads", "create", empty=False),
    "symbolic-ref": lambda a: not _has(a, "-d --delete") and len(_positionals(a)) <= 1,
    "hash-object": lambda a: not _has(a, "-w"),
    "apply": lambda a: not _has(a, "--index --cached -3 --3way --intent-to-add"),
    "restore": lambda a: not _has(a, "-S --staged"),
    "fsck": lambda a: not _has(a, "--lost-found"),
}


def git_writes(porcelain: str | None, args: Sequence[str]) -> bool:
    """False only for the read-only uses listed here; any other subcommand may write."""
    if porcelain is None or porcelain in _ALWAYS_READ:
        return False
    reads = _READ_WHEN.get(porcelain)
    return reads is None or not reads(args)


__all__ = [
    "KNOWN_COMMANDS",
    "PLUMBING",
    "GitReading",
    "git_writes",
    "program_key",
    "read_git",
]
