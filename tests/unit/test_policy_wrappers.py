"""What a wrapper program runs once its own options are skipped (keel.policy.wrappers):
the command, the environment and directory it gets, or why it cannot be known."""

from __future__ import annotations

import pytest

from keel.policy.wrappers import Unwrapped, unwrap


def run(line: str) -> Unwrapped | None:
    program, *args = line.split(" ") if line else [""]
    return unwrap(program, args)


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("nice make", Unwrapped(argv=("make",))),
        ("nice -5 make", Unwrapped(argv=("make",))),
        ("nice --adjustment 5 make", Unwrapped(argv=("make",))),
        ("nohup -", Unwrapped(argv=("-",))),
        ("nohup make -j", Unwrapped(argv=("make", "-j"))),
        ("timeout 5 make", Unwrapped(argv=("make",))),
        ("timeout -s KILL 5 make", Unwrapped(argv=("make",))),
        ("timeout -vs KILL 5 make", Unwrapped(argv=("make",))),
        ("timeout --foreground --signal KILL 10 make", Unwrapped(argv=("make",))),
        ("timeout --sig=KILL 10 make", Unwrapped(argv=("make",))),
        ("timeout --kill-after 5", Unwrapped()),
        ("timeout -- 5 make", Unwrapped(argv=("make",))),
        ("setsid -cf make", Unwrapped(argv=("make",))),
        ("command make", Unwrapped(argv=("make",))),
        ("command -p make", Unwrapped(argv=("make",), default_path=True)),
        ("command -v make", Unwrapped()),
        ("stdbuf -oL make", Unwrapped(argv=("make",))),
        (
            "xargs -e -i grep x",
            Unwrapped(
                argv=("grep", "x"), opaque="xargs appends arguments read from standard input"
            ),
        ),
        (
            "xargs",
            Unwrapped(argv=("echo",), opaque="xargs appends arguments read from standard input"),
        ),
        ("exec -a name make", Unwrapped(opaque="exec -a runs the program under another name")),
        ("sudo make", Unwrapped(argv=("make",))),
        ("sudo -u bob", Unwrapped()),
        ("sudo FOO=1 make", Unwrapped(argv=("make",), env=("FOO=1",))),
        ("sudo A=1 B=2 make", Unwrapped(argv=("make",), env=("A=1", "B=2"))),
        ("sudo -u bob -D /srv make", Unwrapped(argv=("make",), cwd="/srv")),
        ("sudo --chdir=/srv make", Unwrapped(argv=("make",), cwd="/srv")),
        ("doas make", Unwrapped(argv=("make",))),
        ("doas -s", Unwrapped(opaque="doas -s runs a shell reading standard input")),
        ("env make", Unwrapped(argv=("make",))),
        ("env - make", Unwrapped(argv=("make",), clear_env=True)),
        ("env -i make", Unwrapped(argv=("make",), clear_env=True)),
        ("env --ignore-environment make", Unwrapped(argv=("make",), clear_env=True)),
        ("env -u FOO make", Unwrapped(argv=("make",), unset=("FOO",))),
        ("env --unset=FOO A=1 make", Unwrapped(argv=("make",), env=("A=1",), unset=("FOO",))),
        ("env -C sub make", Unwrapped(argv=("make",), cwd="sub")),
        ("env --chdir=sub make", Unwrapped(argv=("make",), cwd="sub")),
        ("env -S A=1_make x", Unwrapped(argv=("x",), env=("A=1_make",))),
        ("env --default-signal=INT make", Unwrapped(argv=("make",))),  # a value, not a command
        ("flock /tmp/l make", Unwrapped(argv=("make",))),
        ("flock -c make /tmp/l", Unwrapped(shell="make")),
        ("flock /tmp/l -c make", Unwrapped(shell="make")),
        ("flock /tmp/l --command make", Unwrapped(shell="make")),
        ("flock /tmp/l -c", Unwrapped(shell="")),
        ("flock /tmp/l --command=a=b", Unwrapped(shell="a=b")),
        ("ls -l", None),
    ],
)
def test_what_a_wrapper_runs(line: str, expected: Unwrapped | None) -> None:
    assert run(line) == expected


@pytest.mark.parametrize(
    ("line", "opaque"),
    [
        ("timeout --signal", "timeout: --signal needs a value"),
        ("timeout -s", "timeout: -s needs a value"),
        ("timeout --frobnicate 5 make", "timeout: unknown option '--frobnicate'"),
        ("setsid -cz make", "setsid: unknown option '-z'"),
        ("nice -q make", "nice: unknown option '-q'"),
        ("sudo -s", "sudo runs a shell reading standard input"),
        ("sudo --shell", "sudo runs a shell reading standard input"),
        ("sudo -i", "sudo runs a shell reading standard input"),
        ("sudo --login", "sudo runs a shell reading standard input"),
    ],
)
def test_what_cannot_be_known_says_why(line: str, opaque: str) -> None:
    assert run(line) == Unwrapped(opaque=opaque)


def test_env_split_strings_are_split_as_a_shell_would() -> None:
    assert unwrap("env", ["-S", "A=1 make -j", "x"]) == Unwrapped(
        argv=("make", "-j", "x"), env=("A=1",)
    )
    assert unwrap("env", ["-S", "make 'unbalanced"]) == Unwrapped(
        opaque="env -S string has unbalanced quotes"
    )
