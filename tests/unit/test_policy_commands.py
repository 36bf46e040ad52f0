"""Reading a run_command argv as the programs it runs: wrappers, shell strings, git, opacity.

Programs are looked up in a PATH holding only small fake executables (one folder of
real files made once for the module), so the readings are the same on any machine.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keel.policy.commands import MAX_DEPTH, CommandView, normalise_command, writes_git
from keel.policy.git_commands import PLUMBING
from keel.policy.shell_syntax import read_script

FAKE_PROGRAMS = ["git", "make", "ls", "cat", "rm", "pytest", "python3", "perl", "node", "find",
                 "sh", "bash", "dash", "env", "nice", "timeout", "xargs", "awk"]  # fmt: skip
Read = Callable[..., CommandView]


@pytest.fixture(scope="module")
def fake_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A PATH of one folder holding an executable file for each of FAKE_PROGRAMS."""
    folder = tmp_path_factory.mktemp("bin")
    for name in FAKE_PROGRAMS:
        program = folder / name
        program.write_text("#!/bin/sh\nexit 0\n")
        program.chmod(0o755)
    return str(folder)


@pytest.fixture(scope="module")
def read(fake_path: str, tmp_path_factory: pytest.TempPathFactory) -> Read:
    workspace = tmp_path_factory.mktemp("workspace")

    def read(*argv: str) -> CommandView:
        return normalise_command(list(argv), cwd=workspace, path=fake_path)

    return read


def normals(view: CommandView) -> list[str]:
    return [" ".join(form.normal) for form in view.forms]


# --- wrappers ----------------------------------------------------------------------------

WRAPPED_PUSH = [
    ("env", "git", "push"),
    ("env", "-i", "FOO=1", "git", "push"),
    ("env", "-u", "HOME", "-C", "/tmp", "git", "push"),
    ("env", "-", "git", "push"),
    ("env", "-S", "git push"),
    ("env", "--split-string=FOO=1 git", "push"),
    ("nice", "git", "push"),
    ("nice", "-n", "10", "git", "push"),
    ("nice", "-10", "git", "push"),
    ("nice", "--adjustment=3", "git", "push"),
    ("nice", "--adj", "3", "git", "push"),  # an unambiguous prefix of a long option
    ("timeout", "10", "git", "push"),
    ("timeout", "-k", "5", "--signal=KILL", "1m", "git", "push"),
    ("timeout", "--foreground", "-sTERM", "10", "git", "push"),
    ("nohup", "git", "push"),
    ("stdbuf", "-oL", "-e", "0", "git", "push"),
    ("time", "git", "push"),
    ("time", "-p", "git", "push"),
    ("time", "-f", "%e", "-o", "t.txt", "git", "push"),
    ("command", "git", "push"),
    ("command", "-p", "git", "push"),
    ("exec", "git", "push"),
    ("setsid", "-w", "git", "push"),
    ("ionice", "-c", "3", "git", "push"),
    ("ionice", "-c2", "-n7", "git", "push"),
    ("chrt", "-o", "0", "git", "push"),
    ("chrt", "--idle", "0", "git", "push"),
    ("taskset", "0x1", "git", "push"),
    ("taskset", "-c", "0-3", "git", "push"),
    ("sudo", "git", "push"),
    ("sudo", "-u", "bob", "-E", "HOME=/x", "git", "push"),
    ("sudo", "--user=bob", "--", "git", "push"),
    ("doas", "-u", "bob", "git", "push"),
    ("flock", "/tmp/lock", "git", "push"),
    ("flock", "-w", "5", "/tmp/lock", "git", "push"),
    ("flock", "-x", "/tmp/lock", "-c", "git push"),
    ("flock", "--command", "git push", "/tmp/lock"),
    ("nice", "timeout", "5", "env", "A=1", "nohup", "git", "push"),
]


@pytest.mark.parametrize("argv", WRAPPED_PUSH, ids=" ".join)
def test_wrappers_and_their_options_are_skipped(read: Read, argv: tuple[str, ...]) -> None:
    view = read(*argv)

    assert normals(view) == ["git push"]
    assert view.opaque is None
    assert tuple(argv) in view.forms[0].spellings  # the wrapper's own spelling is kept


def test_a_wrapper_that_runs_nothing_else_is_itself_a_command(read: Read) -> None:
    assert normals(read("env")) == ["env"]
    assert normals(read("command", "-v", "git")) == ["command -v git"]
    assert normals(read("timeout", "5")) == ["timeout 5"]


def test_xargs_runs_its_command_with_arguments_from_input_so_it_is_opaque(read: Read) -> None:
    view = read("xargs", "-0", "-n", "1", "git", "push")

    assert normals(view) == ["git push"]
    assert view.opaque is not None and "xargs" in view.opaque
    assert normals(read("xargs")) == ["echo"]  # xargs runs echo by default


# --- shell strings -----------------------------------------------------------------------

SHELL_STRINGS = [
    (("sh", "-c", "git push"), ["git push"]),
    (("bash", "-lc", "git push"), ["git push"]),
    (("bash", "-ec", "git push"), ["git push"]),
    (("bash", "-xc", "git push"), ["git push"]),
    (("bash", "-o", "pipefail", "-c", "git push"), ["git push"]),
    (("bash", "--norc", "-c", "--", "git push"), ["git push"]),
    (("dash", "-c", "git push"), ["git push"]),
    (("zsh", "-c", "git push"), ["git push"]),
    (("sh", "-c", "git push origin main", "name", "extra"), ["git push origin main"]),
    (("sh", "-c", "cd src && git push origin"), ["cd src", "git push origin"]),
    (("sh", "-c", "make; git push || true"), ["make", "git push", "true"]),
    (("sh", "-c", "echo x | git push & ls"), ["echo x", "git push", "ls"]),
    (("sh", "-c", "make\ngit push\n"), ["make", "git push"]),
    (("sh", "-c", "FOO=1 BAR='a b' git push"), ["git push"]),
    (("sh", "-c", "g\\it 'pu'\"sh\""), ["git push"]),
    (("sh", "-c", "git \\\n push"), ["git push"]),
    (("sh", "-c", "git push >/dev/null 2>&1 </dev/null"), ["git push"]),
    (("sh", "-c", "git push &>log"), ["git push"]),
    (("sh", "-c", "if true; then git push; fi"), ["true", "git push"]),
    (("sh", "-c", "while false; do git push; done"), ["false", "git push"]),
    (("bash", "-c", "[[ -f x && -f y ]] && git push"), ["git push"]),
    (("sh", "-c", "# a comment\ngit push # trailing"), ["git push"]),
    (("sh", "-c", "{ git push; }"), ["git push"]),
    (("sh", "-c", "! git push"), ["git push"]),
    (("sh", "-c", "sh -c 'env git push'"), ["git push"]),
    (("env", "bash", "-c", "nice git push"), ["git push"]),
    (("sh", "-c", "exec git push"), ["git push"]),
    (("sh", "-c", "time git push"), ["git push"]),
    (("sh", "-c", "command git push"), ["git push"]),
    (("sh", "-c", "echo '$(git push)'"), ["echo $(git push)"]),  # single quotes: literal
]


@pytest.mark.parametrize(("argv", "expected"), SHELL_STRINGS, ids=repr)
def test_shell_strings_are_read_as_their_simple_commands(
    read: Read, argv: tuple[str, ...], expected: list[str]
) -> None:
    view = read(*argv)

    assert normals(view) == expected
    assert view.opaque is None


def test_path_set_in_a_shell_string_is_used_to_find_later_programs(
    read: Read, tmp_path: Path
) -> None:
    view = read("sh", "-c", f"PATH={tmp_path}; git push")

    assert view.opaque is not None and "'git' is not an existing program" in view.opaque


# --- git ---------------------------------------------------------------------------------

GIT_SPELLINGS = [
    (("git", "-C", "sub", "push"), "git push"),
    (("git", "-c", "user.name=x", "commit", "-m", "m"), "git commit -m m"),
    (("git", "--git-dir=.git", "--work-tree", ".", "push"), "git push"),
    (("git", "--no-pager", "-p", "-P", "--bare", "--literal-pathspecs", "--glob-pathspecs",
      "--noglob-pathspecs", "--icase-pathspecs", "--no-optional-locks", "--no-replace-objects",
      "--no-advice", "push"), "git push"),
    (("git", "--namespace", "x", "--config-env=user.name=U", "--super-prefix=a/", "push"),
     "git push"),
    (("git", "--exec-path", "push"), "git push"),  # without a value it only prints
    (("git", "send-pack", "origin"), "git push origin"),
    (("git", "http-push", "https://h/r"), "git push https://h/r"),
    (("git", "fetch-pack", "u"), "git fetch u"),
    (("git", "commit-tree", "t"), "git commit t"),
    (("git", "update-index", "--add", "f"), "git add --add f"),
    (("git", "stage", "f"), "git add f"),
    (("git", "rev-list", "HEAD"), "git log HEAD"),
    (("git-send-pack", "origin"), "git push origin"),
    (("git-push", "origin"), "git push origin"),
    (("git",), "git"),
    (("git", "--version"), "git"),
]  # fmt: skip


@pytest.mark.parametrize(("argv", "normal"), GIT_SPELLINGS, ids=repr)
def test_git_global_options_are_dropped_and_plumbing_is_named_as_porcelain(
    read: Read, argv: tuple[str, ...], normal: str
) -> None:
    view = read(*argv)

    assert normals(view) == [normal]
    assert view.opaque is None


@pytest.mark.parametrize(("plumbing", "porcelain"), sorted(PLUMBING.items()))
def test_every_plumbing_command_in_the_table_reads_as_its_porcelain(
    read: Read, plumbing: str, porcelain: str
) -> None:
    form = read("git", "-C", ".", plumbing, "x").forms[0]

    assert form.normal == ("git", porcelain, "x")
    assert ("git", plumbing, "x") in form.spellings  # a rule may name the plumbing too
    assert ("git", "-C", ".", plumbing, "x") == form.literal


def test_commands_git_runs_itself_are_read_too(read: Read) -> None:
    assert normals(read("git", "rebase", "-x", "git push", "main")) == [
        "git rebase -x git push main",
        "git push",
    ]
    assert normals(read("git", "bisect", "run", "env", "git", "push"))[1:] == ["git push"]
    assert normals(read("git", "submodule", "foreach", "--recursive", "git push"))[1:] == [
        "git push"
    ]
    assert normals(read("git", "-c", "core.pager=git push", "log")) == ["git log", "git push"]
    assert normals(read("sh", "-c", "GIT_PAGER='env git push' git log")) == [
        "git push",
        "git log",
    ]


# --- what cannot be read -----------------------------------------------------------------

OPAQUE = [
    (("python3", "-c", "import os"), "python3 runs inline code (-c)"),
    (("python3", "-Ic", "x"), "inline code (-c)"),
    (("python3.12", "-c", "x"), "inline code (-c)"),
    (("perl", "-ne", "print"), "inline code (-e)"),
    (("perl", "-E", "say 1"), "inline code (-E)"),
    (("ruby", "-e", "1"), "inline code (-e)"),
    (("node", "-e", "1"), "inline code (-e)"),
    (("node", "--eval=1"), "inline code (--eval)"),
    (("node", "-p", "1"), "inline code (-p)"),
    (("php", "-r", "1;"), "inline code (-r)"),
    (("lua", "-e", "x"), "inline code (-e)"),
    (("Rscript", "-e", "x"), "inline code (-e)"),
    (("pwsh", "-NoProfile", "-Command", "x"), "inline code (-Command)"),
    (("python3",), "reads its program from standard input"),
    (("python3", "-u", "-"), "standard input"),
    (("sh",), "reads commands from standard input"),
    (("bash", "-s", "x"), "reads commands from standard input"),
    (("sh", "-c", "echo $(git push)"), "command substitution $(...)"),
    (("sh", "-c", "echo `git push`"), "command substitution `...`"),
    (("sh", "-c", "echo ${X:-$(git push)}"), "command substitution inside ${...}"),
    (("bash", "-c", "diff <(git show) x"), "process substitution"),
    (("sh", "-c", "(git push)"), "parentheses"),
    (("sh", "-c", "f() { git push; }; f"), "parentheses"),
    (("bash", "-c", "function f { git push; }"), "function definition"),
    (("sh", "-c", "echo $((1 + 2))"), "arithmetic"),
    (("sh", "-c", "cat <<EOF\ngit push\nEOF"), "here-document"),
    (("sh", "-c", "echo 'oops"), "unbalanced quotes"),
    (("sh", "-c", 'echo "oops'), "unbalanced quotes"),
    (("sh", "-c", "echo `oops"), "unbalanced backquote"),
    (("sh", "-c", "echo $(oops"), "unbalanced"),
    (("sh", "-c", "eval git push"), "eval runs a string"),
    (("sh", "-c", "alias g=git; g push"), "alias redefines"),
    (("sh", "-c", "trap 'git push' EXIT"), "trap runs a command string"),
    (("sh", "-c", "X=git; $X push"), "program name '$X' is computed"),
    (("bash", "-c", "$'\\x67it' push"), "is computed"),
    (("sh", "-c", "/usr/bin/gi? push"), "is computed"),
    (("sh", "-c", "~/bin/git push"), "is computed"),
    (("sh", "-c", "hash -p /usr/bin/git ls; ls push"), "hash -p"),
    (("sh", "-c", "ls && ./made-here"), "not an existing program"),
    (("sh", "-c", "cd $DIR && ./tool"), "a directory this reading cannot follow"),
    (("xargs", "git", "push"), "xargs appends arguments"),
    (("git", "-c", "alias.p=push", "p"), "git -c alias.p sets a program or alias"),
    (("git", "-c", "core.fsmonitor=./evil", "status"), "core.fsmonitor"),
    (("git", "--config-env=core.sshCommand=CMD", "push"), "core.sshcommand"),
    (("git", "frobnicate"), "git 'frobnicate' is not a git command (it may be an alias)"),
    (("git", "--exec-path=/tmp", "status"), "--exec-path"),
    (("git", "--bogus", "status"), "unknown git option '--bogus'"),
    (("git", "remote-ext", "x", "sh -c id"), "remote helper"),
    (("git", "fetch", "--upload-pack=evil", "x"), "--upload-pack names a program"),
    (("git", "clone", "-u", "evil", "x"), "names a program"),
    (("git", "grep", "-Ovim", "x"), "names a program"),
    (("git", "difftool", "-x", "evil"), "names a program"),
    (("env", "LD_PRELOAD=./x.so", "ls"), "LD_PRELOAD is set"),
    (("sh", "-c", "BASH_ENV=./x bash -c ls"), "BASH_ENV is set"),
    (("env", "--frobnicate", "git", "push"), "env: unknown option '--frobnicate'"),
    (("timeout", "-q", "5", "git", "push"), "timeout: unknown option '-q'"),
    (("exec", "-a", "git-push", "git"), "exec -a"),
    (("sudo", "-s"), "shell reading standard input"),
    (("find", ".", "-exec", "{}", ";"), "find -exec runs a program it finds"),
    (("awk", 'BEGIN { system("git push") }'), "program may run commands"),
    (("awk", '{ print | "sh" }'), "program may run commands"),
    (("env", "-S", "git 'push"), "unbalanced quotes"),
    # what an argument becomes is known only when the shell runs it
    (("sh", "-c", "F=--force; git push $F"), "the argument '$F' is expanded by the shell"),
    (("sh", "-c", 'git push origin "$b"'), "the argument '$b' is expanded"),
    (("sh", "-c", "git push ${F:-x}"), "the argument '${F:-x}' is expanded"),
    (("bash", "-c", 'git push "$@"', "sh", "--force"), "the argument '$@' is expanded"),
    (("sh", "-c", "for b in a c; do git push origin $b; done"), "the argument '$b' is expanded"),
    (("sh", "-c", "git push --for*"), "the argument '--for*' is expanded"),  # a file --force
    (("sh", "-c", "git push -?"), "the argument '-?' is expanded"),
    (("sh", "-c", "git push --[f]orce"), "the argument '--[f]orce' is expanded"),
    (("bash", "-c", "git push --{force,quiet}"), "the argument '--{force,quiet}' is expanded"),
    (("sh", "-c", "git push ~/x"), "the argument '~/x' is expanded"),
    (("sh", "-c", "nice git push $F"), "the argument '$F' is expanded"),
    (("nice",) * (MAX_DEPTH + 2) + ("ls",), f"nested more than {MAX_DEPTH} levels"),
]


@pytest.mark.parametrize(("argv", "reason"), OPAQUE, ids=lambda v: repr(v)[:60])
def test_what_cannot_be_read_is_opaque_with_a_one_line_reason(
    read: Read, argv: tuple[str, ...], reason: str
) -> None:
    view = read(*argv)

    assert view.opaque is not None
    assert reason in view.opaque
    assert "\n" not in view.opaque


NOT_OPAQUE = [
    ("python3", "x.py"),
    ("python3", "-m", "pytest", "-q"),
    ("python3", "-W", "ignore", "-X", "dev", "x.py"),
    ("python3", "--version"),
    ("perl", "-Ilib", "-w", "x.pl"),
    ("node", "--require", "ts-node/register", "x.ts"),
    ("bash", "script.sh"),
    ("sh", "-e", "script.sh", "arg"),
    ("awk", "-F,", "{print $1}", "f.csv"),
    ("awk", "-f", "prog.awk", "f"),
    ("find", ".", "-name", "*.py", "-exec", "cat", "{}", "+"),
    ("git", "status"),
    ("git", "rebase", "--exec", "make test", "main"),
    ("git", "-c", "core.pager=cat", "log"),
    ("sh", "-c", "GIT_PAGER=cat git log"),
    ("sh", "-c", "PYTHONPATH=src pytest -q"),
    ("sh", "-c", "cd sub && ls"),
    ("sh", "-c", "export PATH=$PATH; ls"),
    # nothing expands: quoted, a lone $, find's {}, a ~ inside a word, [ the test command
    ("sh", "-c", "git push '$F' \\$G '--for*' \"--{a,b}\" '~'"),
    ("sh", "-c", "echo $ a$ 'b' && find . -exec cat {} + && echo a~b && test -f x"),
    ("sh", "-c", "[ -f x ] && make"),
    ("sh", "-c", "echo it costs 5$"),  # a $ that ends the script is a $
    ("sh", "-c", "X=*.py; Y=$X make"),
]


def _id(argv: tuple[str, ...]) -> str:
    """A test id without brackets or backslashes, which a node id given to pytest by name
    (mutmut runs tests that way) cannot hold."""
    return " ".join(argv).replace("[", "(").replace("]", ")").replace("\\", "/")


@pytest.mark.parametrize("argv", NOT_OPAQUE, ids=_id)
def test_scripts_by_file_and_ordinary_commands_are_not_opaque(
    read: Read, argv: tuple[str, ...]
) -> None:
    assert read(*argv).opaque is None


def test_forms_that_could_be_read_are_kept_when_the_rest_is_opaque(read: Read) -> None:
    view = read("bash", "-c", 'git commit -m "$(date)" && git push')

    assert view.opaque is not None
    assert normals(view) == ["git commit -m $(date)", "git push", "date"]


# --- writes_git --------------------------------------------------------------------------

GIT_WRITES = [
    "commit -m x", "merge x", "rebase main", "reset --hard", "checkout x", "switch -c x",
    "tag v1", "tag -d v1", "tag -a v1 -m m", "branch x", "branch -D x", "branch -m a b",
    "branch -u origin/x", "stash", "stash push", "stash pop", "stash drop", "add .", "rm f",
    "mv a b", "restore --staged f", "restore -S f", "cherry-pick x", "revert x", "am p",
    "apply --index p", "apply --cached p", "apply -3 p", "pull", "fetch", "push", "gc", "init",
    "clone u", "config user.name x", "config --unset k", "config set k v", "update-ref r v",
    "update-index --add f", "notes add", "worktree add p", "submodule update",
    "hash-object -w f", "write-tree", "read-tree t", "prune", "repack", "replace a b",
    "filter-branch", "send-pack o", "commit-tree t", "symbolic-ref HEAD refs/heads/x",
    "reflog expire", "sparse-checkout set a", "remote add o u", "lfs push",
]  # fmt: skip
GIT_READS = [
    "status", "log", "diff", "show", "blame f", "ls-files", "ls-tree HEAD", "rev-parse HEAD",
    "cat-file -p x", "grep x", "describe", "shortlog", "branch", "branch -a", "branch --list",
    "branch -vv", "branch --show-current", "branch --contains HEAD", "tag", "tag -l",
    "tag --list v*", "tag -n", "remote", "remote -v", "remote show origin", "config --get k",
    "config --list", "config -l", "config user.name", "config get user.name", "stash list",
    "stash show", "worktree list", "apply --check p", "restore f", "diff-tree HEAD",
    "rev-list HEAD", "version", "help", "--version", "-C sub status", "symbolic-ref HEAD",
    "for-each-ref", "merge-base a b", "ls-remote origin",
]  # fmt: skip


@pytest.mark.parametrize("args", GIT_WRITES)
def test_git_subcommands_that_write_the_repository(read: Read, args: str) -> None:
    assert writes_git(read("git", *args.split())) is True


@pytest.mark.parametrize("args", GIT_READS)
def test_read_only_git_uses_do_not_write(read: Read, args: str) -> None:
    assert writes_git(read("git", *args.split())) is False


def test_writes_git_sees_through_wrappers_shells_and_partial_readings(read: Read) -> None:
    assert writes_git(read("sh", "-c", "git status && env git commit -m x")) is True
    assert writes_git(read("bash", "-c", 'git commit -m "$(date)"')) is True  # opaque, yet seen
    assert writes_git(read("sh", "-c", "git status; git log | cat")) is False
    assert writes_git(read("ls", "-la")) is False


# --- properties --------------------------------------------------------------------------

PLAIN_WRAPPERS: list[tuple[str, ...]] = [
    ("env",), ("env", "A=1"), ("env", "-u", "X"), ("nice",), ("nice", "-n", "5"),
    ("timeout", "10"), ("timeout", "-s", "KILL", "5"), ("nohup",), ("stdbuf", "-oL"),
    ("time",), ("time", "-p"), ("command",), ("setsid",), ("ionice", "-c", "3"),
    ("chrt", "-o", "0"), ("taskset", "0x1"), ("sudo", "-u", "root"), ("doas",),
    ("flock", "/tmp/lock"),
]  # fmt: skip
STRING_WRAPPERS: list[Callable[[list[str]], list[str]]] = [
    lambda argv: ["sh", "-c", shlex.join(argv)],
    lambda argv: ["bash", "-lc", shlex.join(argv)],
    lambda argv: ["env", "-S", shlex.join(argv)],
    lambda argv: ["flock", "/tmp/lock", "-c", shlex.join(argv)],
]
no_nul = st.text(st.characters(exclude_characters="\x00"), max_size=12)
inner_commands = st.tuples(
    st.sampled_from(("git", "make", "ls", "rm", "pytest")), st.lists(no_nul, max_size=4)
).map(lambda t: [t[0], *t[1]])
wrapper_chains = st.lists(
    st.one_of(
        st.sampled_from(PLAIN_WRAPPERS).map(lambda w: ("plain", w)),
        st.sampled_from(range(len(STRING_WRAPPERS))).map(lambda n: ("string", n)),
    ),
    max_size=5,
)


def wrap(argv: list[str], chain: list[tuple[str, object]]) -> list[str]:
    for kind, wrapper in chain:
        if kind == "plain":
            assert isinstance(wrapper, tuple)
            argv = [*wrapper, *argv]
        else:
            assert isinstance(wrapper, int)
            argv = STRING_WRAPPERS[wrapper](argv)
    return argv


@settings(deadline=None, max_examples=300)
@given(inner=inner_commands, chain=wrapper_chains)
def test_any_command_in_any_chain_of_wrappers_reads_as_the_command_alone(
    read: Read, inner: list[str], chain: list[tuple[str, object]]
) -> None:
    alone = read(*inner)
    wrapped = read(*wrap(inner, chain))

    assert normals(wrapped) == normals(alone)
    assert (wrapped.opaque is None) == (alone.opaque is None)


@settings(deadline=None, max_examples=400)
@given(text=st.text(max_size=80), shell=st.sampled_from(("sh", "bash", "dash")))
def test_reading_any_shell_string_never_raises(read: Read, text: str, shell: str) -> None:
    view = read(shell, "-c", text)

    for form in view.forms:
        assert form.literal in form.spellings and form.normal in form.spellings
    assert view.opaque is None or "\n" not in view.opaque
    read_script(text)


shellish = st.text(alphabet=st.sampled_from(list("ab $`'\"\\()<>|&;{}#\n=*?~-c")), max_size=40)


@settings(deadline=None, max_examples=400)
@given(text=shellish)
def test_reading_shell_punctuation_soup_never_raises(read: Read, text: str) -> None:
    read("sh", "-c", text)


ARGV_WORDS = ["git", "env", "sh", "-c", "nice", "xargs", "-n", "find", "-exec", ";", "python3",
              "timeout", "sudo", "--", "flock", "-S"]  # fmt: skip


@settings(deadline=None, max_examples=300)
@given(
    argv=st.lists(
        st.one_of(
            st.sampled_from(ARGV_WORDS),
            st.text(max_size=10),
        ),
        max_size=8,
    )
)
def test_reading_any_argv_never_raises(read: Read, argv: list[str]) -> None:
    view = read(*argv)

    assert isinstance(view, CommandView)


def test_the_default_path_is_this_processs_path(tmp_path: Path) -> None:
    view = normalise_command(["git", "push"], cwd=tmp_path)

    assert normals(view) == ["git push"]
    assert os.environ.get("PATH") is not None
