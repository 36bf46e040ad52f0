"""What a wrapper changes about the program it runs (keel.policy.commands): the PATH it
is looked up in, the directory it starts in, and whether shell builtins still exist."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from keel.policy.commands import normalise_command, writes_git

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git on PATH")


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    """A workspace with ``bin/g`` and ``sub/g``: links to git."""
    git = str(shutil.which("git"))
    for folder in ("bin", "sub"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "g").symlink_to(git)
    return tmp_path


def git_writes(argv: list[str], ws: Path) -> bool:
    return writes_git(normalise_command(argv, cwd=ws, path=str(ws / "bin")))


def test_a_program_is_looked_up_in_the_path_it_is_given(ws: Path) -> None:
    assert git_writes(["g", "commit"], ws)
    assert git_writes(["env", "-u", "HOME", "g", "commit"], ws)


@pytest.mark.parametrize(
    "wrapped", [["env", "-i"], ["env", "-u", "PATH"], ["env", "--unset=PATH"], ["command", "-p"]]
)
def test_a_cleared_path_looks_the_program_up_in_the_default_path(
    wrapped: list[str], ws: Path
) -> None:
    assert not git_writes([*wrapped, "g", "commit"], ws)


def test_a_program_run_from_another_directory_is_found_there(ws: Path) -> None:
    (ws / "bin" / "g").unlink()
    assert git_writes(["env", "-C", "sub", "./g", "commit"], ws)
    assert git_writes(["env", "--chdir=sub", "./g", "commit"], ws)
    assert git_writes(["sh", "-c", "env -C sub ./g commit"], ws)
    assert git_writes(["env", "./sub/g", "commit"], ws)
    assert not git_writes(["env", "./g", "commit"], ws)


def test_a_directory_the_reading_cannot_follow_is_said_so(ws: Path) -> None:
    for argv in (
        ["env", "-C", "-", "./g", "commit"],
        ["sh", "-c", 'cd "$D"; env -C sub ./g commit'],
        ["sh", "-c", "env -C $D ./g commit"],
    ):
        view = normalise_command(argv, cwd=ws, path=str(ws / "bin"))
        assert view.opaque is not None
        assert "'./g' is run from a directory this reading cannot follow" in view.opaque


def test_only_command_and_builtin_keep_the_shells_builtins(ws: Path) -> None:
    def opaque(argv: list[str]) -> str | None:
        return normalise_command(argv, cwd=ws, path=str(ws / "bin")).opaque

    assert "eval runs a string computed at run time" in str(opaque(["sh", "-c", "command eval x"]))
    assert "eval runs a string computed at run time" in str(opaque(["sh", "-c", "builtin eval x"]))
    assert opaque(["sh", "-c", "nice eval x"]) is None  # nice runs a program named eval
    assert opaque(["command", "eval", "x"]) is None  # no shell: no builtins


def test_a_wrapper_named_by_a_link_is_spelled_by_its_own_name_too(ws: Path) -> None:
    (ws / "bin" / "calm").symlink_to(str(shutil.which("nice")))
    [form] = normalise_command(["./bin/calm"], cwd=ws, path=str(ws / "bin")).forms
    assert ("calm",) in form.spellings and ("nice",) in form.spellings
