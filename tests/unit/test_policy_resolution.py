"""A path the policy judges resolves exactly as realpath resolves it, in any tree of links.

``keel.policy.resolution`` looks only at the components inside the workspace and keeps the
workspace's own real path; what the rules and the containment layer see must still be
``realpath(join(realpath(workspace), path))`` — a link the model planted (inside, to the
outside, to ``.git``, dangling, in a loop) must lead the policy where the kernel goes.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keel.policy import resolution
from keel.policy.containment import path_spellings
from keel.policy.resolution import real_root, resolve
from keel.policy.rules import real_relative

NAMES = st.sampled_from(["a", "b", ".git", "c.txt", "..", ".", "", "missing", "x y", "é"])
# the workspace's own folder name: any file name (a name ending in X or a dot included)
FOLDERS = st.text("abcXYZ019 ._-é", min_size=1, max_size=6).filter(lambda n: n not in (".", ".."))
TARGETS = st.sampled_from(
    ["a", "b", "../outside", ".git/config", "/", "loop", "missing/deeper", "a/../b", "c.txt"]
)
# (folder or link, where): links named "l0", "l1"... inside folders a, b and the root.
ENTRIES = st.lists(
    st.tuples(st.sampled_from(["", "a", "b", "a/b"]), TARGETS), min_size=0, max_size=5
)
PATHS = st.lists(NAMES | st.sampled_from(["l0", "l1", "l2", "l3"]), min_size=1, max_size=5)


def _tree(base: Path, links: list[tuple[str, str]], folder: str = "ws") -> Path:
    workspace = base / folder
    for folder in ("a", "b", "a/b", ".git"):
        (workspace / folder).mkdir(parents=True, exist_ok=True)
    (workspace / "c.txt").write_text("x")
    (workspace / ".git" / "config").write_text("[core]\n")
    (base / "outside").mkdir(exist_ok=True)
    for number, (folder, target) in enumerate(links):
        os.symlink(target, workspace / folder / f"l{number}")
    os.symlink("loop", workspace / "loop")  # a link to itself: realpath stops, never fails
    return workspace


@settings(max_examples=400, deadline=None)
@given(links=ENTRIES, parts=PATHS, through_link=st.booleans(), folder=FOLDERS)
def test_a_path_resolves_as_realpath_resolves_it_through_any_links(
    links: list[tuple[str, str]], parts: list[str], through_link: bool, folder: str
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        workspace = _tree(base, links, folder)
        if through_link:  # the workspace itself reached through a link to it
            os.symlink(workspace, base / "via")
            workspace = base / "via"
        path = "/".join(parts)
        expected_root = os.path.realpath(workspace)
        expected = os.path.realpath(os.path.join(expected_root, path))
        assert resolve(path, workspace) == (expected_root, expected)  # the same spelling


def test_a_moved_workspace_is_resolved_again_not_from_what_was_kept(tmp_path: Path) -> None:
    first = tmp_path / "first"
    (first / "src").mkdir(parents=True)
    workspace = tmp_path / "ws"
    os.symlink(first, workspace)
    assert real_root(workspace) == str(first)
    second = tmp_path / "second"
    (second / "src").mkdir(parents=True)
    os.remove(workspace)
    os.symlink(second, workspace)  # the same name, another directory
    assert real_root(workspace) == str(second)
    assert resolve("src", workspace) == (str(second), str(second / "src"))


def test_a_link_to_git_internals_is_judged_as_the_file_it_leads_to(tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "config").write_text("[core]\n")
    (tmp_path / "docs").mkdir()
    os.symlink("../.git/config", tmp_path / "docs" / "notes.txt")
    assert path_spellings("docs/notes.txt", tmp_path) == ("docs/notes.txt", ".git/config")
    assert path_spellings("docs/new.txt", tmp_path) == ("docs/new.txt",)


def test_paths_under_the_filesystem_root_and_a_missing_workspace_resolve_as_realpath() -> None:
    assert resolve("tmp", Path("/")) == ("/", os.path.realpath("/tmp"))
    assert resolve(".", Path("/")) == ("/", "/")
    missing = Path("/nonexistent-keel-workspace/ws")
    assert resolve("a/b", missing) == (str(missing), f"{missing}/a/b")


def test_an_unchanged_workspace_is_resolved_once_and_the_kept_roots_are_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The point of keeping the root: one realpath of the workspace for many calls (each
    # call still checks it is the same directory), and never more than _MAX_ROOTS kept.
    workspace = tmp_path / "ws"
    (workspace / "src").mkdir(parents=True)
    resolved: list[str] = []
    realpath = os.path.realpath

    def counting(path: str) -> str:
        resolved.append(os.fspath(path))
        return realpath(path)

    monkeypatch.setattr(resolution.os.path, "realpath", counting)
    monkeypatch.setattr(resolution, "_roots", {})
    for _ in range(5):
        assert resolve("src/x.py", workspace) == (str(workspace), f"{workspace}/src/x.py")
    assert resolved == [str(workspace)]
    for number in range(3 * resolution._MAX_ROOTS):
        other = tmp_path / f"w{number}"
        other.mkdir()
        real_root(other)
        assert len(resolution._roots) <= resolution._MAX_ROOTS


def test_a_path_with_a_nul_or_bytes_no_utf8_holds_resolves_as_the_file_tools_spell_it(
    tmp_path: Path,
) -> None:
    # A NUL can name no file: the rules get no resolved spelling (the tools refuse the
    # path themselves). A \xHH spelling names the bytes the file tools would open.
    assert real_relative("a\x00b", tmp_path) is None
    raw = os.fsdecode(b"caf\xe9")  # a file name that is not UTF-8
    (tmp_path / raw).mkdir()
    os.symlink("..", tmp_path / raw / "up")
    assert resolve("caf\\xE9/x", tmp_path) == (str(tmp_path), f"{tmp_path}/{raw}/x")
    assert real_relative("caf\\xE9/up/.git", tmp_path) == ".git"
